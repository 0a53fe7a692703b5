"""Kubernetes manifests from the same spec as the systemd units, validated against Kubernetes' own schemas.

One server or replicas: a Deployment (replicas: N) and a Service. One server across `parallelism.nodes`: a
LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, what SGLang's own docs use; size = nodes, the leader --node-rank 0,
each worker --node-rank $(LWS_WORKER_INDEX), --dist-init-addr $(LWS_LEADER_ADDRESS):port) and a Service to the
leader. The gateway: a Deployment and a Service, finding the server pods itself (smg's Kubernetes discovery:
--service-discovery --selector ...; with --worker-urls at one Service it would see one worker and its cache-aware
policy would route nothing), allowed to list pods by a ServiceAccount, Role and RoleBinding.

The container arguments are the rendered unit's, re-quoted for the kubelet: it expands $(VAR) from the container's
environment, so every `$` from the spec is written `$$`, and only the references written here are expanded. The
API key comes from a Secret (<name>-secrets, by its env var name), never inlined.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Any

from runbook.core import SGLANG_VERSION
from runbook.core.errors import SpecError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.core.topospec import GATEWAYS
from runbook.service import gateway
from runbook.service.check import check_flags_many, serving_python
from runbook.service.render import Rendered, build

K8S_VERSION = "1.37.0"          # the schemas kubernetes-validate (requirements.txt) checks against
DEFAULT_IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}"
LWS_API = "leaderworkerset.x-k8s.io/v1"
# What LWS sets in every pod of a group, and sample values the parsers are run with.
LWS_ENV = {"LWS_LEADER_ADDRESS": "leader.lws.example", "LWS_WORKER_INDEX": "1"}
NAMESPACE_ENV = "POD_NAMESPACE"
# serving.env entries that describe the host's own install, not the model's configuration: the image sets its own.
HOST_ENV = frozenset({"PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "PYTHONPATH", "VIRTUAL_ENV", "HOME"})
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


class Ref(str):
    """An argument word the renderer writes with a $(VAR) reference for the kubelet to expand."""


def escape(word: str) -> str:
    """A word the kubelet passes unchanged: `$$` is its escape for `$` (so no $(VAR) in a spec value expands)."""
    return word if isinstance(word, Ref) else word.replace("$", "$$")


def expand(word: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of one command/args word: $$ is $, $(NAME) a defined variable's value (an
    undefined one stays as written), any other $ itself."""
    out, i, n = [], 0, len(word)
    while i < n:
        c = word[i]
        if c == "$" and i + 1 < n:
            nxt = word[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = word.find(")", i + 2)
                if end < 0:
                    out.append(word[i:])
                    break
                name = word[i + 2:end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
                continue
            out.append(c + nxt)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def base_name(spec: Deployment) -> str:
    """The objects' name: the deployment's, as a DNS label (lower-case letters, digits, -; starting with a letter)."""
    name = _NOT_NAME.sub("-", spec.name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "sglang-" + name
    return name[:40].rstrip("-")   # room for -gateway, -secrets and the pods' suffixes within 63


def _labels(spec: Deployment, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": base_name(spec), "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "sglang-runbook"}


def secret_name(spec: Deployment) -> str:
    return f"{base_name(spec)}-secrets"


def _secret_env(spec: Deployment, env_name: str | None) -> list[dict[str, Any]]:
    if not env_name:
        return []
    return [{"name": env_name, "valueFrom": {"secretKeyRef": {"name": secret_name(spec), "key": env_name}}}]


def server_args(spec: Deployment, rank: str | None = None) -> list[str]:
    """SGLang's arguments for a pod: the rendered unit's, listening on every address of the pod at serving.port;
    a node rank's --node-rank and --dist-init-addr from LWS's variables."""
    unit = build(spec).units[0]
    words = unit.argv[3:]
    repl: dict[str, str] = {"--host": "0.0.0.0", "--port": str(spec.serving.port)}
    if spec.parallelism.nodes:
        repl["--node-rank"] = Ref("0") if rank == "leader" else Ref("$(LWS_WORKER_INDEX)")
        repl["--dist-init-addr"] = Ref(f"$(LWS_LEADER_ADDRESS):{spec.parallelism.dist_init_port}")
    if spec.serving.api_key_env:
        repl["--api-key"] = Ref(f"$({spec.serving.api_key_env})")
    out = [escape(w) for w in words]
    for i, w in enumerate(words[:-1]):
        if w in repl:
            out[i + 1] = repl[w]
    return out


def _server_pod(spec: Deployment, role: str | None) -> dict[str, Any]:
    s, sd = spec.serving, spec.systemd
    env = [{"name": k, "value": escape(v)} for k, v in s.env.items() if k not in HOST_ENV] + _secret_env(spec, s.api_key_env)
    container: dict[str, Any] = {
        "name": "sglang", "image": "IMAGE", "command": ["python3", "-m", "sglang.launch_server"],
        "args": server_args(spec, role), "env": env,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    if s.env_file:
        container["envFrom"] = [{"secretRef": {"name": secret_name(spec)}}]   # what the unit's EnvironmentFile= holds
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if spec.model.path.startswith("/"):
        # The checkpoint from the node's disk, where the units expect it; swap for a PVC on shared storage.
        container["volumeMounts"].append({"name": "model", "mountPath": spec.model.path, "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": spec.model.path, "type": "Directory"}})
    if role != "worker":   # a worker rank serves no HTTP
        container["ports"] = [{"name": "http", "containerPort": s.port}]
        probe = {"httpGet": {"path": sd.ready_path, "port": "http"}, "periodSeconds": 10}
        container["startupProbe"] = {**probe, "failureThreshold": max(1, sd.timeout_start_sec // 10)}
        container["readinessProbe"] = probe
    gpus = spec.parallelism.gpus // max(1, len(spec.parallelism.nodes))
    if s.flags.get("device") != "cpu":
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"containers": [container], "volumes": volumes}


def _service(spec: Deployment, name: str, selector: dict[str, str], port: int, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}


def _servers(spec: Deployment) -> list[dict[str, Any]]:
    name, labels = base_name(spec), _labels(spec, "server")
    if spec.parallelism.nodes:
        lead = {**labels, "sglang-runbook/role": "leader"}
        lws = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": {"name": name, "labels": labels},
               "spec": {"replicas": 1, "leaderWorkerTemplate": {
                   "size": len(spec.parallelism.nodes), "restartPolicy": "RecreateGroupOnPodRestart",
                   "leaderTemplate": {"metadata": {"labels": lead}, "spec": _server_pod(spec, "leader")},
                   "workerTemplate": {"metadata": {"labels": {**labels, "sglang-runbook/role": "worker"}},
                                      "spec": _server_pod(spec, "worker")}}}}
        return [lws, _service(spec, name, lead, spec.serving.port, labels)]
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
           "spec": {"replicas": max(1, len(spec.topology.replicas)), "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": _server_pod(spec, None)}}}
    return [dep, _service(spec, name, labels, spec.serving.port, labels)]


def gateway_args(spec: Deployment) -> list[str]:
    """The gateway's router flags for a pod: the unit's, but the workers found by smg's Kubernetes discovery."""
    g = gateway.gateway(spec)
    selector = [f"{k}={v}" for k, v in _labels(spec, "server").items()]
    out: list[str] = []
    for grp in gateway.argv_groups(spec)[1:]:
        if grp[0] == "--worker-urls":
            out += ["--service-discovery", "--selector", *selector, "--service-discovery-port", str(spec.serving.port),
                    "--service-discovery-namespace", Ref(f"$({NAMESPACE_ENV})")]
        elif grp[0] == "--host":
            out += ["--host", "0.0.0.0"]
        elif grp[0] == "--api-key":
            out += ["--api-key", Ref(f"$({g.api_key_env})")]
        else:
            out += [escape(str(w)) for w in grp]
    return out


def _gateway(spec: Deployment) -> list[dict[str, Any]]:
    g = gateway.gateway(spec)
    name, labels = f"{base_name(spec)}-gateway", _labels(spec, "gateway")
    prefix, _ = GATEWAYS[g.binary]
    env = [{"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    container: dict[str, Any] = {
        "name": "gateway", "image": "GATEWAY_IMAGE", "command": ["python3", *prefix], "args": gateway_args(spec),
        "env": env + _secret_env(spec, g.api_key_env), "ports": [{"name": "http", "containerPort": g.port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}}
    if g.prometheus_port is not None:
        container["ports"].append({"name": "metrics", "containerPort": g.prometheus_port})
    meta = {"name": name, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"serviceAccountName": name, "containers": [container]}}}},
        _service(spec, name, labels, g.port, labels)]


