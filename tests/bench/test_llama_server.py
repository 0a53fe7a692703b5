"""The benchmark against a real inference engine: llama.cpp's llama-server on CPU, tiny random model.
A random-weight model says nothing about quality or a deployment's speed: these tests check counts,
lengths, protocol handling and the report's shape."""
import asyncio
import json
import re

import aiohttp
import pytest

from runbook.bench import run as bench
from runbook.bench import sweep, workloads
from runbook.bench.settings import BenchSettings
from runbook.core.findings import Finding, grouped
from runbook.endpoint.client import Client
from runbook.model.tokenizer import load_tokenizer


def test_fixed_lengths_and_server_counts(llama):
    tok = load_tokenizer(llama.model_dir)
    o = BenchSettings(url=llama.url, concurrency=[1, 4], requests=8, workload="code", output_len=24,
                           tokenizer=str(llama.model_dir), warmup=1)
    res = bench.run(o)
    for lv in res.levels:
        assert all(r.ok for r in lv.records), [r.error for r in lv.records if not r.ok]
        assert all(r.usage["completion_tokens"] == 24 for r in lv.records)          # ignore_eos honoured
        assert all(r.input_tokens == r.prompt_tokens_client for r in lv.records)    # same tokenizer both sides
    lv = res.summary["levels"]
    assert [x["concurrency"] for x in lv] == [1, 4] and all(x["output_tok_s"] > 0 for x in lv)
    assert lv[0]["tokens_per_chunk"] is not None and tok is not None


def test_long_context_prompts_have_exact_token_lengths(llama):
    wl = workloads.build("longctx", 3, input_len=512, output_len=4, tokenizer=load_tokenizer(llama.model_dir))
    assert all(len(r.prompt) == 512 for r in wl.requests) and wl.exact_lengths

    async def go():
        c = Client(llama.url, "tiny-llama")
        async with aiohttp.ClientSession() as s:
            return [await c.send(s, r) for r in wl.requests]
    recs = asyncio.run(go())
    assert [r.usage["prompt_tokens"] for r in recs] == [512, 512, 512]


def test_random_lengths_in_range(llama):
    tok = load_tokenizer(llama.model_dir)
    wl = workloads.build("random", 20, input_len=100, output_len=4, tokenizer=tok, range_ratio=0.5, seed=3)
    lens = [len(r.prompt) for r in wl.requests]
    assert min(lens) >= 50 and max(lens) <= 150 and len(set(lens)) > 5


def test_metrics_scrape_and_connection_close(llama):
    reqs = workloads.build("code", 12, output_len=8).requests

    async def go():
        return await sweep.run_level(Client(llama.url, "tiny-llama"), reqs, sweep.Level("c1", 1), warmup=0, flush=True)
    lr = asyncio.run(go())
    # llama-server closes the connection after each stream: sequential pooled requests must all succeed.
    assert all(r.ok for r in lr.records), [r.error for r in lr.records if not r.ok]
    assert lr.flushed is False   # llama-server has no /flush_cache
    predicted = [v for k, v in lr.server["deltas"].items() if "tokens_predicted_total" in k]
    assert predicted and predicted[0] == 12 * 8


def test_cli_bench_json_fixed_keys(llama, cli, tmp_path):
    cp = cli("bench", "--url", llama.url, "--concurrency", "1,2", "--requests", "4", "--output-len", "8",
             "--workload", "prefix", "--input-len", "128", "--tokenizer", llama.model_dir, "--out", tmp_path, "--json",
             "--archive", "")
    j = json.loads(cp.stdout)
    assert cp.returncode == (1 if any(f["status"] == "fail" for f in j["findings"]) else 0), cp.stderr
    assert not any(f["id"].startswith("bench.regression") for f in j["findings"])   # --archive '' skips the comparison
    assert j["corpus_version"] and j["cache_flush"] is False
    for lv in j["levels"]:
        for k in ("concurrency", "completed", "failed", "output_tok_s", "client_bound"):
            assert k in lv
        for k in ("ttft_ms", "tpot_ms", "itl_ms"):
            assert lv[k]["p50"] is not None and lv[k]["p99"] is not None
    assert [lv["concurrency"] for lv in j["levels"]] == [1, 2] and all(lv["completed"] == 4 for lv in j["levels"])
    c = j["client"]   # the load generator: one process here; its ceiling is chunks per CPU second of this run
    assert c["workers"] == 1 and c["loop"] == "uvloop"    # requirements.txt has uvloop; bench runs its levels on it
    assert c["transport"] == "h1"                         # the default streamed-request client (endpoint/h1.py)
    assert c["chunks"] == sum(lv["chunks"] for lv in j["levels"]) >= 8 * 4 * 2 // 2
    assert c["chunks_per_s_ceiling"] == round(c["chunks"] / sum(lv["client_cpu_s"] for lv in j["levels"]))
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 8
    assert json.loads((tmp_path / "summary.json").read_text())["workload"] == "prefix"


