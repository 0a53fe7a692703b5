"""Through a gateway, without one running: which URLs the benchmark reads per replica, each replica's share from its
own counters (SGLang 0.5.23's exposition, parsed by prometheus_client), the policy comparison's figure and finding,
and the failed-replica accounting's phases. The live runs are tests/topology/test_gateway_bench.py."""
import pytest
from aiohttp import web
from conftest import spec_data
from sse_server import ThreadedApp

from bench.rawsse import Reply, completion_stream
from runbook.bench import failover, policies, replicas
from runbook.bench import run as bench_run
from runbook.bench.settings import BenchSettings
from runbook.bench.sweep import parse_prometheus
from runbook.core.errors import InputError
from runbook.core.ports import free_port
from runbook.core.spec import Deployment
from runbook.endpoint.records import RequestRecord

LABELS = 'engine_type="unified",model_name="tiny"'


def _metrics(requests: float, prompt: float, gen: float, cached: float) -> dict[str, float]:
    """One replica's counters as SGLang 0.5.23 writes them (streaming and not; cached tokens per cache source)."""
    half = {"true": 0.75, "false": 0.25}
    lines = []
    for name, v in (("num_requests", requests), ("prompt_tokens", prompt), ("generation_tokens", gen)):
        lines.append(f"# TYPE sglang:{name} counter")
        lines += [f'sglang:{name}_total{{{LABELS},is_streaming="{s}"}} {v * f}' for s, f in half.items()]
    lines += ["# TYPE sglang:cached_tokens counter", f'sglang:cached_tokens_total{{cache_source="device",{LABELS}}} {cached}']
    return parse_prometheus("\n".join(lines) + "\n")


def test_a_replica_without_a_cache_hit_yet_cached_nothing():
    """SGLang writes cached_tokens_total's series at the first cache hit: one that counts requests and has none cached
    0 tokens (the live fleet's replica that served only first turns); a server without request counters says nothing."""
    bare = _metrics(10, 1000, 100, 0)
    bare = {k: v for k, v in bare.items() if "cached_tokens" not in k}
    grown = _metrics(12, 1200, 120, 0)
    grown = {k: v for k, v in grown.items() if "cached_tokens" not in k}
    (a,) = replicas.rows({"a": "http://a"}, replicas.deltas({"a": bare}, {"a": grown}))
    assert (a["requests"], a["cached_tokens"]) == (2, 0)
    assert "cached_tokens" not in replicas.deltas({"a": {"x": 1.0}}, {"a": {"x": 2.0}})["a"]["counters"]


def _topology_spec(gateway: bool = True) -> Deployment:
    topo = {"replicas": [{"name": "a", "host": "10.0.0.1", "port": 30000, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
                         {"name": "b", "host": "10.0.0.2", "port": 30000, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]}]}
    if gateway:
        topo["gateway"] = {"python": "/opt/smg/bin/python", "host": "10.0.0.9", "port": 8000}
    return Deployment.model_validate(spec_data(topology=topo))


def test_the_gateway_is_benchmarked_and_every_replica_read():
    o = BenchSettings.resolve(_topology_spec())
    assert o.url == "http://10.0.0.9:8000"
    assert o.replicas == {"a": "http://10.0.0.1:30000", "b": "http://10.0.0.2:30000"}


def test_a_replica_benchmarked_directly_reads_no_share():
    spec = _topology_spec()
    assert BenchSettings.resolve(spec, url="http://10.0.0.2:30000/").replicas == {}
    # any other URL stands in front of the spec's replicas (a gateway the spec does not declare)
    assert set(BenchSettings.resolve(_topology_spec(gateway=False), url="http://lb:80").replicas) == {"a", "b"}
    assert BenchSettings.resolve(Deployment.model_validate(spec_data())).replicas == {}


