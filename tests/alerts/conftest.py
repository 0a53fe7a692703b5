"""A finished run on disk, as the runner leaves it: summary.json plus each notebook's results file."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

SECRET = "tok-5ecret-Planted-9f2c"     # planted: must appear in no metric, label or rule output


def finding(fid: str, status: str, title: str = "t") -> dict:
    return {"id": fid, "status": status, "title": title, "detail": "", "evidence": "", "remedy": ""}


RESULTS = {
    "20_kv_memory": ([finding("kv.pool", "pass")], {"max_total_num_tokens": 1_000_000}),
    "35_verify": ([finding("verify.kv_dtype", "fail"), finding("verify.context_len", "pass"), finding("verify.tokens", "warn"),
                   finding("verify.server", "info")],
                  {"predicted": {"max_total_num_tokens": 1_000_000, "kv_dtype": "fp8_e4m3"},
                   "observed": {"max_total_num_tokens": 950_000, "kv_dtype": "bfloat16"}, "server": {}}),
    "40_benchmark": ([finding("bench.regression.c8", "warn"), finding("bench.errors.c8", "pass")],
                     {"levels": [{"label": "c1", "output_tok_s": 50.0, "ttft_ms": {"p50": 120.0, "p99": 300.0},
                                  "tpot_ms": {"p50": 20.0, "p99": 25.0}},
                                 {"label": "c8", "output_tok_s": 300.0, "ttft_ms": {"p50": 200.0, "p99": 800.0},
                                  "tpot_ms": {"p50": 26.0, "p99": 40.0}}]}),
    "50_accuracy": ([finding("accuracy.toolcall.parsed", "fail"), finding("accuracy.recall", "pass"),
                     finding("accuracy.identity", "skip")], {}),
}


def write_run(out: Path, run_id: str = "20260105T020000Z-d1", results=RESULTS, started: str = "2026-01-05T02:00:00+00:00",
              metrics: dict | None = None, **summary) -> Path:
    d = out / run_id
    d.mkdir(parents=True)
    nbs = []
    for stem, (found, data) in results.items():
        (d / f"{stem}.results.json").write_text(json.dumps({"schema": "runbook.results/1", "notebook": stem, "findings": found,
                                                             "data": data}))
        nbs.append({"name": stem, "status": "ok", "duration_s": 1.5, "results": f"{stem}.results.json"})
    doc = {"run_id": run_id, "deployment": "d1", "host": "gpu1", "started": started, "duration_s": 60.0, "exit_code": 1,
           "notebooks": nbs, "metrics": metrics if metrics is not None else
           {"kv_tokens_planned": 1_000_000, "output_tok_s": {"c1": 50.0, "c8": 300.0}, "max_concurrency_within_slo": 8,
            "recall": 0.9}}
    doc.update(summary)
    (d / "summary.json").write_text(json.dumps(doc))
    return d


def promtool(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if not exe:
        pytest.skip("promtool not installed: .ci/run installs Debian's prometheus package")
    return subprocess.run([exe, *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60)
