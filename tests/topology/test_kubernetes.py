"""Kubernetes manifests from the spec (service/kubernetes.py): valid against Kubernetes' own schemas (kubernetes-validate,
strict), their container commands accepted by SGLang's and the gateway's own parsers once expanded as the kubelet
expands them, and no secret in them. kubectl is not used: its client-side dry run needs an API server."""
import json
import os
import string
from pathlib import Path

import kubernetes_validate.utils
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.core import spec
from runbook.core.errors import SpecError
from runbook.core.findings import Finding
from runbook.service import gateway, unitfile
from runbook.service import kubernetes as k8s

from .specs import GATEWAY_PY, needs_gateway, nodes_dep, topo

SERVING_PY = os.environ.get("RUNBOOK_SERVING_PYTHON")
needs_parsers = pytest.mark.skipif(not (SERVING_PY and os.path.exists(SERVING_PY) and GATEWAY_PY and os.path.exists(GATEWAY_PY)),
                                   reason="SGLang's or the gateway's env is missing: `make serving-env gateway-env`")


def by_kind(docs):
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def args_of(doc, role=""):
    return dict(k8s._templates(doc))[role]["spec"]["containers"][0]["args"]


def test_replicas_are_a_deployment_and_service_and_the_gateway_finds_them_by_selector():
    docs = k8s.manifests(topo(), "registry.example/sglang:v0.5.23", "registry.example/smg:1.13.0")
    kinds = by_kind(docs)
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"]
    server, gw = kinds["Deployment"]
    assert server["spec"]["replicas"] == 3
    pod = server["spec"]["template"]
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    # The gateway selects exactly the server pods' labels, on their port, in its own namespace.
    a = args_of(gw)
    sel = a[a.index("--selector") + 1:a.index("--service-discovery-port")]
    assert dict(x.split("=", 1) for x in sel) == pod["metadata"]["labels"] == kinds["Service"][0]["spec"]["selector"]
    assert a[a.index("--service-discovery-port") + 1] == "30000" and "--worker-urls" not in a
    assert gw["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/smg:1.13.0"
    assert kinds["Role"][0]["rules"][0]["verbs"] == ["get", "list", "watch"]
    assert [f.status for f in k8s.validate(docs)] == ["pass"]


def test_a_model_across_nodes_is_a_leaderworkerset_with_the_leader_behind_the_service():
    docs = k8s.manifests(nodes_dep())
    lws, svc = docs
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    lead, work = unitfile.flags_of(args_of(lws, "leader")), unitfile.flags_of(args_of(lws, "worker"))
    assert (lead["node-rank"], work["node-rank"]) == ("0", "$(LWS_WORKER_INDEX)")
    assert lead["dist-init-addr"] == work["dist-init-addr"] == "$(LWS_LEADER_ADDRESS):50000"
    assert (lead["nnodes"], lead["tp-size"]) == ("2", "16")
    assert svc["spec"]["selector"]["sglang-runbook/role"] == "leader"
    assert "ports" not in dict(k8s._templates(lws))["worker"]["spec"]["containers"][0]   # a worker rank serves no HTTP
    f = k8s.validate(docs)
    assert [x.status for x in f] == ["pass"] and "PodTemplate" in f[0].detail and "kubectl" in f[0].detail


def test_secrets_come_from_a_secret_by_name_never_inlined(monkeypatch):
    monkeypatch.setenv("SGLANG_API_KEY", "sk-live-SECRET-1")
    monkeypatch.setenv("GATEWAY_API_KEY", "sk-live-SECRET-2")
    d = topo()
    docs = k8s.manifests(d)
    text = k8s.to_yaml(d, docs)
    assert "SECRET" not in text
    server_c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    ref = {"secretKeyRef": {"name": k8s.secret_name(d), "key": "SGLANG_API_KEY"}}
    assert {"name": "SGLANG_API_KEY", "valueFrom": ref} in server_c["env"]
    assert server_c["args"][-2:] == ["--api-key", "$(SGLANG_API_KEY)"]
    assert args_of(docs[5])[-2:] == ["--api-key", "$(GATEWAY_API_KEY)"]
    assert not any(e["name"] == "PATH" for e in server_c["env"])   # the host's install paths stay on the host


@pytest.mark.parametrize("mutate, where", [
    (lambda docs: docs[1]["spec"]["ports"][0].__setitem__("port", "eighty"), "Service/"),
    (lambda docs: docs[0]["spec"]["template"]["spec"]["containers"][0].__setitem__("gpus", 4), "Deployment/"),
])
def test_the_schemas_refuse_a_bad_object_naming_it(mutate, where):
    docs = k8s.manifests(topo())
    mutate(docs)
    f = k8s.validate(docs)
    assert [x.status for x in f] == ["fail"] and f[0].title.startswith(where), f


def test_the_schemas_refuse_a_bad_leaderworkerset_template():
    docs = k8s.manifests(nodes_dep())
    docs[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["ports"] = [{"containerPort": "x"}]
    f = k8s.validate(docs)
    assert [x.status for x in f] == ["fail"] and "workerTemplate" in f[0].title


@pytest.mark.serving
@needs_parsers
def test_the_leader_and_worker_commands_parse_with_sglangs_own_parser():
    d = nodes_dep()
    f = k8s.check_commands(d, k8s.manifests(d))
    assert [x.title.split(":")[0] for x in f if x.id == "service.k8s.parser" and x.status == "pass"] == [
        "LeaderWorkerSet/qwen3-5-397b-a17b-nvfp4 leader", "LeaderWorkerSet/qwen3-5-397b-a17b-nvfp4 worker"], f
    assert not [x for x in f if x.status in ("fail", "warn", "skip")], f


@needs_gateway
def test_a_refused_gateway_flag_in_the_manifest_names_its_field_and_object(monkeypatch):
    skip = Finding("service.parser", "skip", "SGLang flags not validated: no serving interpreter here")
    monkeypatch.setattr(k8s, "serving_python", lambda spec: (None, [skip]))   # SGLang's side is the test above
    d = topo({"health-check-interval-secs": "soon"})
    f = {x.id: x for x in k8s.check_commands(d, k8s.manifests(d))}
    g = f["service.k8s.gateway.flag.health-check-interval-secs"]
    assert g.status == "fail" and g.title.startswith("Deployment/qwen3-5-397b-a17b-nvfp4-gateway: ")
    assert "topology.gateway.flags.health-check-interval-secs" in g.title and f["service.parser"].status == "skip"


@needs_gateway
def test_the_gateway_container_command_parses_with_the_gateways_own_parser():
    d = topo()
    gw = k8s.manifests(d)[5]
    c = gw["spec"]["template"]["spec"]["containers"][0]
    args = [k8s.expand(w, {"POD_NAMESPACE": "serving", "GATEWAY_API_KEY": "REDACTED"}) for w in c["args"]]
    res = gateway.run_parser(d, [args], GATEWAY_PY)[0]
    assert res["ok"], res
    p = res["parsed"]
    assert (p["service_discovery"], p["service_discovery_namespace"], p["service_discovery_port"], p["policy"]) == (
        True, "serving", 30000, "cache_aware")
    assert p["worker_urls"] == [] and c["command"] == ["python3", "-m", "smg", "launch"]


def test_expansion_follows_the_rule_the_kubernetes_schema_states():
    defs = kubernetes_validate.utils.schema_contents(f"kubernetes-json-schema/v{k8s.K8S_VERSION}-local-strict/_definitions.json",
                                                     k8s.K8S_VERSION)["$defs"]
    rule = defs["io.k8s.api.core.v1.Container"]["properties"]["args"]["description"]
    assert 'Double $$ are reduced to a single $' in rule and '"$$(VAR_NAME)" will produce the string literal "$(VAR_NAME)"' in rule
    env = {"VAR_NAME": "v", "A": "x"}
    assert k8s.expand("$(VAR_NAME)", env) == "v"
    assert k8s.expand("$$(VAR_NAME)", env) == "$(VAR_NAME)"                 # escaped: never expanded
    assert k8s.expand("$(NOPE)-$(A)", env) == "$(NOPE)-x"                   # unresolved: unchanged
    assert k8s.expand("$$", env) == "$" and k8s.expand("a$b", env) == "a$b" and k8s.expand("$(A", env) == "$(A"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "é€$()", max_size=30))