def manifests(spec: Deployment, image: str = DEFAULT_IMAGE, gateway_image: str | None = None) -> list[dict[str, Any]]:
    """Every object, in the order `kubectl apply -f` should create them."""
    for field, v in (("--image", image), ("--gateway-image", gateway_image)):
        if v is not None and (not v.strip() or any(c.isspace() for c in v)):
            raise SpecError(f"{field}: {v!r} is not an image reference (registry/name:tag, no spaces)")
    docs = _servers(spec) + (_gateway(spec) if spec.topology.gateway is not None else [])
    for d in docs:
        for c in _containers(d):
            c["image"] = image if c["image"] == "IMAGE" else (gateway_image or image)
    return docs


def _templates(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) of a workload object."""
    if doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        return [("leader", t["leaderTemplate"]), ("worker", t["workerTemplate"])]
    if doc["kind"] == "Deployment":
        return [("", doc["spec"]["template"])]
    return []


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for _, t in _templates(doc) for c in t["spec"]["containers"]]


def to_yaml(spec: Deployment, docs: list[dict[str, Any]]) -> str:
    import yaml  # lazy: only when manifests are written

    head = (f"# Rendered by the runbook from {spec.source or 'a spec'} (deployment {spec.name}); edit the spec and re-render.\n"
            f"# Secrets: kubectl create secret generic {secret_name(spec)} --from-env-file=<serving.env_file> "
            "(the API key by its env var name; never in these manifests).\n")
    objs = [plain(d) for d in docs]
    return head + yaml.safe_dump_all(objs, sort_keys=False, default_flow_style=False)


def plain(v: Any) -> Any:
    """Ref and other str subclasses as plain str (safe_dump refuses subclasses)."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return str(v) if isinstance(v, str) else v


