"""A/B intervals that hold at concurrency > 1, and a regression check that compares like with like."""
import asyncio
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.rawsse import Reply, completion_stream
from runbook.bench import ab, regression
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads import BuildContext
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


def _covered_orders(diffs, interval):
    """Fraction of the 2^K equally likely block orders (each block AB or BA: the sign of its B − A
    difference) whose interval covers 0, for a server compared with itself: exact, no sampling."""
    d = np.asarray(diffs, dtype=float)
    signs = 1 - 2 * ((np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1)
    hits = 0
    for s in signs:
        _, lo, hi = interval(list(s * d))
        hits += lo is not None and lo <= 0 <= hi
    return hits / len(signs)


def _t_interval(xs):
    from scipy import stats

    a = np.asarray(xs)
    half = stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size)
    return a.mean(), a.mean() - half, a.mean() + half


@pytest.mark.slow  # a simulation per example
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 1000, allow_nan=False), min_size=6, max_size=10))
def test_self_comparison_covers_zero_in_95pct_of_orders(magnitudes):
    # the order of each block is the only chance in a self-comparison: over all of them, >= 95% cover 0
    assert _covered_orders(magnitudes, ab.sign_flip_interval) >= 0.95


def test_t_interval_fails_the_same_check():
    # the check can fail: the t interval used before covers 0 in 93% of the orders of 8 equal blocks
    assert _covered_orders([1.0] * 8, _t_interval) == pytest.approx(1 - 18 / 256)
    assert _covered_orders([1.0] * 8, ab.sign_flip_interval) == 1 - 2 / 256          # ties: only all-AB/all-BA
    assert _covered_orders([2.0 ** i for i in range(8)], ab.sign_flip_interval) == 1 - 12 / 256   # exact


def test_sampled_signs_agree_with_enumeration(monkeypatch):
    d = list(np.random.default_rng(3).normal(0, 2, size=12))
    _, lo, hi = ab.sign_flip_interval(d)
    monkeypatch.setattr(ab, "AB_EXACT_BLOCKS", 4)
    _, slo, shi = ab.sign_flip_interval(d)
    assert abs(slo - lo) < 0.1 and abs(shi - hi) < 0.1 and (slo, shi) != (lo, hi)
    assert ab.sign_flip_interval(d[:5])[1:] == (None, None)                  # 32 orders: no 95% interval


@pytest.mark.slow  # thousands of simulated runs
def test_self_comparison_intervals_cover_zero():
    # one server against itself at c4: each block's 4 requests share the server's state on that arm's
    # turn (a batch effect), plus per-request noise; 40,000 runs of 8 blocks (by design 1 − 12/256 = 95.3%)
    rng = np.random.default_rng(7)
    sims = 40_000
    batch = rng.normal(0, 5, size=(sims, 2, 8))
    noise = rng.normal(0, 1, size=(sims, 2, 8, 4)).mean(axis=3)
    diffs = (batch[:, 1] + noise[:, 1]) - (batch[:, 0] + noise[:, 0])
    covered = sum(lo <= 0 <= hi for _, lo, hi in map(ab.sign_flip_interval, diffs.tolist()))
    assert covered / sims >= 0.95, covered / sims


@pytest.mark.slow  # thousands of simulated runs, ~12 s
def test_paired_intervals_are_over_blocks_not_requests():
    rng = np.random.default_rng(7)
    covered_requests = 0
    sims = 200
    for _ in range(sims):
        a, b, block_of = _self_comparison(rng)
        res = ab.paired(a, b, "a", "b", block_of)[0]["ttft_ms"]
        means = [np.mean([(b[i].chunk_times[0] - a[i].chunk_times[0]) * 1000 for i in range(k * 4, k * 4 + 4)])
                 for k in range(8)]
        assert res["blocks"] == 8 and res["ci95"] == pytest.approx(list(ab.sign_flip_interval(means)[1:]))
        lo, hi = ab.paired(a, b, "a", "b")[0]["ttft_ms"]["ci95"]      # as if the requests were independent
        covered_requests += lo <= 0 <= hi
    assert covered_requests / sims < 0.8                                     # what the old per-request bootstrap did


def _opts(url, compare, **kw):
    return BenchSettings(url=url, compare_url=compare, concurrency=[4], requests=None if "duration" in kw else 32, workload="code",
                         output_len=4, warmup=0, telemetry=False, **kw)


