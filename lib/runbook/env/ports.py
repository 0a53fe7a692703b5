"""The deployment's own ports on this host: free, held by the deployment's server, or held by another process.

Production's port is the spec's (serving.port; each replica's port; the gateway's) and is never moved: when
another process holds one, the server cannot bind it when its start-up ends, and the finding names that
process (pid, command line; core/ports.holders). A holder is the deployment's own server when it runs in the
spec's systemd unit (its cgroup: `<unit_name>…​.service`) or its command line is the rendered unit's ExecStart
(`${VAR}` words match any value).
"""
from __future__ import annotations

import re
import socket
from pathlib import Path

import psutil

from runbook.core import ports
from runbook.core.errors import InputError, SpecError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment

LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::", "")


def _local(host: str) -> bool:
    """`host` is this machine: loopback, a wildcard, its name, or one of its interfaces' addresses."""
    if host in LOOPBACK or host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return any(a.address == host for addrs in psutil.net_if_addrs().values() for a in addrs)
    except OSError:
        return False


def declared(spec: Deployment) -> list[tuple[str, str, int]]:
    """(what, field, port) of every port the deployment listens on at this host."""
    out: list[tuple[str, str, int]] = []
    reps = spec.topology.replicas
    if reps:
        out += [(f"replica {r.name}", f"topology.replicas[{i}].port", r.port) for i, r in enumerate(reps) if _local(r.host)]
    else:
        out.append((f"server {spec.name}", "serving.port", spec.serving.port))
    gw = spec.topology.gateway
    if gw is not None and _local(gw.host):
        out.append(("gateway", "topology.gateway.port", gw.port))
    return out


def _rendered_argv(spec: Deployment) -> list[str] | None:
    from runbook.service import build  # lazy: the unit renderer only when a port is held

    try:
        return list(build(spec).unit.argv)
    except (InputError, SpecError):
        return None


def _ours(pid: int | None, spec: Deployment, argv: list[str] | None) -> bool:
    if pid is None:
        return False
    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        cgroup = ""
    unit = re.escape(spec.systemd.unit_name)
    if re.search(rf"/{unit}(-[A-Za-z0-9._-]+)?\.service(/|$)", cgroup, re.M):
        return True
    try:
        got = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return False
    return argv is not None and len(got) == len(argv) and all(
        w == g or re.fullmatch(r"\$\{\w+\}", w) is not None for w, g in zip(argv, got, strict=True))


def check(spec: Deployment) -> list[Finding]:
    """`env.host.port`, one per declared port: pass when free or held by the deployment's server, fail naming the
    holding process otherwise."""
    out: list[Finding] = []
    argv: list[str] | None = None
    for what, fld, port in declared(spec):
        held = ports.holders(port)
        if not held:
            out.append(Finding("env.host.port", "pass", f"{what}: port {port} is free ({fld})"))
            continue
        argv = argv if argv is not None else _rendered_argv(spec)
        others = [h for h in held if not _ours(h.pid, spec, argv)]
        if not others:
            pids = ", ".join(str(h.pid) for h in held)
            out.append(Finding("env.host.port", "pass", f"{what}: port {port} is held by the deployment's own server "
                                                         f"(pid {pids})"))
            continue
        out.append(Finding("env.host.port", "fail", f"{what}: port {port} ({fld}) is held by {others[0].text()}",
                           detail="; ".join(f"{h.text()}: {h.state}" for h in others),
                           remedy=f"Stop that process, or give {fld} another port: the server binds it only when its "
                                  "start-up ends and dies with 'address already in use'."))
    return out
