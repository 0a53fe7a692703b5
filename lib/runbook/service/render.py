"""The one way to build the unit: spec + what-if flags + recommendations -> one unit per node.

Render, check, diff, install and drift all call `build` (or `render` with the same inputs), so the
unit they talk about is the unit `install` writes.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from runbook import quant
from runbook.core.errors import InputError, SpecError
from runbook.core.secrets import is_secret_key
from runbook.core.spec import Deployment, Node
from runbook.service import unitfile

TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("runbook.service", "templates"), keep_trailing_newline=True,
                          trim_blocks=False, lstrip_blocks=False, autoescape=False)
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd's User=/Group= accept POSIX-portable names (and numeric ids); anything else is refused.
_ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
# Control characters (C0, DEL, C1) and Unicode line separators: never in a name or path. A quoted
# ExecStart word or Environment= value may hold a tab (and U+2028/9: systemd splits lines on \n only).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROL_NAMES = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte", "\t": "a tab"}


class EnvRef(str):
    """An ExecStart word the renderer itself writes as ${VAR} for systemd to expand (the API key)."""


def control(value: str, allow_tab: bool = False) -> str | None:
    m = (_CONTROL_BUT_TAB if allow_tab else _CONTROL).search(value)
    if not m:
        return None
    return _CONTROL_NAMES.get(m.group(), f"a control character ({m.group()!r})")


def _no_control(value: str, field: str, fix: str, allow_tab: bool = False) -> None:
    what = control(value, allow_tab)
    if what:
        raise SpecError(f"{field}: contains {what}, which a systemd unit line cannot carry; {fix}")


def check_account(value: str, field: str) -> None:
    _no_control(value, field, "use a POSIX user/group name (letters, digits, _ . -) or a numeric id")
    if not _ACCOUNT.fullmatch(value):
        raise SpecError(f"{field}: {value!r} is not a valid user/group name; use a POSIX name "
                        "(letters, digits, _ . -, not starting with a digit or -, at most 32 characters) or a numeric id")


def abs_path(value: str, field: str) -> None:
    _no_control(value, field, "use an absolute path without control characters")
    if not value.startswith("/") or value != value.strip() or "\\" in value:
        raise SpecError(f"{field}: {value!r} is not a plain absolute path; use an absolute path (starting with /, "
                        "no backslash, no leading or trailing spaces, no control characters)")


def _is_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def check_host(value: str, field: str, wildcard_ok: bool = True) -> None:
    if wildcard_ok and value == "":
        return
    if not _is_host(value):
        raise SpecError(f"{field}: {value!r} is not a host name or IP address; use a hostname "
                        "(letters, digits, - and .) or an IPv4/IPv6 literal without brackets or port")


def pct(value: str) -> str:
    """A directive value with systemd specifiers disabled (% -> %%)."""
    return value.replace("%", "%%")


def _flag_source(name: str, spec: Deployment, args: dict[str, Any] | None) -> str:
    if args and name in args:
        return f"--arg {name}"
    if name in spec.serving.flags:
        return f"serving.flags.{name}"
    return f"recommended flag {name}"


def _validate(spec: Deployment, args: dict[str, Any] | None, flags: dict[str, Any]) -> None:
    """Every spec value that lands in a unit directive, checked for that directive (one SpecError line)."""
    _validate_places(spec)
    _validate_flags(spec, args, flags)
    _validate_env(spec.serving.env)
    for i, node in enumerate(spec.parallelism.nodes):
        _validate_env(node.env, f"parallelism.nodes[{i}].env")


def _validate_places(spec: Deployment) -> None:
    """Accounts, paths, hosts and names the unit's directives and command line carry."""
    sd, s = spec.systemd, spec.serving
    for field, v in (("systemd.user", sd.user), ("systemd.group", sd.group)):
        if v:
            check_account(v, field)
    if sd.working_directory:
        abs_path(sd.working_directory, "systemd.working_directory")
    if s.env_file:
        abs_path(str(spec.resolve_path(s.env_file)), "serving.env_file")
    abs_path(s.python, "serving.python")
    check_host(s.host, "serving.host")
    for i, node in enumerate(spec.parallelism.nodes):
        check_host(node.address, f"parallelism.nodes[{i}].address", wildcard_ok=False)
    _no_control(spec.model.path, "model.path", "remove it")
    if spec.model.served_name is not None:
        _no_control(spec.model.served_name, "model.served_name", "remove it")
    if s.api_key_env is not None and not _ENV_NAME.fullmatch(s.api_key_env):
        raise SpecError(f"serving.api_key_env: {s.api_key_env!r} is not an environment variable name "
                        "(letters, digits, _; not starting with a digit)")