@pytest.mark.notebook
def test_runner_archives_the_benchmark(llama, cli, tmp_path):
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--only", "benchmark", "--param", f"url={llama.url}", "--param", "concurrency=1,2",
             "--param", "requests=4", "--param", "output_len=8", "--param", f"tokenizer={llama.model_dir}")
    fails = json.loads(((out / "latest") / "summary.json").read_text())["findings"]["fail"]
    assert cp.returncode == (1 if fails else 0), cp.stderr
    run_dir = (out / "latest").resolve()
    res = json.loads((run_dir / "40_benchmark.results.json").read_text())
    assert [lv["concurrency"] for lv in res["data"]["levels"]] == [1, 2]
    assert len((run_dir / "40_benchmark-raw" / "records.jsonl").read_text().splitlines()) == 8
    html = (run_dir / "40_benchmark.html").read_text()
    assert html.count("<img") >= 3   # throughput, latency percentiles, CDF
    # a second run compares with the first
    cli("run", "--out", out, "--only", "benchmark", "--param", f"url={llama.url}", "--param", "concurrency=1,2",
        "--param", "requests=4", "--param", "output_len=8")
    res2 = json.loads(((out / "latest").resolve() / "40_benchmark.results.json").read_text())
    reg = [f for f in res2["findings"] if f["id"].startswith("bench.regression")]
    assert reg and all(f["status"] in ("pass", "warn") for f in reg), reg   # compared, same corpus and workload
    # the verdict folds per-level findings into one row per kind: no level's own id is shown beside its kind's row
    # (without a tokenizer llama-server's late usage makes every level's token count approximate: one row, not two)
    html2 = ((out / "latest").resolve() / "40_benchmark.html").read_text()
    verdict = html2.split('id="Levels"')[0]
    shown = grouped([Finding.from_dict(f) for f in res2["findings"]])
    folded = [g for g in shown if " (" in g.id]
    assert folded and len(shown) < len(res2["findings"]), res2["findings"]
    for g in folded:
        family = g.id.split(" (")[0]
        assert verdict.count(f"{family} (") == 1 and not re.search(re.escape(family) + r"\.c\d", verdict), g


@pytest.mark.notebook
def test_runner_agentic_sessions_on_llama_server(llama, cli, tmp_path):
    # a real session run through the notebook's parameters: each turn re-sends the whole conversation
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--only", "benchmark", "--param", f"url={llama.url}", "--param", "workload=agentic",
             "--param", "concurrency=2", "--param", "turns=3", "--param", "input_len=96", "--param", "output_len=6",
             "--param", "tool_result_len=24", "--param", "think_time=0.05", "--param", "think_dist=exp",
             "--param", "requests=12", "--param", f"tokenizer={llama.model_dir}")
    run_dir = (out / "latest").resolve()
    res = json.loads((run_dir / "40_benchmark.results.json").read_text())
    fails = [f for f in res["findings"] if f["status"] == "fail"]
    assert cp.returncode == (1 if fails else 0), cp.stderr
    d = res["data"]
    assert d["workload"] == "agentic" and d["turns"] == 3 and d["think_dist"] == "exp" and d["tool_result_len"] == 24
    (lv,) = d["levels"]
    assert lv["completed"] + lv["failed"] == 12 and lv["completed"] >= 6
    # the random-weight model sometimes generates only tokens that detokenize to nothing: the server counts
    # them, the stream has no text, so there is no TTFT — a failure of its own kind, never silently ok
    recs = [json.loads(x) for x in (run_dir / "40_benchmark-raw" / "records.jsonl").read_text().splitlines()]
    for r in recs:
        assert r["error_kind"] in (None, "no_output"), r
        assert r["error_kind"] is None or "counted 6 output tokens but streamed no text" in r["error"]
    assert {(r["meta"]["session"], r["meta"]["turn"]) for r in recs} == {(s, t) for s in range(4) for t in (1, 2, 3)}
    turns = lv["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and all(t["ttft_ms"]["p50"] > 0 for t in turns)
    grow = [t["input_tokens"]["mean"] for t in turns]
    assert grow[0] < grow[1] < grow[2]                          # history + the answer + a 24-token tool result
    assert grow[1] - grow[0] >= 24 + 6
    assert "<img" in (run_dir / "40_benchmark.html").read_text()


@pytest.mark.llama
def test_llama_server_outlives_no_killed_parent():
    """The process that started llama-server is SIGKILLed (a test run killed): the kernel kills the server too (a
    killed run once left llama-server and smg behind; both now start through oscalls.SessionChild)."""
    from conftest import left_after_parent_killed

    from runbook.core import oscalls

    code = ("from runbook.demo import llama as demo; s = demo.start_llama_server(demo.llama_server_path(), parallel=1); "
            "print(s.proc.pid, flush=True); import time; time.sleep(600)")
    before, left = left_after_parent_killed(code, lambda pid: [pid] if oscalls.pid_running(pid) else [], 30)
    assert before and not left
