"""Metric arithmetic against a scripted SSE server with known timings (exact, via a virtual clock)."""
import asyncio
import json
import time

import pytest
from sse_server import Script, ScriptedServer, VirtualClock

from runbook.bench import metrics, sweep
from runbook.bench.ab import paired
from runbook.core.stats import bootstrap_ci
from runbook.endpoint import client as client_mod
from runbook.endpoint.client import TRANSPORTS, Client, RequestSpec

MS = 1e-3


@pytest.fixture(autouse=True, params=TRANSPORTS)
def transport(request, monkeypatch):
    """Every test here runs over both HTTP transports: the records must not depend on which."""
    monkeypatch.setattr(client_mod, "DEFAULT_TRANSPORT", request.param)
    return request.param


def send(url, clock=time.perf_counter, chat=False, n=1, max_tokens=10, timeout=30.0, tokenizer=None, conc=1):
    async def go():
        c = Client(url, "scripted", chat=chat, clock=clock, timeout_s=timeout, tokenizer=tokenizer)
        async with c.session(limit=conc) as s:
            return [await c.send(s, RequestSpec(i, "hello", max_tokens)) for i in range(n)]
    return asyncio.run(go())


@pytest.fixture
def server():
    started = []

    def make(script, clock=None):
        srv = ScriptedServer(script, clock).start()
        started.append(srv)
        return srv
    yield make
    for s in started:
        s.stop()


def test_single_token_chunks_exact(server):
    clock = VirtualClock()
    srv = server(Script(ttft_s=0.2, gap_s=0.05, tokens=10), clock)
    r = send(srv.url, clock)[0]
    assert r.ok and r.count_source == "usage" and r.chunk_tokens == [1] * 10
    assert metrics.ttft_s(r) == pytest.approx(0.200, abs=MS)
    assert metrics.e2e_s(r) == pytest.approx(0.650, abs=MS)          # trailing usage chunk at 0.90 not counted
    assert r.end_time == pytest.approx(0.900, abs=MS)
    assert metrics.tpot_s(r) == pytest.approx(0.050, abs=MS)         # (0.65 − 0.2) / (10 − 1)
    assert metrics.itl_per_token_s(r) == pytest.approx([0.05] * 9, abs=MS)
    assert sum(metrics.chunk_gaps_s(r)) == pytest.approx(metrics.e2e_s(r) - metrics.ttft_s(r), abs=1e-9)
    assert r.output_tokens == 10 and r.input_tokens == 7


def test_multi_token_chunks_give_per_token_itl(server):
    clock = VirtualClock()
    srv = server(Script(ttft_s=0.1, gap_s=0.06, tokens=12, tokens_per_chunk=3), clock)
    r = send(srv.url, clock, max_tokens=12)[0]
    assert r.chunk_tokens == [3, 3, 3, 3]
    assert metrics.chunk_gaps_s(r) == pytest.approx([0.06] * 3, abs=MS)      # inter-chunk latency
    assert metrics.itl_per_token_s(r) == pytest.approx([0.02] * 9, abs=MS)   # per token: 60 ms / 3
    assert metrics.tpot_s(r) == pytest.approx(0.18 / 11, abs=MS)             # (0.28 − 0.10) / (12 − 1)
    s = metrics.summarise([r])
    assert s["tokens_per_chunk"] == 3 and s["itl_ms"]["p50"] == pytest.approx(20, abs=1)


def test_usage_only_at_the_end_is_spread_and_reports_discrepancy(server):
    clock = VirtualClock()
    srv = server(Script(tokens=8, tokens_per_chunk=2, continuous_usage=False), clock)
    r = send(srv.url, clock, max_tokens=8)[0]
    assert r.count_source == "usage_spread" and r.chunk_tokens == [2, 2, 2, 2]
    assert r.output_tokens_client == 4 and r.output_tokens == 8      # the client's own count: 4 chunks
    s = metrics.summarise([r])
    assert s["output_tokens"] == 8 and s["output_token_discrepancy"] == 4


def test_chat_reasoning_counts_as_output(server):
    clock = VirtualClock()
    srv = server(Script(chat=True, reasoning_chunks=3, tokens=6, ttft_s=0.3, gap_s=0.1), clock)
    r = send(srv.url, clock, chat=True, max_tokens=6)[0]
    assert r.reasoning_text.split() == ["t0", "t1", "t2"] and r.text.split() == ["t3", "t4", "t5"]
    assert metrics.ttft_s(r) == pytest.approx(0.3, abs=MS)   # the first reasoning token is the first token
    s = metrics.summarise([r])
    assert s["reasoning_tokens"] == 3 and s["output_tokens"] == 6


def test_real_clock_timings_are_close(server):
    srv = server(Script(ttft_s=0.15, gap_s=0.03, tokens=6))
    r = send(srv.url)[0]
    assert 0.15 <= metrics.ttft_s(r) < 0.25
    assert 0.15 + 5 * 0.03 <= metrics.e2e_s(r) < 0.45


