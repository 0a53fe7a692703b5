"""The gateway's unit: SGLang's gateway (smg, or the older sglang-router) in front of the spec's replicas.

Its command line comes from `topology.gateway` and `topology.replicas` only: the replicas' URLs, the policy, the
ports. Validated for its place like the server's (py) and by the gateway's own argument parser
(check.gateway_parser) where its interpreter is on this machine.
"""
from __future__ import annotations

import difflib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runbook.core import paths
from runbook.core.errors import SpecError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.core.topospec import GATEWAYS, OWNED_GATEWAY_FLAGS, Gateway
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
    return Rendered(text, [str(w) for grp in groups for w in grp], flags, unit_name(spec), host=g.host, env={}, role="gateway")


PROBE = Path(__file__).with_name("gateway_probe.py")
GATEWAY_PYTHON_ENV = "RUNBOOK_GATEWAY_PYTHON"


def gateway_python(spec: Deployment) -> tuple[str | None, list[Finding]]:
    """The interpreter whose gateway wheel parses the flags: topology.gateway.python where it exists here, else
    $RUNBOOK_GATEWAY_PYTHON, else the checkout's .venv-gateway (`make gateway-env`); None and a skip when none is."""
    py = gateway(spec).python
    if os.path.isfile(py) and os.access(py, os.X_OK):
        return py, []
    root = paths.repo_root()
    for alt, how in ((os.environ.get(GATEWAY_PYTHON_ENV), f"${GATEWAY_PYTHON_ENV}"),
                     (str(root / ".venv-gateway" / "bin" / "python") if root else None, "the checkout's .venv-gateway")):
        if alt and os.path.isfile(alt):
            return alt, [Finding("service.gateway.parser_env", "info", f"gateway flags validated with {how}",
                                 detail=f"{py} (topology.gateway.python) is not on this machine; {alt} has the same "
                                        "parser only if its gateway version matches.", evidence=alt)]
    return None, [Finding("service.gateway.parser", "skip", "gateway flags not validated: no gateway interpreter here",
                          detail=f"{py} (topology.gateway.python) is not on this machine and ${GATEWAY_PYTHON_ENV} is unset.",
                          remedy="Run on the gateway's host, or `make gateway-env` to build the pinned gateway wheel's environment.")]


def _field(flag: str | None, g: Gateway) -> str:
    """The spec field a gateway flag comes from."""
    name = (flag or "").lstrip("-")
    if name in g.flags:
        return f"topology.gateway.flags.{name}"
    return OWNED_GATEWAY_FLAGS.get(name, "topology.gateway").split(" ")[0]


def probe_argv(args: list[str]) -> list[str]:
    """The renderer's own --api-key ${VAR} is hidden; everything else is what the gateway gets."""
    return [("REDACTED" if i and args[i - 1] == "--api-key" else w) for i, w in enumerate(args)]


def run_parser(spec: Deployment, argvs: list[list[str]], python: str,
               run: Callable = subprocess.run) -> list[dict[str, Any]] | Finding:
    """The gateway's own parser on each argv (one run of its interpreter), or the fail finding that says why not."""
    module = GATEWAYS[gateway(spec).binary][1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # the gateway's packages, not the runbook's
    cp = run([python, "-I", str(PROBE), module, json.dumps(argvs)], capture_output=True, text=True, timeout=120, env=env)
    try:
        res = json.loads(cp.stdout.strip().splitlines()[-1])
        if isinstance(res, list) and len(res) == len(argvs):
            return res
    except (IndexError, ValueError):
        pass
    tail = (cp.stderr or "").strip().splitlines()[-1:] or ["no output"]
    return Finding("service.gateway.parser", "fail", "could not run the gateway's argument parser", evidence=tail[0],
                   remedy=f"Check that `{python} -c 'import {module}'` works (topology.gateway.binary: {gateway(spec).binary}).")


def parser_findings(spec: Deployment, res: dict[str, Any], where: str = "") -> list[Finding]:
    """One pass, or one fail per refused flag naming the spec field it came from."""
    g = gateway(spec)
    ver = f"{g.binary} {res.get('version') or ''}".strip()
    if res.get("ok"):
        return [Finding("service.gateway.parser", "pass", f"{ver}'s own parser accepts the gateway's flags{where}")]
    known = res.get("known_flags") or []
    out = []
    for e in res.get("errors") or [{"flag": None, "error": res.get("error", "")}]:
        flag = e.get("flag")
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag and flag not in known else []
        field = _field(flag, g)
        out.append(Finding(f"service.gateway.flag.{(flag or 'argv').lstrip('-')}", "fail",
                           f"{field}: {'not a flag of' if flag and flag not in known else 'refused by'} {ver}{where}",
                           detail=str(e.get("error", "")),
                           remedy=f"Did you mean {close[0]}? Fix {field}." if close else f"Fix or remove {field}."))
    return out


def check_gateway(spec: Deployment, unit: Rendered, run: Callable = subprocess.run) -> list[Finding]:
    """The rendered gateway flags through the gateway's own parser (`smg launch`'s parse_router_args)."""
    python, findings = gateway_python(spec)
    if python is None:
        return findings
    res = run_parser(spec, [probe_argv(router_args_of(spec, unit.argv))], python, run)
    if isinstance(res, Finding):
        return findings + [res]
    return findings + parser_findings(spec, res[0], " (its unit)")


def router_args_of(spec: Deployment, argv: list[str]) -> list[str]:
    """The router flags of a gateway argv: the words after its interpreter and module."""
    prefix, _ = GATEWAYS[gateway(spec).binary]
    return argv[1 + len(prefix):]