def test_shares_from_each_replicas_own_counters():
    before = {"a": _metrics(10, 1000, 100, 0), "b": _metrics(4, 400, 40, 0)}
    after = {"a": _metrics(16, 1600, 160, 300), "b": _metrics(6, 600, 80, 100)}
    rows = replicas.rows({"a": "http://a", "b": "http://b"}, replicas.deltas(before, after))
    a, b = rows
    assert (a["requests"], a["prompt_tokens"], a["generation_tokens"], a["cached_tokens"]) == (6, 600, 60, 300)
    assert (b["requests"], b["generation_tokens"]) == (2, 40)
    assert a["request_share"] == pytest.approx(0.75) and b["request_share"] == pytest.approx(0.25)
    assert a["token_share"] == pytest.approx(0.6) and b["token_share"] == pytest.approx(0.4)
    side = replicas.beside({"replicas": rows, "completed": 7, "failed": 1, "output_tokens": 100})
    assert side == {"replica_requests": 8, "replica_generation_tokens": 100, "client_requests": 8, "client_completed": 7,
                    "client_output_tokens": 100, "replicas_scraped": 2, "replicas": 2}


def test_a_replica_that_stopped_answering_is_not_scraped_and_takes_no_share():
    before = {"a": _metrics(10, 1000, 100, 0), "b": _metrics(4, 400, 40, 0)}
    after = {"a": _metrics(13, 1300, 130, 0), "b": None}
    a, b = replicas.rows({"a": "http://a", "b": "http://b"}, replicas.deltas(before, after))
    assert b["scraped"] is False and b["requests"] is None and b["request_share"] is None
    assert a["request_share"] == 1.0
    # nothing counted anywhere: no share rather than a division by zero
    idle = replicas.rows({"a": "http://a"}, replicas.deltas({"a": _metrics(1, 1, 1, 0)}, {"a": _metrics(1, 1, 1, 0)}))
    assert idle[0]["requests"] == 0 and idle[0]["request_share"] is None


def _turn(t: int, hit: float | None, mean_in: float, n: int) -> dict:
    return {"turn": t, "cache_hit_rate": hit, "input_tokens": {"mean": mean_in, "n": n}}


def test_later_turns_hit_weights_by_prompt_tokens_and_leaves_out_turn_one():
    turns = [_turn(1, 0.9, 300, 4), _turn(2, 0.4, 700, 4), _turn(3, 0.7, 1100, 2), _turn(4, None, 1500, 2)]
    assert policies.later_turns_hit(turns) == pytest.approx((0.4 * 2800 + 0.7 * 2200) / 5000)
    assert policies.later_turns_hit([_turn(1, 0.9, 300, 4)]) is None


def _row(policy: str, hit: float | None) -> dict:
    return {"policy": policy, "later_turns_hit_rate": hit, "levels": []}


def test_policy_finding_names_the_winner_and_warns_when_cache_aware_loses():
    f = policies.finding([_row("cache_aware", 0.56), _row("round_robin", 0.38)])
    assert (f.id, f.status) == ("bench.gateway.policy", "pass") and "56.0%" in f.evidence and "38.0%" in f.evidence
    f = policies.finding([_row("cache_aware", 0.30), _row("round_robin", 0.38)])
    assert f.status == "warn" and f.title.startswith("round_robin")
    f = policies.finding([_row("random", 0.1), _row("round_robin", 0.38)])
    assert f.status == "info"
    f = policies.finding([_row("cache_aware", None), _row("round_robin", None)])
    assert f.status == "skip" and "--enable-cache-report" in f.remedy


def test_policy_comparison_refuses_what_it_cannot_compare():
    o = BenchSettings.resolve(_topology_spec(), workload="agentic")
    never = lambda p: pytest.fail("relaunched")  # noqa: E731
    with pytest.raises(InputError, match="two or more different"):
        policies.compare_policies(["cache_aware", "cache_aware"], never, o)
    with pytest.raises(InputError, match=r"workload agentic"):
        policies.compare_policies(["cache_aware", "round_robin"], never, BenchSettings.resolve(_topology_spec(), workload="random"))


def _rec(i: int, sent: float, ended: float | None, error_kind: str | None = None, status: int | None = 200) -> RequestRecord:
    r = RequestRecord(id=i, send_time=sent, end_time=ended, status=status, error_kind=error_kind,
                      error=None if error_kind is None else "connection reset")
    if error_kind is None:
        r.chunk_times = [sent + 0.1, ended or sent + 0.2]
    return r