@pytest.mark.slow  # real-clock A/B blocks
def test_ab_interleaves_blocks_and_writes_strict_json(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.02, 0.005)))
    res, findings = asyncio.run(ab.ab_compare(_opts(srv.url, srv.url), "raw", None, BuildContext()))
    assert res["pairs"] == 32 and res["block_size"] == 4 and res["ttft_ms"]["blocks"] == 8
    assert set(res["order"][i:i + 2] for i in range(0, len(res["order"]), 2)) == {"AB", "BA"}
    lo, hi = res["tpot_ms"]["ci95"]
    assert lo is not None and hi is not None and abs(res["tpot_ms"]["mean_diff_b_minus_a"]) < 5
    json.dumps(bench.finite(res), allow_nan=False)
    assert not [f for f in findings if f.status == "fail"]


def test_ab_arm_failing_every_request_is_a_fail(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.01, 0.005)))
    res, findings = asyncio.run(ab.ab_compare(_opts(srv.url, "http://127.0.0.1:9"), "raw", None, BuildContext()))
    f = {x.id: x for x in findings}
    assert f["bench.ab.failed.b"].status == "fail" and res["pairs"] == 0
    assert res["ttft_ms"]["ci95"] == [None, None]
    json.dumps(res, allow_nan=False)


def test_ab_with_duration_ends(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.2, 0.01)))
    o = _opts(srv.url, srv.url, duration=1.0)
    t0 = time.perf_counter()
    res, _ = asyncio.run(ab.ab_compare(o, "raw", None, BuildContext()))
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
    f = {x.id: x for x in regression.compare_previous(cur, prev, 10)}
    assert f["bench.regression.errors.c8"].status == "fail"
    all_failed = dict(RUN, levels=[_lv("c8", 8, completed=0, failed=10, tok_s=0.0)])
    assert {x.id for x in regression.compare_previous(all_failed, prev, 10)} >= {"bench.regression.errors.c8"}


def test_ttft_is_compared():
    prev = dict(RUN, levels=[_lv("c8", 8)])
    cur = dict(RUN, levels=[_lv("c8", 8, ttft=80.0)])
    assert {x.id for x in regression.compare_previous(cur, prev, 10)} == {"bench.regression.ttft.c8", "bench.regression.ttft_p99.c8"}


def test_other_lengths_are_not_compared():
    prev = dict(RUN, levels=[_lv("c8", 8, tok_s=100.0)])
    shorter = dict(RUN, levels=[_lv("c8", 8, tok_s=62.0, out_per_req=160)])    # the false −38%
    f = regression.compare_previous(shorter, prev, 10)
    assert [x.id for x in f] == ["bench.regression.unlike"] or {x.status for x in f} <= {"info", "skip"}
    assert not any(x.id.startswith("bench.regression.c8") for x in f)
    other_len = dict(RUN, output_len=128, levels=[_lv("c8", 8, tok_s=62.0)])
    assert regression.compare_previous(other_len, prev, 10)[0].status == "skip"
    other_wl = dict(RUN, workload="prefix", levels=[_lv("c8", 8, tok_s=62.0)])
    assert regression.compare_previous(other_wl, prev, 10)[0].status == "skip"
    no_overlap = dict(RUN, levels=[_lv("c16", 16, tok_s=62.0)])
    assert regression.compare_previous(no_overlap, prev, 10)[0].status == "skip"


def test_other_session_shape_or_trace_speed_is_not_compared():
    # the same lengths, another pace: think time 0 vs 5 s, or a trace at x4 vs x1, is other work
    base = dict(RUN, workload="agentic", turns=4, think_time=0.0, think_dist="fixed", tool_result_len=256)
    prev = dict(base, levels=[_lv("c8", 8, tok_s=100.0)])
    for change in ({"think_time_s": 5.0}, {"think_dist": "exp"}, {"turns": 8}, {"tool_result_len": 1024}):
        f = regression.compare_previous(dict(base, **change, levels=[_lv("c8", 8, tok_s=25.0)]), prev, 10)
        assert [(x.id, x.status) for x in f] == [("bench.regression", "skip")], change
    assert any(x.id == "bench.regression.c8" for x in regression.compare_previous(dict(base, levels=[_lv("c8", 8, tok_s=25.0)]), prev, 10))
    trace = dict(RUN, workload="trace:t.jsonl", trace_speed=1.0, levels=[_lv("c8", 8, tok_s=100.0)])
    f = regression.compare_previous(dict(trace, trace_speed=4.0, levels=[_lv("c8", 8, tok_s=25.0)]), trace, 10)
    assert f[0].status == "skip" and "trace_speed: 1.0 then, 4.0 now" in f[0].detail
