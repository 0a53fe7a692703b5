"""The gateway's unit: SGLang's gateway (smg, or the older sglang-router) in front of the spec's replicas.

Its command line comes from `topology.gateway` and `topology.replicas` only: the replicas' URLs, the policy, the
ports. Validated for its place like the server's (py) and by the gateway's own argument parser
(check.gateway_parser) where its interpreter is on this machine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook.core.errors import SpecError
from runbook.core.spec import Deployment
from runbook.core.topospec import GATEWAYS, Gateway
from runbook.service import unitfile
from runbook.service.render import (
    READY_PROBE,
    TEMPLATES,
    EnvRef,
    Rendered,
    abs_path,
    check_account,
    check_host,
    comment,
    control,
    exec_start,
    pct,
)


def gateway(spec: Deployment) -> Gateway:
    g = spec.topology.gateway
    if g is None:
        raise SpecError(f"{spec.source or 'the spec'}: topology.gateway: this deployment declares no gateway")
    return g


def argv_groups(spec: Deployment) -> list[tuple[str, ...]]:
    """ExecStart's words, one group per flag: the gateway's interpreter, its module, then its router flags."""
    g = gateway(spec)
    prefix, _ = GATEWAYS[g.binary]
    groups: list[tuple[str, ...]] = [(g.python, *prefix), ("--host", g.bind), ("--port", str(g.port)),
                                     ("--worker-urls", *(r.url for r in spec.topology.replicas)),
                                     ("--policy", g.policy)]
    if g.prometheus_port is not None:
        groups.append(("--prometheus-port", str(g.prometheus_port)))
    for k, v in g.flags.items():
        if v is True:
            groups.append((f"--{k}",))
        elif v is not False and v is not None:
            groups.append((f"--{k}", str(v)))
    if g.api_key_env:
        groups.append(("--api-key", EnvRef("${" + g.api_key_env + "}")))
    return groups


def router_args(spec: Deployment) -> list[str]:
    """The words the gateway's own parser reads: everything after the interpreter and its module."""
    prefix, _ = GATEWAYS[gateway(spec).binary]
    return [str(w) for g in argv_groups(spec) for w in g][1 + len(prefix):]


def _validate(spec: Deployment) -> None:
    g = gateway(spec)
    abs_path(g.python, "topology.gateway.python")
    check_host(g.bind, "topology.gateway.bind")
    check_host(g.host, "topology.gateway.host", wildcard_ok=False)
    for i, r in enumerate(spec.topology.replicas):
        check_host(r.host, f"topology.replicas[{i}].host", wildcard_ok=False)
    for k, v in g.flags.items():
        what = control(str(v), allow_tab=True) if isinstance(v, str) else None
        if what:
            raise SpecError(f"topology.gateway.flags.{k}: contains {what}, which a systemd unit line cannot carry; remove it")
    if spec.systemd.user:
        check_account(spec.systemd.user, "systemd.user")


def unit_name(spec: Deployment) -> str:
    return gateway(spec).unit_name or f"{spec.systemd.unit_name}-gateway"


def _ready_cmd(g: Gateway) -> str:
    """ExecStartPost: the gateway's own /health (it answers before any replica is healthy: the replicas' units
    start on their own hosts, in any order)."""
    host = "127.0.0.1" if g.bind in ("0.0.0.0", "::", "") else g.bind
    url = f"http://{f'[{host}]' if ':' in host else host}:{g.port}/health"
    words = [g.python, "-I", "-c", f"exec({READY_PROBE!r})", url, "24"]
    return " ".join(unitfile.quote_word(w, "topology.gateway.bind") for w in words)


def render_unit(spec: Deployment) -> Rendered:
    """The gateway's unit, checked for its place; `flags` holds the router flags as rendered."""
    _validate(spec)
    g = gateway(spec)
    groups = argv_groups(spec)
    text = TEMPLATES.get_template("gateway.service.j2").render(
        source=comment(Path(spec.source).name) if spec.source else "a spec", name=spec.name,
        binary=g.binary, replicas=len(spec.topology.replicas), user=spec.systemd.user, group=spec.systemd.group,
        env_file=pct(str(spec.resolve_path(spec.serving.env_file))) if spec.serving.env_file and g.api_key_env else None,
        exec_start=exec_start(groups), exec_start_post=_ready_cmd(g), restart_sec=spec.systemd.restart_sec)
    flags: dict[str, Any] = {"policy": g.policy, "worker-urls": [r.url for r in spec.topology.replicas], **g.flags}
    return Rendered(text, [str(w) for grp in groups for w in grp], flags, unit_name(spec), host=g.host, env={})
