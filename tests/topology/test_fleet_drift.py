"""`service drift` on the live fleet: two SGLang CPU replicas and the real gateway, started from the rendered units."""
from runbook.service.topodrift import drift_all


def test_drift_finds_every_live_replica_and_the_gateway_as_rendered(gateway_fleet):
    rows, findings, info = drift_all(gateway_fleet.spec)
    assert rows == [], rows
    assert [(f.id, f.status, f.title.split(":")[0]) for f in findings[:2]] == [
        ("service.drift", "pass", "r0"), ("service.drift", "pass", "r1")]
    assert (findings[2].id, findings[2].status, findings[2].title) == (
        "service.drift.gateway", "pass", "the gateway routes to exactly the spec's 2 replicas")
    assert all(s["max_total_num_tokens"] > 0 for s in info["replicas"].values())
    assert all(w["is_healthy"] for w in info["gateway"]["workers"])