def _validate_flags(spec: Deployment, args: dict[str, Any] | None, flags: dict[str, Any]) -> None:
    """No secret among the spec's flags; every flag name and value fits on an ExecStart line."""
    for k in spec.serving.flags:
        if is_secret_key(k):
            raise SpecError(f"serving.flags.{k}: secrets belong in serving.env_file (referenced through "
                            "serving.api_key_env), not in the unit; remove the flag from the spec")
    for k, v in flags.items():
        where = _flag_source(k, spec, args)
        if not _FLAG.fullmatch(k):
            raise SpecError(f"{where}: flag names are lower-case letters, digits and hyphens (e.g. kv-cache-dtype)")
        for item in (v if isinstance(v, (list, tuple)) else [v]):
            what = control(str(item), allow_tab=True) if isinstance(item, str) else None
            if what:
                raise SpecError(f"--{k}: contains {what}, which a systemd unit line cannot carry; remove it from {where}")


def _validate_env(env: dict[str, str], where: str = "serving.env") -> None:
    """Environment= names and values a unit line can carry."""
    for k, v in env.items():
        if not _ENV_NAME.fullmatch(k):
            raise SpecError(f"{where}.{k}: not a valid environment variable name")
        what = control(v, allow_tab=True)
        if what:
            raise SpecError(f"environment variable {k}: contains {what}, which a systemd unit line cannot carry; "
                            f"remove it from {where}.{k}")


@dataclass
class Rendered:
    text: str
    argv: list[str]                 # ExecStart as a list; ${VAR} kept literally for systemd to expand
    flags: dict[str, Any]           # the SGLang flags after what-ifs and recommendations
    unit_name: str
    node: str | None = None
    rank: int = 0
    replica: str | None = None      # topology.replicas[].name
    host: str | None = None         # the machine the unit is installed on (a replica's or the gateway's host)
    env: dict[str, str] | None = None   # Environment= the unit sets, as the server gets it
    role: str = "server"                # "gateway" for the gateway's unit (service.gateway.render_unit)



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


def effective_flags(spec: Deployment, args: dict[str, Any] | None = None,
                    recommended: dict[str, str] | None = None) -> dict[str, Any]:
    flags = dict(spec.serving.flags)
    if spec.serving.apply_recommended and recommended:
        for k, v in recommended.items():
            if flags.get(k) in (None, "auto"):
                flags[k] = v
    flags.update(args or {})
    return flags


def _argv(spec: Deployment, flags: dict[str, Any], rank: int = 0, port: int | None = None) -> list[tuple[str, ...]]:
    """Groups of words (one group per flag) for ExecStart, in a stable, readable order. `port`: a replica's."""
    s, par = spec.serving, spec.parallelism
    groups: list[tuple[str, ...]] = [(s.python, "-m", "sglang.launch_server"), ("--model-path", spec.model.path)]
    if spec.model.served_name:
        groups.append(("--served-model-name", spec.model.served_name))
    port = port or (par.nodes[rank].port if par.nodes else None) or s.port     # a replica's; a rank sharing a host needs its own
    groups += [("--host", s.host), ("--port", str(port)), ("--tp-size", str(par.tp))]
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
        groups.append(("--api-key", EnvRef("${" + s.api_key_env + "}")))
    return groups


def exec_start(groups: list[tuple[str, ...]]) -> str:
    lines = []
    for g in groups:
        words = []
        for w in g:
            # Only the renderer's own ${VAR} reference is left for systemd to expand; a `$` in any
            # spec or --arg value is written `$$` so the server gets it literally.
            expand = isinstance(w, EnvRef)
            words.append(unitfile.quote_word(w, g[0] if g[0].startswith("--") else "ExecStart", expand))
        lines.append(" ".join(words))
    return " \\\n    ".join(lines)


def _ready_url(spec: Deployment, port: int | None = None) -> str:
    host, port = spec.serving.host, port or spec.serving.port
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal in a URL
    return f"http://{host}:{port}{spec.systemd.ready_path}"


# GET URL until it answers 2xx, at most N tries 5 s apart. The serving interpreter runs it (curl's
# --retry-all-errors needs curl >= 7.71, which Ubuntu 20.04 and RHEL 8 lack); no shell, values as argv.
READY_PROBE = ("import sys,time,urllib.request as u\nfor i in range(int(sys.argv[2])):\n try:\n"
                "  u.urlopen(sys.argv[1],timeout=5).close();sys.exit(0)\n except Exception:\n  time.sleep(5)\nsys.exit(1)")


