"""Replicas behind SGLang's real gateway on CPU: the tiny model's spec with a `topology` section, every process
started from its rendered unit's ExecStart (runbook.service), as systemd would start it.

The gateway's interpreter is `make gateway-env`'s .venv-gateway (smg from the index), or $RUNBOOK_GATEWAY_PYTHON.
Each SGLang replica and the gateway are started in their own session and stopped with it (demo.sglang).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.core import oscalls, paths, ports
from runbook.core.spec import Deployment
from runbook.demo import sglang
from runbook.demo.sglang import EngineError, SGLangServer
from runbook.service import gateway as gw
from runbook.service.render import render

GATEWAY_VENV = ".venv-gateway"
GATEWAY_MAKE_TARGET = "make gateway-env"


def gateway_python() -> Path:
    """The gateway's interpreter: $RUNBOOK_GATEWAY_PYTHON, else the checkout's .venv-gateway."""
    env = os.environ.get("RUNBOOK_GATEWAY_PYTHON")
    py = Path(env) if env else Path(os.path.abspath((paths.repo_root() or Path.cwd()) / GATEWAY_VENV / "bin" / "python"))
    if not py.is_file():
        raise EngineError(f"the gateway's interpreter {py} is missing: `{GATEWAY_MAKE_TARGET}` builds it")
    return py


def deployment(replicas: int = 2, policy: str = "cache_aware", base: Deployment | None = None,
               gateway_flags: dict[str, Any] | None = None) -> Deployment:
    """The demo spec (absolute paths) with `replicas` SGLang replicas and smg in front, each on a free loopback port."""
    dep = base or sglang.deployment(ports.free_port(), flags=sglang.BESIDE_SIBLINGS)   # replicas load together
    reps = [{"name": f"r{i}", "host": "127.0.0.1", "port": ports.free_port()} for i in range(replicas)]
    g = {"python": str(gateway_python()), "host": "127.0.0.1", "bind": "127.0.0.1", "port": ports.free_port(),
         "policy": policy, "prometheus_port": ports.free_port(),   # smg's default 29000 would collide between gateways
         "flags": gateway_flags or {}}
    data = dep.model_dump()
    data["topology"] = {"replicas": reps, "gateway": g}
    return Deployment.model_validate({**data, "source": dep.source})


def replica_spec(dep: Deployment, name: str) -> Deployment:
    """The deployment as one replica serves it: its port is the server's."""
    r = next(r for r in dep.topology.replicas if r.name == name)
    return dep.model_copy(update={"serving": dep.serving.model_copy(update={"port": r.port})})


@dataclass
class Fleet:
    """Replicas and their gateway, started from the rendered units."""
    spec: Deployment
    replicas: dict[str, SGLangServer] = field(default_factory=dict)
    gateway: SGLangServer | None = None

    @property
    def url(self) -> str:
        return self.spec.topology.gateway.url if self.spec.topology.gateway else ""

    def stop(self) -> None:
        """The gateway first (no request reaches a replica going down), then every replica at once: each stop is
        mostly waiting for SGLang's processes to exit."""
        if self.gateway is not None:
            self.gateway.stop()
        with ThreadPoolExecutor(max(1, len(self.replicas))) as pool:
            list(pool.map(lambda srv: srv.stop(), self.replicas.values()))


def start_replicas(dep: Deployment, log_dir: Path, names: Sequence[str] | None = None,
                   ready_timeout: float = 300.0) -> dict[str, SGLangServer]:
    """Each replica from its rendered unit's argv and Environment=, launched together, then waited for."""
    units = {str(u.replica): u for u in render(dep)}
    started: dict[str, SGLangServer] = {}
    try:
        for name in names or list(units):
            u = units[name]
            started[name] = sglang.launch(replica_spec(dep, name), argv=u.argv, env=u.env,
                                          log_path=log_dir / f"replica-{name}.log")
        for srv in started.values():
            sglang.wait_ready(srv, ready_timeout)
    except BaseException:
        for srv in started.values():
            srv.stop()
        raise
    return started


def start_gateway(dep: Deployment, log_path: Path | None = None, ready_timeout: float = 60.0,
                  healthy: int | None = None) -> SGLangServer:
    """The gateway from its rendered unit's argv; ready when /readiness answers 200 and `healthy` workers (default:
    every replica) are healthy in its own /workers view."""
    unit = gw.render_unit(dep)
    g = gw.gateway(dep)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="smg-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    with open(log_path, "w") as logf:   # SIGKILLed by the kernel if this process dies, as the replicas are stopped
        child = oscalls.SessionChild(unit.argv[0], unit.argv, logf.fileno(), env)
    srv = SGLangServer(child, g.url, g.port, unit.argv, Path(), log_path, dep, launched=time.monotonic())
    want = len(dep.topology.replicas) if healthy is None else healthy
    try:
        _wait_workers(srv, want, ready_timeout)
    except BaseException:
        srv.stop()
        raise
    return srv


def workers(url: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The gateway's own view of its workers (GET /workers)."""
    with urllib.request.urlopen(url + "/workers", timeout=timeout) as r:
        return list(json.load(r).get("workers") or [])


def _wait_workers(srv: SGLangServer, want: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        how = srv.child.exited()    # not Popen.poll: stop() then still kills what is left of its group
        if how is not None:
            raise EngineError(f"the gateway {how} during start-up ({srv.log}): {sglang.log_tail(srv.log)}")
        try:
            if sum(1 for w in workers(srv.url) if w.get("is_healthy")) >= want:
                srv.startup_s = time.monotonic() - srv.launched
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise EngineError(f"the gateway did not see {want} healthy workers within {timeout:.0f} s ({srv.log}): "
                      f"{sglang.log_tail(srv.log)}")


def start(dep: Deployment, log_dir: Path) -> Fleet:
    """Every replica, then the gateway in front of them."""
    fleet = Fleet(dep)
    fleet.replicas = start_replicas(dep, log_dir)
    try:
        fleet.gateway = start_gateway(dep, log_dir / "gateway.log")
    except BaseException:
        fleet.stop()
        raise
    return fleet


def launch(log_dir: Path, replicas: int = 2, policy: str = "cache_aware") -> Fleet:
    """A fleet on free ports (`deployment`), started (`start`). A replica whose port another process took during its
    start-up relaunches the fleet on other free ports (core/ports.py `relaunching`), as tune does its candidates."""
    def attempt(_port: int) -> Fleet:
        return start(deployment(replicas, policy=policy), log_dir)

    fleet, _ = ports.relaunching(attempt, ports.free_port(), failed_log=sglang.exited_log)
    return fleet


def with_policy(dep: Deployment, policy: str) -> Deployment:
    """The spec with its gateway's policy changed (everything else, ports included, the same)."""
    g = dep.topology.gateway
    if g is None:
        raise EngineError("the spec declares no gateway")
    topo = dep.topology.model_copy(update={"gateway": g.model_copy(update={"policy": policy})})
    return dep.model_copy(update={"topology": topo})


def relauncher(fleet: Fleet, log_dir: Path) -> Callable[[str], None]:
    """`relaunch(policy)` for bench.policies.compare: stops the fleet's gateway and starts it again on the same port
    with that policy, from its re-rendered unit; the replicas keep running."""
    def relaunch(policy: str) -> None:
        if fleet.gateway is not None:
            fleet.gateway.stop()
            fleet.gateway = None
        fleet.spec = with_policy(fleet.spec, policy)
        fleet.gateway = start_gateway(fleet.spec, log_dir / f"gateway-{policy}.log")
    return relaunch
