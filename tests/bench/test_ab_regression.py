"""A/B intervals that hold at concurrency > 1, and a regression check that compares like with like."""
import asyncio
import json
import time

import numpy as np

from bench.rawsse import Reply, completion_stream
from runbook.bench import run as bench
from runbook.endpoint.client import RequestRecord


def _rec(i, ttft_s, n=8, tpot_s=0.01):
    return RequestRecord(id=i, send_time=0.0, chunk_times=[ttft_s, ttft_s + (n - 1) * tpot_s], chunk_tokens=[1, n - 1],
                         usage={"completion_tokens": n}, count_source="usage", client_tokens=2)


def _self_comparison(rng, blocks=8, width=4):
    """One server against itself at concurrency `width`: the requests that run together share a batch
    effect (the server's state while they ran), different on each arm's turn; plus per-request noise."""
    a, b, block_of = [], [], {}
    for k in range(blocks):
        ea, eb = rng.normal(0, 0.005, size=2)
        for j in range(width):
            i = k * width + j
            block_of[i] = k
            a.append(_rec(i, 0.1 + ea + rng.normal(0, 0.001)))
            b.append(_rec(i, 0.1 + eb + rng.normal(0, 0.001)))
    return a, b, block_of


def test_self_comparison_intervals_cover_zero():
    rng = np.random.default_rng(7)
    covered_blocks = covered_requests = 0
    sims = 600
    for _ in range(sims):
        a, b, block_of = _self_comparison(rng)
        lo, hi = bench.paired(a, b, "a", "b", block_of)[0]["ttft_ms"]["ci95"]
        covered_blocks += lo <= 0 <= hi
        lo, hi = bench.paired(a, b, "a", "b")[0]["ttft_ms"]["ci95"]      # as if the requests were independent
        covered_requests += lo <= 0 <= hi
    # 95% nominal; the margin is the Monte-Carlo error of 600 simulated runs (±0.9%), not slack in the method
    assert covered_blocks / sims >= 0.935, covered_blocks / sims
    assert covered_requests / sims < 0.8                                     # what the old per-request bootstrap did




def _opts(url, compare, **kw):
    return bench.BenchOptions(url=url, compare_url=compare, concurrency=[4], requests=32, workload="code", output_len=4,
                              warmup=0, telemetry=False, **kw)


def test_ab_interleaves_blocks_and_writes_strict_json(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.02, 0.005)))
    res, findings = asyncio.run(bench.ab_compare(_opts(srv.url, srv.url), "raw", None, None, None))
    assert res["pairs"] == 32 and res["block_size"] == 4 and res["ttft_ms"]["blocks"] == 8
    assert set(res["order"][i:i + 2] for i in range(0, len(res["order"]), 2)) == {"AB", "BA"}
    lo, hi = res["tpot_ms"]["ci95"]
    assert lo is not None and hi is not None and abs(res["tpot_ms"]["mean_diff_b_minus_a"]) < 5
    json.dumps(bench.finite(res), allow_nan=False)
    assert not [f for f in findings if f.status == "fail"]


def test_ab_arm_failing_every_request_is_a_fail(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.01, 0.005)))
    res, findings = asyncio.run(bench.ab_compare(_opts(srv.url, "http://127.0.0.1:9"), "raw", None, None, None))
    f = {x.id: x for x in findings}
    assert f["bench.ab.failed.b"].status == "fail" and res["pairs"] == 0
    assert res["ttft_ms"]["ci95"] == [None, None]
    json.dumps(res, allow_nan=False)


def test_ab_with_duration_ends(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.2, 0.01)))
    o = _opts(srv.url, srv.url, duration_s=1.0)
    o.requests = 100_000
    t0 = time.perf_counter()
    res, _ = asyncio.run(bench.ab_compare(o, "raw", None, None, None))
    assert time.perf_counter() - t0 < 30 and res["pairs"] >= 8           # at least 2 blocks, then the deadline


# -- regression check ---------------------------------------------------------------------------------

def _lv(label, c, tok_s=100.0, tpot=10.0, ttft=50.0, failed=0, completed=10, out_per_req=256, in_per_req=1024):
    return {"label": label, "concurrency": c, "rate": None, "completed": completed, "failed": failed,
            "error_rate": failed / (completed + failed), "errors": {"timeout": failed} if failed else {},
            "output_tok_s": tok_s, "tpot_ms": {"p50": tpot, "p99": tpot}, "ttft_ms": {"p50": ttft, "p99": ttft},
            "output_tokens": out_per_req * completed, "input_tokens": in_per_req * completed}


RUN = {"workload": "code", "corpus_version": "v1", "input_len": 1024, "output_len": 256, "chat": False, "range_ratio": 0.0}


def test_failed_requests_are_a_regression():
    prev = dict(RUN, levels=[_lv("c8", 8)])
    cur = dict(RUN, levels=[_lv("c8", 8, completed=4, failed=6)])
    f = {x.id: x for x in bench.compare_previous(cur, prev, 10)}
    assert f["bench.regression.errors.c8"].status == "fail"
    all_failed = dict(RUN, levels=[_lv("c8", 8, completed=0, failed=10, tok_s=0.0)])
    assert {x.id for x in bench.compare_previous(all_failed, prev, 10)} >= {"bench.regression.errors.c8"}


def test_ttft_is_compared():
    prev = dict(RUN, levels=[_lv("c8", 8)])
    cur = dict(RUN, levels=[_lv("c8", 8, ttft=80.0)])
    assert {x.id for x in bench.compare_previous(cur, prev, 10)} == {"bench.regression.ttft.c8", "bench.regression.ttft_p99.c8"}


def test_other_lengths_are_not_compared():
    prev = dict(RUN, levels=[_lv("c8", 8, tok_s=100.0)])
    shorter = dict(RUN, levels=[_lv("c8", 8, tok_s=62.0, out_per_req=160)])    # the false −38%
    f = bench.compare_previous(shorter, prev, 10)
    assert [x.id for x in f] == ["bench.regression.unlike"] or {x.status for x in f} <= {"info", "skip"}
    assert not any(x.id.startswith("bench.regression.c8") for x in f)
    other_len = dict(RUN, output_len=128, levels=[_lv("c8", 8, tok_s=62.0)])
    assert bench.compare_previous(other_len, prev, 10)[0].status == "skip"
    other_wl = dict(RUN, workload="prefix", levels=[_lv("c8", 8, tok_s=62.0)])
    assert bench.compare_previous(other_wl, prev, 10)[0].status == "skip"
    no_overlap = dict(RUN, levels=[_lv("c16", 16, tok_s=62.0)])
    assert bench.compare_previous(no_overlap, prev, 10)[0].status == "skip"