def test_escaped_words_reach_the_container_exactly(word):
    assert k8s.expand(k8s.escape(word), {"VAR_NAME": "v", "SGLANG_API_KEY": "leak"}) == word


def test_a_spec_value_that_looks_like_a_reference_is_not_expanded():
    d = spec.from_dict({**topo().model_dump(mode="json"), "serving": {**topo().serving.model_dump(mode="json"),
                        "flags": {**topo().serving.flags, "chat-template": "$(SGLANG_API_KEY) costs 5$"}}},
                       topo().source)
    a = args_of(k8s.manifests(d)[0])
    word = a[a.index("--chat-template") + 1]
    assert word == "$$(SGLANG_API_KEY) costs 5$$"
    assert k8s.expand(word, {"SGLANG_API_KEY": "sk-live"}) == "$(SGLANG_API_KEY) costs 5$"


def test_a_bad_image_is_refused_in_one_line():
    with pytest.raises(SpecError, match=r"^--image: 'a b' is not an image reference"):
        k8s.manifests(topo(), "a b")


@pytest.mark.serving   # the CLI checks the commands with SGLang's parser, end to end
def test_cli_k8s_writes_the_manifests(cli, tmp_path):
    cp = cli("service", "k8s", "--out", tmp_path, "--json")
    assert cp.returncode in (0, 1), cp.stderr
    j = json.loads(cp.stdout)
    assert j["file"] and Path(j["file"]).read_text().count("\n---\n") == len(j["manifests"]) - 1
    got = {f["id"]: f["status"] for f in j["findings"]}
    assert got["service.k8s.schema"] == "pass", got
    if SERVING_PY and os.path.exists(SERVING_PY):
        assert got["service.k8s.parser"] == "pass", got