def _ready_argv(spec: Deployment, port: int | None = None) -> list[str]:
    """The readiness check: the serving interpreter, no shell. As many tries, 5 s apart, as TimeoutStartSec allows."""
    tries = max(1, spec.systemd.timeout_start_sec // 5)
    return [spec.serving.python, "-I", "-c", f"exec({READY_PROBE!r})", _ready_url(spec, port), str(tries)]


def _ready_cmd(spec: Deployment, port: int | None = None) -> str:
    return " ".join(unitfile.quote_word(w, "serving.host") for w in _ready_argv(spec, port))


def comment(value: str) -> str:
    """A value shown in a # comment line: control characters escaped, so it stays one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], value)


def render(spec: Deployment, args: dict[str, Any] | None = None, recommended: dict[str, str] | None = None) -> list[Rendered]:
    """One unit per node, or per replica (one unit when the spec names neither); the gateway's is gateway.render."""
    flags = effective_flags(spec, args, recommended)
    _validate(spec, args, flags)
    if spec.topology.replicas:
        return [_replica_unit(spec, flags, r) for r in spec.topology.replicas]
    nodes: Sequence[Node | None] = spec.parallelism.nodes or [None]
    out = []
    for rank, node in enumerate(nodes):
        name = spec.systemd.unit_name + (f"-{node.name}" if node and len(nodes) > 1 else "")
        about = {"name": node.name, "rank": rank, "count": len(nodes)} if node else None
        env = {**spec.serving.env, **(node.env if node else {})}     # a rank's own over the server's
        out.append(_unit(spec, _argv(spec, flags, rank), env, name, about, _ready_cmd(spec, node.port if node else None), flags,
                         node=node.name if node else None, rank=rank, host=node.address if node else None))
    return out


def _replica_unit(spec: Deployment, flags: dict[str, Any], r: Any) -> Rendered:
    """A replica's unit: the one server's flags on the replica's port, its GPUs only (CUDA_VISIBLE_DEVICES)."""
    env = dict(spec.serving.env)
    if r.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, r.gpus))
    check_host(r.host, f"topology.replicas[{spec.topology.replicas.index(r)}].host", wildcard_ok=False)
    return _unit(spec, _argv(spec, flags, port=r.port), env, f"{spec.systemd.unit_name}-{r.name}",
                 {"replica": r.name, "host": r.host}, _ready_cmd(spec, r.port), flags, replica=r.name, host=r.host)


def _unit(spec: Deployment, groups: list[tuple[str, ...]], env: dict[str, str], name: str, about: dict | None,
          ready: str, flags: dict[str, Any], **where: Any) -> Rendered:
    text = TEMPLATES.get_template("sglang.service.j2").render(
        source=comment(Path(spec.source).name) if spec.source else "a spec", name=spec.name, node=about,
        user=spec.systemd.user, group=spec.systemd.group,
        workdir=pct(spec.systemd.working_directory) if spec.systemd.working_directory else None,
        environment=[unitfile.quote_assignment(k, v) for k, v in env.items()],
        env_file=pct(str(spec.resolve_path(spec.serving.env_file))) if spec.serving.env_file else None,
        exec_start=exec_start(groups), exec_start_post=ready, restart_sec=spec.systemd.restart_sec,
        timeout_start_sec=spec.systemd.timeout_start_sec)
    return Rendered(text, [str(w) for g in groups for w in g], flags, name, env=env, **where)


def recommended_flags(spec: Deployment) -> tuple[dict[str, str] | None, Any]:
    """The quant notebook's recommendations (None when the checkpoint cannot be read)."""
    try:
        rep = quant.assess(spec)
    except InputError:
        return None, None
    return rep.recommended_flags, rep


@dataclass
class Build:
    """The units for one spec + what-ifs, and the quant report the recommendations came from."""
    units: list[Rendered]
    recommended: dict[str, str] | None   # None when the checkpoint could not be read
    quant: Any = None                       # runbook.quant's report, reused by check (read once)

    @property
    def unit(self) -> Rendered:
        return self.units[0]


def build(spec: Deployment, args: dict[str, Any] | None = None, with_quant: bool = False) -> Build:
    """The one unit builder: render, check, diff, install and drift all call this.

    The checkpoint is read (once) when the spec applies recommendations or the caller needs the
    quant report (check's cross-checks)."""
    rec, qrep = recommended_flags(spec) if (spec.serving.apply_recommended or with_quant) else (None, None)
    return Build(render(spec, args, rec), rec, qrep)
