"""runbook verify on the real fleet: two SGLang CPU replicas behind the real smg, started from the rendered units.

It passes as started; a spec naming a replica the gateway does not list, or leaving one out, is named; a replica
stopped is named by verify itself and, through a second gateway of ours with fast health checks in front of the
same replicas, by the gateway's own view. The stopped replica is started again before the test ends (the fleet
is the session's)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from runbook import verify
from runbook.core import SGLANG_VERSION, oscalls, ports
from runbook.core.spec import Deployment
from runbook.demo import topology

pytestmark = pytest.mark.timeout(900)


def _log_dir(fleet) -> str:
    return str(fleet.gateway.log.parent)          # demo.topology.start writes replica-NAME.log and gateway.log there


def _statuses(rep, prefix: str) -> dict[str, str]:
    return {f.id: f.status for f in rep.findings if f.id.startswith(prefix)}


def _with(spec: Deployment, **topo) -> Deployment:
    data = spec.model_dump()
    data["topology"] = {**data["topology"], **topo}
    return Deployment.model_validate({**data, "source": spec.source})


def test_verify_passes_on_the_fleet_as_started(gateway_fleet):
    rep = verify.evaluate(gateway_fleet.spec, verify.VerifyOptions(log_dir=_log_dir(gateway_fleet)))
    # On CPU a replica sizes its pool from the host's free memory while the other replica starts beside it (and the
    # other helpers' work): its pool against the plan is a true finding either way, not the topology's. Seen once
    # of three runs here: r1 at 51,971 tokens against a plan of 269,061.
    moved = {"verify.tokens", "verify.server.tokens"}
    bad = [(f.id, f.status, f.title) for f in rep.findings if f.status == "fail" and f.id not in moved]
    assert not bad, bad
    g = _statuses(rep, "verify.gateway")
    assert g == {"verify.gateway.workers": "pass", "verify.gateway.replica.r0": "pass", "verify.gateway.replica.r1": "pass",
                 "verify.gateway.policy": "pass"}
    pol = next(f for f in rep.findings if f.id == "verify.gateway.policy")
    assert "cache_aware" in pol.title and "gateway.log" in pol.title       # read from smg's own start line
    # each replica verified against its plan from its own log: its pool, named by its title
    tokens = [f for f in rep.findings if f.id == "verify.tokens"]
    assert sorted(f.title.split(":")[0] for f in tokens) == ["r0", "r1"], tokens
    doc = rep.data()
    assert [(r["up"], r["registered"], r["healthy"]) for r in doc["replicas"]] == [(True, True, True)] * 2
    assert all(r["observed"]["max_total_num_tokens"] for r in doc["replicas"])
    assert {w["version"] for w in doc["gateway"]["workers"]} == {SGLANG_VERSION}
    print(verify.text_table(rep))


def test_a_replica_the_gateway_does_not_list_and_a_worker_the_spec_does_not_name(gateway_fleet):
    spec = gateway_fleet.spec
    r0, r1 = spec.topology.replicas
    extra = {"name": "r2", "host": "127.0.0.1", "port": ports.free_port()}
    more = _with(spec, replicas=[r0.model_dump(), r1.model_dump(), extra])
    rep = verify.evaluate(more, verify.VerifyOptions(log_dir=_log_dir(gateway_fleet)))
    g = _statuses(rep, "verify.gateway")
    assert g["verify.gateway.replica.r2"] == "fail" and g["verify.gateway.workers"] == "fail"
    assert g["verify.gateway.replica.r0"] == g["verify.gateway.replica.r1"] == "pass"
    assert _statuses(rep, "verify.replica.")["verify.replica.r2"] == "fail"
    fewer = _with(spec, replicas=[r0.model_dump()])
    rep = verify.evaluate(fewer, verify.VerifyOptions(log_dir=_log_dir(gateway_fleet)))
    extra_f = next(f for f in rep.findings if f.id == "verify.gateway.extra")
    assert extra_f.status == "warn" and r1.url in extra_f.detail


def _until(what: str, probe, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if probe():
            return
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


def _healthy(url: str) -> dict[str, bool]:
    try:
        return {w["url"]: bool(w.get("is_healthy")) for w in topology.workers(url)}
    except OSError:
        return {}


def test_a_stopped_replica_is_named_by_verify_and_by_the_gateway(gateway_fleet, tmp_path):
    spec = gateway_fleet.spec
    # our own gateway in front of the same replicas, checking their health every second (smg's default: 60 s x 3)
    g = spec.topology.gateway.model_dump()
    g.update(port=ports.free_port(), prometheus_port=ports.free_port(),
             flags={"health-check-interval-secs": 1, "health-failure-threshold": 1, "health-success-threshold": 1})
    fast = _with(spec, gateway=g)
    ours = topology.start_gateway(fast, tmp_path / "gateway.log")
    r1 = spec.topology.replicas[1]
    try:
        gateway_fleet.replicas[r1.name].stop()
        _until("our gateway sees r1 unhealthy", lambda: _healthy(ours.url).get(r1.url) is False, 60)
        rep = verify.evaluate(fast, verify.VerifyOptions(log_dir=str(tmp_path)))
        down = [(f.id, f.status, f.title) for f in rep.findings if f.status == "fail"]
        assert ("verify.replica.r1", "fail", f"r1: does not answer at {r1.url}") in down, down
        assert next(f for f in rep.findings if f.id == "verify.gateway.replica.r1").title.startswith("r1: unhealthy")
        assert _statuses(rep, "verify.gateway.replica.")["verify.gateway.replica.r0"] == "pass"
        assert _statuses(rep, "verify.replica.")["verify.replica.r0"] == "pass"
        assert {r["name"]: (r["up"], r["healthy"]) for r in rep.data()["replicas"]} == {"r0": (True, True), "r1": (False, False)}
    finally:
        try:
            # its listener gone (TIME_WAIT does not count: SGLang binds with SO_REUSEADDR, as oscalls.port_free does)
            _until("r1's port free again", lambda: oscalls.port_free("127.0.0.1", r1.port), 30)
            # into the fleet's own log directory, so its replica-r1.log is the running replica's again
            gateway_fleet.replicas.update(topology.start_replicas(spec, Path(_log_dir(gateway_fleet)), names=[r1.name]))
            _until("our gateway sees r1 healthy again", lambda: _healthy(ours.url).get(r1.url) is True, 60)
        finally:
            ours.stop()
        # the session's gateway (60 s checks) sees both healthy before the next test uses it
        _until("the session's gateway sees both healthy", lambda: all(_healthy(gateway_fleet.url).values())
               and len(_healthy(gateway_fleet.url)) == 2, 240)
