"""tune over a gateway's policies, without a server: the spec's `tune.gateway_policies` (hostile values as one line
naming the key), the candidates it makes, where a candidate gateway listens (never production's port), the production
unit it displaces, the routing guard's verdicts and the table's per-turn cache hits."""
import pytest
import yaml
from conftest import REPO

from runbook.core import spec as spec_mod
from runbook.core.errors import InputError, SpecError
from runbook.tune import candidates, engines, recommend, report, routing

BASE = REPO / "deployments" / "tiny-llama-sglang-cpu.yaml"
TOPOLOGY = {"replicas": [{"name": "r0", "host": "127.0.0.1", "port": 31001}, {"name": "r1", "host": "127.0.0.1", "port": 31002}],
            "gateway": {"python": "/opt/gw/bin/python", "host": "127.0.0.1", "bind": "0.0.0.0", "port": 8000,
                        "policy": "cache_aware"}}


def _spec(tune: dict, topology: dict | None = TOPOLOGY) -> spec_mod.Deployment:
    data = yaml.safe_load(BASE.read_text())
    data["tune"] = tune
    if topology is not None:
        data["topology"] = topology
    return spec_mod.from_dict(data, str(BASE))


@pytest.mark.parametrize("tune, topology, msg", [
    ({"gateway_policies": ["fastest"]}, TOPOLOGY, "tune.gateway_policies.0: Input should be 'random'"),
    ({"gateway_policies": ["round_robin", "round_robin"]}, TOPOLOGY, "tune.gateway_policies: round_robin is listed twice"),
    ({"gateway_policies": "round_robin"}, TOPOLOGY, "tune.gateway_policies: Input should be a valid list"),
    ({"gateway_policies": [None]}, TOPOLOGY, "tune.gateway_policies.0: Input should be"),
    ({"gateway_policies": [["round_robin"]]}, TOPOLOGY, "tune.gateway_policies.0: Input should be"),
    ({"gateway_policies": ["random"] * 17}, TOPOLOGY, "tune.gateway_policies: List should have at most 16 items"),
    ({"gateway_policies": ["round_robin"]}, None, "tune.gateway_policies: this deployment declares no gateway (topology.gateway)"),
    ({"gateway_policies": ["Round_Robin"]}, TOPOLOGY, "tune.gateway_policies.0: Input should be"),
])
def test_hostile_gateway_policies_are_one_line_naming_the_key(tune, topology, msg):
    with pytest.raises(SpecError) as e:
        _spec(tune, topology)
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_policies_are_the_candidates_the_production_policy_the_reference():
    dep = _spec({"gateway_policies": ["round_robin", "cache_aware", "prefix_hash"]})
    cs = candidates.expand(dep)
    # the production policy listed again is the reference itself, not a second launch of it
    assert [(c.name, c.policy) for c in cs] == [("reference", "cache_aware"), ("policy=round_robin", "round_robin"),
                                                ("policy=prefix_hash", "prefix_hash")]
    assert [c.name for c in candidates.select(cs, ["policy=prefix_hash"])] == ["reference", "policy=prefix_hash"]
    applied = candidates.apply(dep, cs[1])
    assert applied.topology.gateway.policy == "round_robin" and dep.topology.gateway.policy == "cache_aware"
    assert applied.serving == dep.serving and applied.topology.replicas == dep.topology.replicas


@pytest.mark.parametrize("tune, msg", [
    ({"gateway_policies": ["round_robin"], "candidates": {"fp8": {"flags": {"kv-cache-dtype": "fp8_e4m3"}}}},
     "tune.candidates: this deployment declares topology.gateway, so tune relaunches only the gateway"),
    ({"grid": {"page-size": [16, 32]}}, "tune.grid: this deployment declares topology.gateway"),
    ({"gateway_policies": ["round_robin"], "reference": "mine"}, "tune.reference: a gateway deployment's reference is its own policy"),
])
def test_server_candidates_beside_a_gateway_are_refused_naming_the_key(tune, msg):
    with pytest.raises(InputError) as e:
        candidates.expand(_spec(tune))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_candidate_gateway_listens_on_free_loopback_ports_never_production():
    dep = _spec({"gateway_policies": ["round_robin"]})
    eng = engines.for_spec(dep)
    assert eng.name == "gateway" and engines.for_spec(_spec({}, None)).name == "sglang"
    # production: the gateway's own unit and its /health (loopback for a wildcard bind), not the server's unit
    assert eng.production(dep) == (f"{dep.systemd.unit_name}-gateway", "http://127.0.0.1:8000/health")
    placed = [eng.placed(candidates.apply(dep, c)) for c in candidates.expand(dep)]
    ports = [eng.address(p) for p in placed]
    assert all(h == "127.0.0.1" and p != 8000 for h, p in ports) and len(set(ports)) == len(ports)
    for p in placed:
        g = p.topology.gateway
        assert g.prometheus_port not in (None, 29000, g.port)
        argv, env = eng.launch_env(p)
        assert argv[argv.index("--port") + 1] == str(g.port) and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"      # smg binds its metrics on every address
        assert argv[argv.index("--worker-urls") + 1:argv.index("--worker-urls") + 3] == [r.url for r in dep.topology.replicas]
        assert env == {}
    assert [p.topology.gateway.policy for p in placed] == ["cache_aware", "round_robin"]


