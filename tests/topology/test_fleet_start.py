"""The fleet fixture itself: replicas and smg started from the rendered units, as the gateway sees them."""
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
