"""The one way to build the unit: spec + what-if flags + recommendations -> one unit per node.

Render, check, diff, install and drift all call `build` (or `render` with the same inputs), so the
unit they talk about is the unit `install` writes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import jinja2

from runbook.core.errors import InputError, SpecError
from runbook.core.secrets import is_secret_key
from runbook.core.spec import Deployment, Node
from runbook.service import unitfile

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("runbook.service", "templates"), keep_trailing_newline=True,
                          trim_blocks=False, lstrip_blocks=False, autoescape=False)
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass
class Rendered:
    text: str
    argv: list[str]                 # ExecStart as a list; ${VAR} kept literally for systemd to expand
    flags: dict[str, Any]           # the SGLang flags after what-ifs and recommendations
    unit_name: str
    node: Optional[str] = None
    rank: int = 0



def parse_args(pairs: Sequence[str]) -> dict[str, Any]:
    """--arg NAME=VALUE (or NAME for a switch; NAME=false removes a switch)."""
    out: dict[str, Any] = {}
    for p in pairs:
        name, _, value = p.partition("=")
        name = name.strip().lstrip("-")
        if not _FLAG.match(name):
            raise SpecError(f"--arg {p!r}: expected NAME=VALUE with NAME like kv-cache-dtype")
        if is_secret_key(name):
            raise SpecError(f"--arg {name}: secrets belong in serving.env_file, not on the command line")
        out[name] = True if not _ else (False if value.lower() == "false" else value)
    return out


def effective_flags(spec: Deployment, args: Optional[dict[str, Any]] = None,
                    recommended: Optional[dict[str, str]] = None) -> dict[str, Any]:
    flags = dict(spec.serving.flags)
    if spec.serving.apply_recommended and recommended:
        for k, v in recommended.items():
            if flags.get(k) in (None, "auto"):
                flags[k] = v
    flags.update(args or {})
    return flags


def _argv(spec: Deployment, flags: dict[str, Any], rank: int = 0) -> list[tuple[str, ...]]:
    """Groups of words (one group per flag) for ExecStart, in a stable, readable order."""
    s, par = spec.serving, spec.parallelism
    groups: list[tuple[str, ...]] = [(s.python, "-m", "sglang.launch_server"), ("--model-path", spec.model.path)]
    if spec.model.served_name:
        groups.append(("--served-model-name", spec.model.served_name))
    groups += [("--host", s.host), ("--port", str(s.port)), ("--tp-size", str(par.tp))]
    if par.pp > 1:
        groups.append(("--pp-size", str(par.pp)))
    if par.attn_dp > 1:
        groups += [("--dp-size", str(par.attn_dp)), ("--enable-dp-attention",)]
    if par.nodes:
        groups += [("--nnodes", str(len(par.nodes))), ("--node-rank", str(rank)),
                   ("--dist-init-addr", f"{par.nodes[0].address}:{par.dist_init_port}")]
    for k, v in flags.items():
        if v is True:
            groups.append((f"--{k}",))
        elif v is False or v is None:
            continue
        elif isinstance(v, (list, tuple)):
            groups.append((f"--{k}", *map(str, v)))
        else:
            groups.append((f"--{k}", str(v)))
    if s.api_key_env:
        groups.append(("--api-key", "${" + s.api_key_env + "}"))
    return groups


def _exec_start(groups: list[tuple[str, ...]]) -> str:
    lines = []
    for g in groups:
        words = []
        for w in g:
            expand = bool(re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", w))
            words.append(unitfile.quote_word(w, g[0] if g[0].startswith("--") else "ExecStart", expand))
        lines.append(" ".join(words))
    return " \\\n    ".join(lines)


def _ready_cmd(spec: Deployment) -> str:
    url = spec.serving.local_url + spec.systemd.ready_path
    tries = max(1, spec.systemd.timeout_start_sec // 5)
    # $$ is a literal $ for systemd; the shell then sees $i.
    return (f"/bin/sh -c 'i=0; until curl -sf -o /dev/null {url}; do i=$$((i+1)); "
            f"[ $$i -ge {tries} ] && exit 1; sleep 5; done'")


def render(spec: Deployment, args: Optional[dict[str, Any]] = None, recommended: Optional[dict[str, str]] = None) -> list[Rendered]:
    """One unit per node (one unit when the spec names no nodes)."""
    flags = effective_flags(spec, args, recommended)
    nodes: Sequence[Optional[Node]] = spec.parallelism.nodes or [None]
    out = []
    for rank, node in enumerate(nodes):
        groups = _argv(spec, flags, rank)
        env_lines = [unitfile.quote_assignment(k, v) for k, v in spec.serving.env.items()]
        for k in spec.serving.env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise SpecError(f"serving.env.{k}: not a valid environment variable name")
        name = spec.systemd.unit_name + (f"-{node.name}" if node and len(nodes) > 1 else "")
        text = _ENV.get_template("sglang.service.j2").render(
            source=Path(spec.source).name if spec.source else "a spec", name=spec.name,
            node={"name": node.name, "rank": rank, "count": len(nodes)} if node else None,
            user=spec.systemd.user, group=spec.systemd.group, workdir=spec.systemd.working_directory,
            environment=env_lines, env_file=spec.serving.env_file, exec_start=_exec_start(groups),
            exec_start_post=_ready_cmd(spec), restart_sec=spec.systemd.restart_sec,
            timeout_start_sec=spec.systemd.timeout_start_sec)
        out.append(Rendered(text, [w for g in groups for w in g], flags, name, node.name if node else None, rank))
    return out


def recommended_flags(spec: Deployment) -> tuple[Optional[dict[str, str]], Any]:
    """The quant notebook's recommendations (None when the checkpoint cannot be read)."""
    from runbook import quant

    try:
        rep = quant.for_deployment(spec)
    except InputError:
        return None, None
    return rep.recommended_flags, rep


@dataclass
class Build:
    """The units for one spec + what-ifs, and the quant report the recommendations came from."""
    units: list[Rendered]
    recommended: Optional[dict[str, str]]   # None when the checkpoint could not be read
    quant: Any = None                       # runbook.quant's report, reused by check (read once)

    @property
    def unit(self) -> Rendered:
        return self.units[0]


def build(spec: Deployment, args: Optional[dict[str, Any]] = None, with_quant: bool = False) -> Build:
    """The one unit builder: render, check, diff, install and drift all call this.

    The checkpoint is read (once) when the spec applies recommendations or the caller needs the
    quant report (check's cross-checks)."""
    rec, qrep = recommended_flags(spec) if (spec.serving.apply_recommended or with_quant) else (None, None)
    return Build(render(spec, args, rec), rec, qrep)