def test_pre_check_skips_every_policy_when_a_replica_is_down():
    dep = _spec({"gateway_policies": ["round_robin"]})      # nothing listens on the replicas' ports
    pres = engines.for_spec(dep).precheck_many([candidates.apply(dep, c) for c in candidates.expand(dep)], 1024, [1024])
    assert [p.status for p in pres] == ["skipped", "skipped"]
    assert pres[0].reason.startswith("replica r0 http://127.0.0.1:31001 (") and "start their units first" in pres[0].reason


W = [{"url": "http://127.0.0.1:31001", "healthy": True, "model": "tiny-llama", "version": "0.5.23"},
     {"url": "http://127.0.0.1:31002", "healthy": True, "model": "tiny-llama", "version": "0.5.23"}]


def _got(policy, workers=W, identity=("def f(x):\n    return x", "import os"), failed=0, sent=10):
    return {"identity": list(identity), "workers": workers, "failed": failed, "sent": sent, "setup": {"policy": policy}}


def test_routing_guard_passes_the_same_replicas_answering_the_same():
    dep = _spec({"gateway_policies": ["round_robin"]})
    v = routing.compare(dep, _got("cache_aware"), _got("round_robin"))
    assert v["status"] == "pass" and [c["probe"] for c in v["checks"]] == ["workers", "answers", "identity"]
    assert v["tested"] == "gateway policy cache_aware vs round_robin (the same replicas: no numerics differ)"
    assert "remedy" not in v and not any(c["probe"] in ("kld", "recall", "toolcall") for c in v["checks"])


@pytest.mark.parametrize("change, probe, words", [
    ({"workers": W[:1]}, "workers", "r1 (http://127.0.0.1:31002) not listed"),
    ({"workers": [W[0], dict(W[1], healthy=False)]}, "workers", "r1 (http://127.0.0.1:31002) unhealthy"),
    ({"workers": [W[0], dict(W[1], model="other")]}, "workers", "r1 serves model other (under the reference policy: tiny-llama)"),
    ({"workers": [*W, dict(W[0], url="http://10.0.0.9:1")]}, "workers", "http://10.0.0.9:1 is not a replica of the spec"),
    ({"failed": 3}, "answers", "3 of 10 requests through the gateway failed"),
    ({"identity": ("something else entirely", "import os")}, "identity", "diverge from the reference early"),
])
def test_routing_guard_fails_what_a_policy_can_break(change, probe, words):
    dep = _spec({"gateway_policies": ["manual"]})
    v = routing.compare(dep, _got("cache_aware"), _got("manual", **change))
    bad = [c for c in v["checks"] if c["status"] == "fail"]
    assert v["status"] == "fail" and [c["probe"] for c in bad] == [probe] and words in bad[0]["title"], v
    assert v["remedy"] == routing.remedy([probe], "manual") and "\n" not in v["remedy"]


def test_table_and_recommendation_of_a_policy_run(tmp_path):
    dep = _spec({"gateway_policies": ["round_robin"]})
    turns = [{"turn": 1, "cache_hit_rate": 0.0}, {"turn": 2, "cache_hit_rate": 0.8125}, {"turn": 3, "cache_hit_rate": None}]
    rows = [{"name": "reference", "policy": "cache_aware", "status": "done", "guard": {"status": "reference", "checks": []},
             "bench": {"output_tok_s": 10.0, "slo_limit": 2, "turns": turns, "per_request": []}},
            {"name": "policy=round_robin", "policy": "round_robin", "status": "done", "guard": {"status": "pass", "checks": []},
             "bench": {"output_tok_s": 12.0, "slo_limit": 4, "turns": turns, "per_request": []}}]
    rec = recommend.recommend(dep, rows)
    assert rec["name"] == "policy=round_robin" and rec["policy"] == "round_robin"
    assert "set topology.gateway.policy: round_robin in" in rec["command"] and "restart runbook-demo-sglang-gateway" in rec["command"]
    assert rec["note"].startswith("no unit installed at /etc/systemd/system/runbook-demo-sglang-gateway.service")
    table = {r["candidate"]: r for r in report.rows({"candidates": rows})}
    assert table["reference"]["gateway policy"] == "cache_aware" and table["reference"]["cache hit per turn"] == "0 % / 81 % / —"
    assert "gateway policy" in report.text_table(type("R", (), {"data": lambda self: {"candidates": rows, "recommendation": rec}})())