@pytest.mark.parametrize("fault, kind", [("http500", "http_5xx"), ("close", "stream_closed"), ("malformed", "malformed"),
                                         ("stall", "timeout")])
def test_faults_are_recorded_and_the_level_completes(server, tmp_path, fault, kind):
    srv = server(Script(fault=fault, ttft_s=0.01, gap_s=0.01))
    recs_path = tmp_path / "r.jsonl"

    async def go():
        c = Client(srv.url, "scripted", timeout_s=1.0)
        return await sweep.run_level(c, [RequestSpec(i, "x", 5) for i in range(4)], sweep.Level("c2", 2), warmup=0,
                                     flush=False, records_path=recs_path)
    lr = asyncio.run(go())
    assert len(lr.records) == 4 and all(r.error_kind == kind for r in lr.records)
    s = metrics.summarise(lr.records)
    assert s["failed"] == 4 and s["error_rate"] == 1.0 and s["errors"] == {kind: 4}
    assert len(recs_path.read_text().splitlines()) == 4   # appended as they finished


def test_refused_connection_is_connect_error():
    r = send("http://127.0.0.1:9")[0]
    assert r.error_kind == "connect" and not r.ok


def test_server_closing_pooled_connections_is_not_a_failure(server):
    srv = server(Script(ttft_s=0.01, gap_s=0.005, tokens=4, close_after=True))
    recs = send(srv.url, n=8)
    assert all(r.ok for r in recs), [r.error for r in recs]


def test_level_scrapes_metrics_and_measures_the_client(server):
    srv = server(Script(ttft_s=0.01, gap_s=0.005, tokens=5))

    async def go():
        c = Client(srv.url, "scripted")
        return await sweep.run_level(c, [RequestSpec(i, "x", 5) for i in range(6)], sweep.Level("c3", 3), warmup=1, flush=True)
    lr = asyncio.run(go())
    assert lr.server["deltas"]["demo_generation_tokens_total"] == 30   # warm-up excluded: scraped after it
    assert lr.flushed is False and lr.lag_ms["n"] > 0 and lr.cpu_share >= 0
    assert not lr.client_bound


def test_lag_monitor_sees_a_blocked_loop():
    async def go():
        with sweep.LagMonitor() as lag:
            await asyncio.sleep(0.03)
            time.sleep(0.15)             # the event loop is blocked: what a saturated client looks like
            await asyncio.sleep(0.03)
        return lag
    lag = asyncio.run(go())
    assert max(lag.samples) >= 0.1


def test_poisson_level(server):
    srv = server(Script(ttft_s=0.01, gap_s=0.002, tokens=3))

    async def go():
        c = Client(srv.url, "scripted")
        return await sweep.run_level(c, [RequestSpec(i, "x", 3) for i in range(10)], sweep.Level("r50", rate=50.0), warmup=0, flush=False)
    lr = asyncio.run(go())
    assert len(lr.records) == 10 and all(r.ok for r in lr.records)
    sends = sorted(r.send_time for r in lr.records)
    assert sends[-1] - sends[0] > 0.02   # spread out by exponential gaps, not sent at once


@pytest.mark.slow  # two real-clock arms of blocks
def test_ab_paired_difference(server):
    fast = server(Script(ttft_s=0.02, gap_s=0.005, tokens=6))
    slow = server(Script(ttft_s=0.02, gap_s=0.02, tokens=6))
    a, b = send(fast.url, n=6, max_tokens=6), send(slow.url, n=6, max_tokens=6)
    res, f = paired(a, b, fast.url, slow.url)
    assert res["pairs"] == 6 and res["output_length_mismatches"] == 0
    lo, hi = res["tpot_ms"]["ci95"]
    assert lo > 5 and res["tpot_ms"]["mean_diff_b_minus_a"] == pytest.approx(15, abs=8)
    assert any(x.id == "bench.ab.tpot_ms" and "significant" in x.detail for x in f)


def test_ab_detects_length_mismatch(server):
    a_srv = server(Script(ttft_s=0.01, gap_s=0.002, tokens=4))
    b_srv = server(Script(ttft_s=0.01, gap_s=0.002, tokens=4))
    a = send(a_srv.url, n=3, max_tokens=4)
    b = send(b_srv.url, n=3, max_tokens=4)
    b[0].usage["completion_tokens"] = 3
    res, f = paired(a, b, "a", "b")
    assert res["output_length_mismatches"] == 1 and any(x.id == "bench.ab.lengths" for x in f)
    assert json.dumps(res)


def test_stats_and_bootstrap():
    s = metrics.stats([0.001, 0.002, 0.003, 0.004])
    assert s["mean"] == pytest.approx(2.5) and s["p50"] == pytest.approx(2.5) and s["max"] == pytest.approx(4.0)
    assert s["p99"] == pytest.approx(3.97)
    mean, lo, hi = bootstrap_ci([1.0] * 20)
    assert (mean, lo, hi) == (1.0, 1.0, 1.0)
    assert metrics.stats([])["p50"] is None
