"""Stage 40 through the real gateway (smg) in front of two real SGLang CPU replicas: each replica's share read from its
own /metrics against the client's own count; cache hits per agentic turn under cache_aware and round_robin on the
same replicas (only the gateway relaunched); one replica killed mid-run, accounted request by request.

The first test uses the session's `gateway_fleet`; the policy comparison and the kill run on a fleet of this module's
own (the kill would break the shared one), stopped when the module ends."""
from __future__ import annotations

import os
import signal

import pytest

from runbook import bench
from runbook.bench import failover, policies, replicas
from runbook.bench.settings import BenchSettings
from runbook.demo import topology

SESSIONS = {"workload": "agentic", "concurrency": [4], "requests": 4, "turns": 3, "input_len": 128, "output_len": 8,
            "chat": True, "warmup": 0}


def _summary(res) -> str:
    return "; ".join(f"{p['policy']}: turns 2+ {p['later_turns_hit_rate']}, per turn "
                     f"{[(t['turn'], t['cache_hit_rate']) for t in p['levels'][0]['turns']]}, replicas "
                     f"{[(r['name'], r['requests']) for r in p['levels'][0]['replicas']]}" for p in res["policies"])


@pytest.mark.sglang
def test_the_benchmark_runs_through_the_gateway_and_reads_each_replica(gateway_fleet):
    spec = gateway_fleet.spec
    opts = bench.BenchStageOptions(workload="agentic", concurrency=[2], requests=2, turns=2, input_len=64, output_len=8,
                                   chat=True, warmup=1, archive="")
    res = bench.evaluate(spec, opts)
    s = res.summary
    assert s["url"] == gateway_fleet.url
    assert s["replicas"] == {r.name: r.url for r in spec.topology.replicas}
    lv = s["levels"][0]
    assert lv["completed"] == 4 and lv["failed"] == 0
    rows = lv["replicas"]
    assert [r["name"] for r in rows] == ["r0", "r1"] and all(r["scraped"] for r in rows)
    # SGLang's own counters on each replica, summed, are exactly what the client sent and counted
    side = replicas.beside(lv)
    assert side["replica_requests"] == side["client_requests"] == 4
    assert side["replica_generation_tokens"] == lv["output_tokens"] == 4 * 8
    assert sum(r["request_share"] for r in rows) == pytest.approx(1.0)
    assert sum(r["cached_tokens"] for r in rows) > 0          # turn 2 re-sent turn 1's prefix


@pytest.fixture(scope="module")
def own_fleet(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("own-fleet")
    fleet = topology.launch(log_dir, policy="round_robin")
    yield fleet, log_dir
    fleet.stop()


@pytest.mark.sglang
def test_cache_aware_keeps_a_session_on_its_replica_and_earns_more_cache_hits(own_fleet):
    fleet, log_dir = own_fleet
    o = BenchSettings.resolve(fleet.spec, telemetry=False, **SESSIONS)
    res, findings = policies.compare_policies(["cache_aware", "round_robin"], topology.relauncher(fleet, log_dir), o)
    print("policy comparison:", _summary(res))
    by = {p["policy"]: p for p in res["policies"]}
    assert fleet.gateway is not None and "round_robin" in fleet.gateway.argv      # the last one relaunched runs
    for p in by.values():
        lv = p["levels"][0]
        assert lv["failed"] == 0 and [t["turn"] for t in lv["turns"]] == [1, 2, 3]
        # what the replicas served is every request sent: completed, or named implausible (and left out of the figures)
        named = lv.get("implausible") or []
        assert sum(r["requests"] for r in lv["replicas"]) == lv["completed"] + len(named) == 4 * 3, named
    rr = by["round_robin"]["levels"][0]["replicas"]
    assert [r["requests"] for r in rr] == [6, 6]                  # round robin: turn by turn, alternately
    ca, rrh = by["cache_aware"]["later_turns_hit_rate"], by["round_robin"]["later_turns_hit_rate"]
    assert ca > rrh, _summary(res)
    assert res["best"] == "cache_aware" and (findings[0].id, findings[0].status) == ("bench.gateway.policy", "pass")


@pytest.mark.sglang
def test_a_replica_killed_mid_run_is_accounted_request_by_request(own_fleet):
    fleet, _ = own_fleet
    victim = fleet.replicas["r1"]
    # a level of 16 s, the kill 6 s into the run: requests before, in flight at, and after it (short answers, so a
    # busy host still finishes some before the kill)
    o = BenchSettings.resolve(fleet.spec, workload="code", concurrency=[4], duration=16.0, output_len=16, warmup=0,
                              telemetry=False)

    def kill() -> None:               # a crash, not a clean stop: every process of the replica's session at once
        os.killpg(victim.pid, signal.SIGKILL)
        victim.stop()

    res, acc = failover.run_with_stop(o, kill, after_s=6.0)
    print("failover phases:", {k: {x: v[x] for x in ("requests", "failed", "errors")} for k, v in acc["phases"].items()})
    print("failed requests:", [(f["id"], f["phase"], f["status"], f["error_kind"], round(f["sent_s"], 2), f["error"])
                               for f in acc["failed"][:20]])
    assert acc["stopped"] and acc["stopped_at_s"] > 0
    lv = res.summary["levels"][0]
    assert len(acc["requests"]) == lv["completed"] + lv["failed"]            # every request is accounted, once
    ph = acc["phases"]
    assert ph["before"]["requests"] > 0 and ph["before"]["failed"] == 0, ph["before"]
    assert ph["after"]["requests"] > 0
    assert ph["after"]["requests"] - ph["after"]["failed"] > 0                # the survivor serves new requests
    for f in acc["failed"]:                                                    # each failure: when, which, why
        assert f["error_kind"] and f["phase"] in failover.PHASES and f["sent_s"] is not None
    rows = {r["name"]: r for r in lv["replicas"]}
    assert rows["r1"]["scraped"] is False and rows["r0"]["scraped"] is True
    assert rows["r0"]["request_share"] == 1.0
