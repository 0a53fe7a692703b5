"""One module per server engine tune can launch: its launch command, readiness path, start-up log
reading and what the pre-check can know before anything starts. SGLang is the default and the one the
pre-check models fully (its own parser, the KV plan); llama-server is the CPU engine of tests and demos; `gateway`
relaunches only SGLang's gateway in front of the running replicas (a deployment with topology.gateway: its policies)."""
from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from runbook.core import secrets
from runbook.core.spec import Deployment


def expand_unit_argv(spec: Deployment, words: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """A unit's ExecStart with its ${VAR} words filled from serving.env, serving.env_file and this environment, as
    systemd would expand them (the API key), and the environment the unit sets. A variable set nowhere drops its
    flag with it: an empty --api-key would be a key."""
    env = dict(spec.serving.env)
    if spec.serving.env_file and Path(spec.resolve_path(spec.serving.env_file)).is_file():
        env.update(secrets.read_env_file(spec.resolve_path(spec.serving.env_file)))
    argv: list[str] = []
    for w in words:
        m = re.fullmatch(r"\$\{(\w+)\}", w)
        if not m:
            argv.append(w)
        elif env.get(m.group(1)) or os.environ.get(m.group(1)):
            argv.append(env.get(m.group(1)) or os.environ[m.group(1)])
        else:
            argv.pop()
    return argv, env


@dataclass
class PreCheck:
    """What is known of a candidate before it is launched."""
    status: Literal["ok", "skipped"]
    reason: str = ""                                   # one line: why skipped (the parser's or the plan's words)
    details: list[dict[str, Any]] = field(default_factory=list)   # the checks' own findings (service.*, kv.*), as dicts
    predicted: dict[str, Any] = field(default_factory=dict)   # max_total_num_tokens, max_running_requests, ...
    argv: list[str] = field(default_factory=list)      # the launch command (secrets as ${VAR})
    unit_text: str | None = None                       # the unit service.build renders for it (SGLang)


@dataclass
class Startup:
    """The start-up log read against the prediction."""
    observed: dict[str, Any] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)     # the log reader's findings, as dicts
    failure: str | None = None                         # one line with the remedy when the log says why it failed


class Engine(Protocol):
    name: str
    stop_signal: int | None     # how a candidate is asked to stop: None, SIGTERM to all its processes (launch.Launch)

    def precheck(self, spec: Deployment, longest: int, buckets: list[int]) -> PreCheck: ...

    def precheck_many(self, specs: list[Deployment], longest: int, buckets: list[int]) -> list[PreCheck]:
        """precheck of each, in order; together where that is cheaper (SGLang: one parser run per interpreter)."""
        ...

    def launch_env(self, spec: Deployment) -> tuple[list[str], dict[str, str]]:
        """(argv with secrets filled in, extra environment) for the launch."""
        ...

    def ready_path(self, spec: Deployment) -> str: ...

    def startup(self, spec: Deployment, log_path: Any, pre: PreCheck) -> Startup: ...

    def live(self, spec: Deployment, url: str) -> dict[str, Any]:
        """What the running server reports about itself (SGLang: /server_info's version, pool and memory), {} if
        nothing; never raises."""
        ...

    def production(self, spec: Deployment) -> tuple[str | None, str | None]:
        """The production unit a launch displaces (stopped only with --yes, always restored) and the URL that answers
        200 once it is back."""
        ...

    def placed(self, spec: Deployment) -> Deployment:
        """The candidate's spec as it is launched (the gateway: on free ports, never production's)."""
        ...

    def address(self, spec: Deployment) -> tuple[str, int]:
        """Where the launched candidate listens: (host, port)."""
        ...

    def prepare(self, spec: Deployment, url: str) -> dict[str, Any]:
        """Once the candidate is ready, before it is measured: what the measurement needs (the gateway: every replica
        healthy in its view, the replicas' prefix caches emptied); its record, {} when nothing was done. A
        `launch.LaunchFailed` when the candidate cannot be measured."""
        ...


class Server:
    """The defaults of an engine that launches the server itself, on the deployment's own port (SGLang, llama-server)."""

    def production(self, spec: Deployment) -> tuple[str | None, str | None]:
        return spec.systemd.unit_name, spec.serving.local_url + spec.systemd.ready_path

    def placed(self, spec: Deployment) -> Deployment:
        return spec

    def address(self, spec: Deployment) -> tuple[str, int]:
        return spec.serving.host, spec.serving.port

    def prepare(self, spec: Deployment, url: str) -> dict[str, Any]:
        return {}


def get(name: str) -> Engine:
    mod = importlib.import_module(f"runbook.tune.engines.{'llama' if name == 'llama-server' else name}")
    return mod.ENGINE


def for_spec(spec: Deployment) -> Engine:
    """The engine tune launches for this spec: the gateway where one is declared, else `tune.engine`."""
    return get("gateway" if spec.topology.gateway is not None else spec.tune.engine)