def test_failover_accounting_sorts_every_request_by_the_stop():
    recs = [_rec(0, 0.0, 1.0), _rec(1, 1.5, 2.5, "stream_closed"), _rec(2, 1.8, 3.0), _rec(3, 2.2, 2.3, "http_5xx", 502),
            _rec(4, 2.4, 4.0)]
    acc = failover.account(recs, stopped_at=2.0)
    assert [r["phase"] for r in acc["requests"]] == ["before", "in_flight", "in_flight", "after", "after"]
    ph = acc["phases"]
    assert (ph["before"]["requests"], ph["in_flight"]["requests"], ph["after"]["requests"]) == (1, 2, 2)
    assert ph["in_flight"]["errors"] == {"stream_closed": 1} and ph["after"]["errors"] == {"http_5xx": 1}
    assert [(f["id"], f["status"], f["error_kind"]) for f in acc["failed"]] == [(1, 200, "stream_closed"), (3, 502, "http_5xx")]
    assert acc["failed"][0]["sent_s"] == pytest.approx(-0.5) and acc["failed"][1]["ended_s"] == pytest.approx(0.3)
    assert ph["after"]["e2e_ms"]["n"] == 1


class _Replica(ThreadedApp):
    """A replica's /metrics alone: SGLang's counters, three more requests (and 30 generated tokens) at every scrape."""

    def __init__(self) -> None:
        self.scrapes = 0

    def routes(self, app: web.Application) -> None:
        async def metrics(request: web.Request) -> web.Response:
            self.scrapes += 1
            n = 3 * self.scrapes
            return web.Response(text="\n".join(f"# TYPE sglang:{k} counter\nsglang:{k}_total{{{LABELS}}} {v}" for k, v in (
                ("num_requests", n), ("prompt_tokens", 10 * n), ("generation_tokens", 10 * n))) + "\n")
        app.router.add_get("/metrics", metrics)


@pytest.mark.parametrize("procs", [1, pytest.param(2, marks=pytest.mark.slow)])   # 2: worker processes
def test_each_level_reads_every_replica_and_a_dead_one_does_not_break_it(raw, procs):
    rep = _Replica().start()
    try:
        front = raw(lambda b: Reply(completion_stream(int(b.get("max_tokens", 2)), 0.0, 0.0)))
        dead = f"http://127.0.0.1:{free_port()}"                   # nothing listens there
        o = BenchSettings(url=front.url, model="raw", concurrency=[2], requests=4, output_len=3, workload="random",
                          input_len=8, warmup=0, telemetry=False, timeout=30.0, workers=procs,
                          replicas={"live": rep.url, "gone": dead})
        res = bench_run.run(o)
    finally:
        rep.stop()
    lv = res.summary["levels"][0]
    assert lv["completed"] == 4 and res.summary["replicas"] == {"live": rep.url, "gone": dead}
    live, gone = lv["replicas"]
    assert (live["name"], live["scraped"], live["requests"], live["generation_tokens"]) == ("live", True, 3, 30)
    assert live["request_share"] == 1.0 and rep.scrapes == 2              # once before the level, once after
    assert (gone["scraped"], gone["requests"], gone["request_share"]) == (False, None, None)


def test_token_id_prompts_through_a_gateway_are_refused_before_any_is_sent(raw):
    # smg 1.13.0 answers every completions request whose prompt is token ids with HTTP 400 (checked on the live gateway)
    seen = []
    front = raw(lambda b: seen.append(b) or Reply(completion_stream(int(b.get("max_tokens", 2)), 0.0, 0.0)))
    o = BenchSettings(url=front.url, model="raw", concurrency=[1], requests=2, output_len=2, workload="random", input_len=8,
                      warmup=0, telemetry=False, timeout=30.0, replicas={"a": "http://127.0.0.1:9"})
    with pytest.raises(InputError, match="token-id prompts, which the gateway refuses.*--chat"):
        bench_run.run(o, vocab_size=1000)
    assert seen == []
    # straight to a server (no replicas behind it) the same workload runs
    assert bench_run.run(o.model_copy(update={"replicas": {}}), vocab_size=1000).summary["levels"][0]["completed"] == 2
