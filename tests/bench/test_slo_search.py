"""Issue 15 item 3: `--find-max slo` against a scripted server whose TTFT crosses the SLO at a known concurrency."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.rawsse import RawServer, Reply, completion_stream
from runbook.bench import regression, report
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.core.spec import SLO
from runbook.runner import figures, results

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SPEC = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml"

KNEE = 6            # up to KNEE requests in flight: fast; any request arriving with KNEE others in flight: slow


@pytest.fixture
def knee():
    box = {}

    def handler(body):
        others = box["srv"].in_flight            # requests in flight when this one arrives
        ttft = 0.200 if others >= KNEE else 0.005
        return Reply(completion_stream(int(body.get("max_tokens", 2)), ttft, 0.001))
    srv = RawServer(handler).start()
    box["srv"] = srv
    yield srv
    srv.stop()


@pytest.mark.slow  # real-clock levels against a scripted server
def test_search_finds_the_knee_within_one_step(knee, tmp_path):
    o = BenchSettings(url=knee.url, model="raw", concurrency=[1], workload="code", output_len=2, warmup=0,
                           telemetry=False, timeout=30.0, find_max="slo", find_max_levels=8)
    res = bench.run(o, SLO(ttft_ms_p99=100.0))
    r = res.summary["slo_search"]
    assert r["metric"] == "concurrency" and abs(r["limit"] - KNEE) <= 1
    tried = [t["concurrency"] for t in r["levels_tried"]]
    assert tried[:4] == [1, 2, 4, 8] and len(tried) <= 8          # bracket by doubling, then bisect
    assert all(t["meets_slo"] == (t["concurrency"] <= r["limit"]) for t in r["levels_tried"])
    assert r["resolved"] and r["first_miss"] == r["limit"] + 1
    assert [s["concurrency"] for s in res.summary["levels"]] == sorted(tried)   # levels sorted by load
    f = {x.id: x for x in res.findings}["bench.slo_search"]
    assert f.status == "pass" and f"{r['limit']} concurrent" in f.title
    json.dumps(res.summary, allow_nan=False)
    assert report.plot_slo_search(res.summary).axes[0].collections
    # the regression check tracks the limit
    worse = dict(res.summary, slo_search=dict(r, limit=2))
    reg = regression.compare_previous(worse, res.summary, 10.0)
    assert any(x.id == "bench.regression.slo_limit" for x in reg)
    # the run summary's figure is the search's limit, not the highest fixed level (there is none)
    results.save(tmp_path / "40_benchmark.results.json", "40_benchmark", res.findings, **res.summary)
    assert figures.figures(tmp_path, SLO(ttft_ms_p99=100.0))["max_concurrency_within_slo"] == r["limit"]


@pytest.mark.slow  # real-clock levels through the CLI, ~20 s
def test_cli_find_max_slo_with_the_spec_slos(knee, tmp_path):
    doc = yaml.safe_load(DEFAULT_SPEC.read_text())
    doc["slo"] = {"ttft_ms_p99": 100}
    spec = tmp_path / "tight.yaml"
    spec.write_text(yaml.safe_dump(doc))
    p = subprocess.run([sys.executable, "-m", "runbook", "bench", "--deployment", str(spec), "--url", knee.url, "--model", "raw",
                        "--find-max", "slo", "--concurrency", "1", "--workload", "code", "--output-len", "2", "--warmup", "0",
                        "--archive", "", "--json"], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "lib")))
    out = json.loads(p.stdout)
    r = out["slo_search"]
    assert abs(r["limit"] - KNEE) <= 1 and {"metric", "limit", "levels_tried"} <= set(r), p.stderr[-2000:]
    assert r["slo"]["ttft_ms_p99"] == 100


def test_rate_search_and_refusals(knee):
    o = BenchSettings(url=knee.url, model="raw", concurrency=[], rates=[20.0], requests=10, workload="code", output_len=2,
                           warmup=0, telemetry=False, timeout=30.0, find_max="slo", find_max_levels=3)
    res = bench.run(o, SLO(ttft_ms_p99=100.0))
    r = res.summary["slo_search"]
    assert r["metric"] == "rate" and len(r["levels_tried"]) <= 3 and r["levels_tried"][0]["rate"] == 20.0
    with pytest.raises(InputError, match="SLOs"):
        bench.run(BenchSettings(url=knee.url, find_max="slo", telemetry=False), SLO())
    with pytest.raises(InputError, match="trace"):
        bench.run(BenchSettings(url=knee.url, find_max="slo", workload="trace:synthetic"), SLO(ttft_ms_p99=1.0))


def test_the_slo_finding_names_only_the_bounds_the_spec_sets():
    """An unset SLO is not a bound: the detail never reads "≤ None ms"."""
    from runbook.bench.level_findings import slo_text
    from runbook.core.specbase import SLO

    assert slo_text(SLO(ttft_ms_p99=2000, e2e_ms_p99=30000)) == "ttft p99 ≤ 2000 ms, e2e p99 ≤ 30000 ms"
    assert slo_text(SLO(tpot_ms_p99=45.5)) == "tpot p99 ≤ 45.5 ms"
