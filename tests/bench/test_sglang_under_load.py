"""SGLang under more load than its pool holds: one server for this module with a 1,024-token KV pool
(`--max-total-tokens 1024`) that admits eagerly (`--schedule-conservativeness 0.1`). Requests under ignore_eos
reserve their whole output, so SGLang queues what does not fit; requests that may stop at EOS (as real traffic
does) reserve a fraction, so SGLang admits more and retracts when their outputs grow. The benchmark reports both
from SGLang's own counters, and verify reads the retractions from the server's log."""
import asyncio

import pytest

from runbook.bench import level_findings, report, sweep, workloads
from runbook.bench import run as bench
from runbook.bench.stage import BenchStageOptions, evaluate
from runbook.demo import sglang as demo
from runbook.endpoint.client import Client
from runbook.model.tokenizer import load_tokenizer
from runbook.verify import logparse
from runbook.verify import stage as verify

pytestmark = [pytest.mark.sglang]

POOL = 1024


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    srv = demo.start(flags={"max-total-tokens": POOL, "schedule-conservativeness": 0.1},
                     log_path=tmp_path_factory.mktemp("sglang-small-pool") / "server.log")
    yield srv
    srv.stop()


def test_the_benchmark_reports_queueing(small_pool):
    """8 requests of 192 + 64 tokens under ignore_eos: 4 fit in the pool at once, the rest wait in SGLang's queue,
    and the stage reports that wait from SGLang's own queue_time histogram and its queue gauge."""
    res = evaluate(small_pool.spec, BenchStageOptions(workload="random", concurrency=[8], requests=8, input_len=192,
                                                      output_len=64, archive="", flush_cache=True))
    (s,) = res.summary["levels"]
    assert s["completed"] == 8, (s["errors"], s["implausible"])
    q = s["server_side"]["queue_ms"]
    # At most 4 run at once (asserted below), so at least 4 of the 8 waited until a running request had decoded its
    # 64 tokens: the mean queue time (exact: Δsum / Δcount) is at least half the shortest decode span this level
    # measured — a bound from the level's own figures (a fixed 100 ms was the machine's speed); 10 % for the clocks.
    (lv,) = res.levels
    shortest_ms = 1000 * min(r.chunk_times[-1] - r.chunk_times[0] for r in lv.records)
    assert q["n"] == 8 and q["mean"] >= 0.9 * shortest_ms / 2, (q, shortest_ms)
    # The queue gauge is sampled (telemetry's interval) and a short queue can fall between two samples: the
    # histogram above is the evidence; the gauge, where it caught the queue, must agree with it.
    assert s["telemetry"]["num_running_reqs"]["max"] <= POOL // (192 + 64)
    f = next(f for f in res.findings if f.id == "bench.queue.c8")
    assert "waited in the server's queue" in f.title
    row = report.queue_frame(res.summary).loc["c8"]
    assert row["queue p99 ms"] == q["p99"] and row["waiting (max)"] == s["telemetry"]["num_queue_reqs"]["max"]
    assert not s["server_side"].get("retracted_requests")     # SGLang shows the counter once it first counts


def test_retractions_reported_by_the_benchmark_and_read_by_verify_from_the_log(small_pool):
    """8 requests of 100 + up to 300 tokens that may stop at EOS: SGLang reserves a fraction of each output, admits
    more than three of them, and retracts as they grow (three alone would outgrow the pool). The level's retractions
    (SGLang's counter) are a benchmark finding, and verify reads the same events from the server's log
    ("KV cache pool is full. Retract requests. #retracted_reqs: …")."""
    tok = load_tokenizer(small_pool.model_dir)
    wl = workloads.build("random", 8, input_len=100, output_len=300, tokenizer=tok, ignore_eos=False, seed=5)

    async def go():
        return await sweep.run_level(Client(small_pool.url, demo.SERVED_NAME, tokenizer=tok), wl.requests,
                                     sweep.Level("c8", 8), warmup=0, flush=True)
    lr = asyncio.run(go())
    s = bench.level_summary(lr)
    assert s["completed"] == 8, (s["errors"], s["implausible"])
    retracted = s["server_side"].get("retracted_requests", 0)
    assert retracted >= 1, s["server_side"]
    f = {f.id: f for f in level_findings.server_findings([s])}
    assert f["bench.retracted.c8"].status == "warn" and f"retracted {retracted} running requests" in f["bench.retracted.c8"].title
    rep = verify.assess(small_pool.spec, log=small_pool.log)
    got = {x.id: x for x in rep.findings}
    assert got["verify.retraction"].status == "warn" and got["verify.pool_below_context"].status == "warn"
    events = [w["line"] for w in rep.warnings() if w["id"] == "retraction"]
    assert events and all("KV cache pool is full. Retract requests. #retracted_reqs: " in e for e in events)
    logged = sum(int(e.split("#retracted_reqs: ")[1].split(",")[0]) for e in events)
    if rep.facts.warnings["retraction"].count <= logparse.MAX_WARNING_LINES:    # every event's line is kept
        assert logged == retracted
