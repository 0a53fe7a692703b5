"""The fleet fixture itself: replicas and smg started from the rendered units, as the gateway sees them."""
import pytest

from runbook.demo import topology


def test_gateway_lists_every_replica_healthy_from_the_rendered_units(gateway_fleet):
    seen = {w["url"]: w for w in topology.workers(gateway_fleet.url)}
    want = {r.url for r in gateway_fleet.spec.topology.replicas}
    assert set(seen) == want
    assert all(w["is_healthy"] for w in seen.values())
    # The processes run exactly the rendered argv: the gateway's unit names the policy and every replica.
    argv = gateway_fleet.gateway.argv
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert all(u in argv for u in want)


def test_a_replica_whose_port_was_taken_relaunches_the_fleet_on_new_ports(tmp_path, monkeypatch):
    """SGLang's Errno 98 in a replica's log: the fleet is built again on fresh ports; any other death is raised."""
    from runbook.demo.sglang import Exited

    log = tmp_path / "replica-r0.log"
    log.write_text("[2026-12-06 03:16:51] [Errno 98] error while attempting to bind on address ('127.0.0.1', 40001): "
                   "address already in use\n")
    specs, tries = iter(["spec-1", "spec-2"]), []

    def start(dep, log_dir):
        tries.append(dep)
        if len(tries) == 1:
            raise Exited("SGLang could not bind its port during start-up", log)
        return f"fleet on {dep}"

    monkeypatch.setattr(topology, "deployment", lambda replicas, policy: next(specs))
    monkeypatch.setattr(topology, "start", start)
    assert topology.launch(tmp_path) == "fleet on spec-2" and tries == ["spec-1", "spec-2"]

    log.write_text("RuntimeError: not enough memory\n")
    specs, tries = iter(["spec-3", "spec-4"]), []
    monkeypatch.setattr(topology, "deployment", lambda replicas, policy: next(specs))
    with pytest.raises(Exited):
        topology.launch(tmp_path)
    assert tries == ["spec-3"]