def validate(docs: list[dict[str, Any]], version: str = K8S_VERSION) -> list[Finding]:
    """Each object against Kubernetes' schemas (kubernetes-validate, strict: unknown fields refused). The
    LeaderWorkerSet is a CRD the schemas do not hold: its leader and worker templates are validated as v1
    PodTemplates, and its own fields are checked here."""
    import kubernetes_validate  # lazy: its schemas are read only when manifests are validated

    out: list[Finding] = []
    n = 0
    for d in docs:
        what = f"{d['kind']}/{d['metadata']['name']}"
        objs = [(what, d)] if d["kind"] != "LeaderWorkerSet" else [
            (f"{what} {role}Template", {"apiVersion": "v1", "kind": "PodTemplate",
                                        "metadata": {"name": f"{d['metadata']['name']}-{role}"}, "template": t})
            for role, t in _templates(d)]
        if d["kind"] == "LeaderWorkerSet":
            size = d["spec"]["leaderWorkerTemplate"].get("size")
            if not (isinstance(size, int) and size >= 1):
                out.append(Finding("service.k8s.schema", "fail", f"{what}: spec.leaderWorkerTemplate.size must be an integer ≥ 1"))
        for label, obj in objs:
            n += 1
            try:
                kubernetes_validate.validate(plain(obj), version, strict=True)
            except kubernetes_validate.ValidationError as e:
                cause = getattr(e, "caused_by", e)
                path = ".".join(str(p) for p in getattr(cause, "absolute_path", []))
                out.append(Finding("service.k8s.schema", "fail", f"{label}: {getattr(cause, 'message', str(e))}",
                                   evidence=path, remedy="Fix the spec value that produced this field (or report a "
                                                         "renderer bug)."))
    if not out:
        out.append(Finding("service.k8s.schema", "pass",
                           f"{n} objects valid against Kubernetes {version}'s schemas (kubernetes-validate, strict)",
                           detail="A LeaderWorkerSet's leader and worker templates are validated as v1 PodTemplates (its CRD "
                                  "is not in the schemas). kubectl's client-side dry run is not run: it needs an API server."))
    return out


def server_probes(spec: Deployment, docs: list[dict[str, Any]]) -> list[tuple[str, Rendered]]:
    """(where, a Rendered as SGLang's parser probe takes it) for each server pod template, its arguments expanded as
    the kubelet would with sample values for what LWS and the Secret provide."""
    out = []
    for d in docs:
        for role, t in _templates(d):
            c = t["spec"]["containers"][0]
            if c["name"] != "sglang":
                continue
            env = {**LWS_ENV, **{e["name"]: "REDACTED" for e in c.get("env", []) if "valueFrom" in e}}
            argv = [*c["command"], *(expand(str(w), env) for w in c["args"])]
            where = f"{d['kind']}/{d['metadata']['name']}" + (f" {role}" if role else "")
            out.append((where, Rendered("", argv, {}, where)))
    return out


def check_commands(spec: Deployment, docs: list[dict[str, Any]], run: Callable = subprocess.run) -> list[Finding]:
    """The containers' commands, expanded as the kubelet would, through SGLang's own parser and the gateway's."""
    out: list[Finding] = []
    probes = server_probes(spec, docs)
    python, notes = serving_python(spec)
    out += notes
    if python:
        for (where, _), fs in zip(probes, check_flags_many([r for _, r in probes], python, run), strict=True):
            out += [_k8s(f, where) for f in fs]
    if spec.topology.gateway is not None:
        gpy, notes = gateway.gateway_python(spec)
        out += notes
        gdoc = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-gateway"))
        c = _containers(gdoc)[0]
        env = {NAMESPACE_ENV: "default", **{e["name"]: "REDACTED" for e in c["env"] if "secretKeyRef" in e["valueFrom"]}}
        if gpy:
            res = gateway.run_parser(spec, [[expand(str(w), env) for w in c["args"]]], gpy, run)
            fs = [res] if isinstance(res, Finding) else gateway.parser_findings(spec, res[0])
            out += [_k8s(f, f"Deployment/{gdoc['metadata']['name']}") for f in fs]
    return out


def _k8s(f: Finding, where: str) -> Finding:
    """A parser finding about a manifest: its id under service.k8s., its title naming the object."""
    return Finding("service.k8s." + f.id.removeprefix("service."), f.status, f"{where}: {f.title}", f.detail, f.evidence,
                   f.remedy)
