"""KL divergence of SGLang's FP8 KV caches (no scales) from BF16 on the real model, per depth bucket, on CPU.

One SGLang server at a time (runbook.demo.sglang, the real SmolLM2-135M-Instruct checkpoint): the BF16 reference
scores the windows (its top-k per position), then scores them again as a candidate would (the noise floor: a second
pass, and the windows --concurrency at once), then a restarted BF16 server and each FP8 server score them as
candidates. Prints one table per server: KLD, same top-1 and PPL ratio per depth bucket, and the verdict.

    PYTHONPATH=lib RUNBOOK_SERVING_PYTHON=.venv-serving/bin/python .venv/bin/python benchmarks/kld_fp8_kv.py \
        [--windows 8] [--tokens 2048] [--top-k 20] [--chunk 128] [--concurrency 4] [--model-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import pandas as pd

from runbook.accuracy import kld, report, scoring
from runbook.demo import realmodel, sglang
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer


def server(model: Path, log_dir: Path, name: str, flags: dict) -> sglang.SGLangServer:
    dep = sglang.deployment(sglang.free_port(), source=realmodel.spec_path(), model_dir=model, flags=flags)
    t = time.monotonic()
    srv = sglang.start(dep, log_path=log_dir / f"{name}.log")
    print(f"# {name}: ready in {time.monotonic() - t:.0f} s", flush=True)
    return srv


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the real model (make real-model)")
    ap.add_argument("--kv", nargs="+", default=["fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--json", type=Path, help="also write every result here")
    a = ap.parse_args()
    a.model_dir = a.model_dir or realmodel.hf_dir()
    wins = scoring.windows(load_tokenizer(a.model_dir), a.windows, a.tokens)
    logs = Path(tempfile.mkdtemp(prefix="kld-bench-"))
    results: dict[str, kld.KldResult] = {}
    ref: list[kld.Scores] = []

    def phase(name: str, flags: dict, work) -> None:
        """One server for `work`, started again (at most 3 times) when it dies under it: a busy shared host."""
        for attempt in range(3):
            try:
                with server(a.model_dir, logs, f"{name.replace(' ', '-')}-{attempt}", flags) as srv:
                    work(scoring.Request(srv.url, None, a.top_k, a.chunk))
                return
            except (scoring.ScoringError, sglang.EngineError) as e:
                print(f"# {name}: attempt {attempt + 1} failed: {e}", flush=True)

    def reference(rq: scoring.Request) -> None:
        if not ref:
            t = time.monotonic()
            ref.extend(run_sync(scoring.score_reference(rq, wins)))
            print(f"# reference pass: {time.monotonic() - t:.0f} s", flush=True)
        for name, conc in (("bf16 second pass", 1), (f"bf16 {a.concurrency} at once", a.concurrency)):
            if name not in results:
                t = time.monotonic()
                results[name] = kld.compare(ref, run_sync(scoring.score_candidate(rq, ref, conc)))
                print(f"# {name}: {time.monotonic() - t:.0f} s", flush=True)

    def candidate(name: str):
        def work(rq: scoring.Request) -> None:
            t = time.monotonic()
            results[name] = kld.compare(ref, run_sync(scoring.score_candidate(rq, ref)))
            print(f"# {name}: {time.monotonic() - t:.0f} s", flush=True)
        return work

    phase("bf16", {}, reference)
    if not ref:
        return 1
    for name, flags in [("bf16 restart", {})] + [(kv, {"kv-cache-dtype": kv}) for kv in a.kv]:
        phase(name, flags, candidate(name))
    floor = max((results[k] for k in results if k.startswith("bf16")), key=lambda r: r.overall["kld_mean"])
    pd.set_option("display.width", 200)
    for name, res in results.items():
        doc = {"candidate": res.data(), "floor": floor.data()}
        print(f"\n## {name} against the BF16 reference ({a.windows} windows × {a.tokens} tokens, top-{a.top_k} + tail)")
        print(report.kld_table(doc).to_string())
        f = kld.verdict(res, floor, name)
        print(f"verdict: {f.status}: {f.title}")
    if a.json:
        a.json.write_text(json.dumps({k: v.data() for k, v in results.items()}, indent=1))
    print(f"\n# server logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
