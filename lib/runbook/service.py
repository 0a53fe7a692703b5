"""The deployment as a systemd unit: render, check, diff, install (opt-in) and drift.

render: spec (+ --arg what-ifs, + the quant notebook's recommended flags when the spec opts in)
  -> one unit per node, quoted per systemd's rules.
check: SGLang's own parser (run by the serving interpreter on the exact argv), `systemd-analyze
  verify`, and cross-checks against the quant and KV findings.
diff / install / drift: against the installed unit and the running server.
"""
from __future__ import annotations

import datetime as dt
import difflib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jinja2

from . import unitfile
from .errors import InputError, SpecError
from .findings import Finding
from .fsutil import atomic_write_text
from .secrets import MASK, is_secret_key
from .spec import Deployment

PROBE = Path(__file__).with_name("probes") / "sglang_args.py"
_ENV = jinja2.Environment(loader=jinja2.PackageLoader("runbook", "templates"), keep_trailing_newline=True,
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


# ---- render ------------------------------------------------------------------------------------

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
    nodes = spec.parallelism.nodes or [None]
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
    from . import quant

    try:
        rep = quant.for_deployment(spec)
    except InputError:
        return None, None
    return rep.recommended_flags, rep


# ---- check ------------------------------------------------------------------------------------

def serving_python(spec: Deployment) -> tuple[Optional[str], list[Finding]]:
    py = spec.serving.python
    if os.path.isfile(py) and os.access(py, os.X_OK):
        return py, []
    alt = os.environ.get("RUNBOOK_SERVING_PYTHON")
    if alt and os.path.isfile(alt):
        return alt, [Finding("service.parser_env", "info", "flags validated with RUNBOOK_SERVING_PYTHON",
                             detail=f"{py} is not on this machine; {alt} has the same SGLang parser only if its version matches.",
                             evidence=alt)]
    return None, [Finding("service.parser", "skip", "SGLang flags not validated: no serving interpreter here",
                          detail=f"{py} is not on this machine and RUNBOOK_SERVING_PYTHON is unset.",
                          remedy="Run on the serving host, or `make serving-env` to build a CPU copy of SGLang's parser.")]


def check_flags(r: Rendered, python: str, run: Callable = subprocess.run) -> list[Finding]:
    argv = [("REDACTED" if re.fullmatch(r"\$\{\w+\}", w) else w) for w in r.argv[3:]]
    cp = run([python, str(PROBE), json.dumps(argv)], capture_output=True, text=True, timeout=180)
    try:
        res = json.loads(cp.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (cp.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return [Finding("service.parser", "fail", "could not run SGLang's argument parser", evidence=tail[0],
                        remedy=f"Check that `{python} -c 'import sglang.srt.server_args'` works.")]
    ver = res.get("version")
    where = f" on node {r.node}" if r.node else ""
    if res["ok"]:
        n = sum(1 for w in r.argv if w.startswith("--"))
        return [Finding("service.parser", "pass", f"SGLang {ver}'s own parser accepts all {n} flags{where}")]
    out = []
    known = res.get("known_flags", [])
    errors = res.get("errors") or [{"flag": None, "error": res.get("error", "")}]
    for e in errors:
        flags = [e["flag"]] if e.get("flag") else re.findall(r"--[a-z0-9-]+", e["error"])
        for flag in flags or [None]:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag and flag not in known else []
            unknown = bool(flag) and flag not in known
            out.append(Finding(f"service.flag.{(flag or 'argv').lstrip('-')}", "fail",
                               f"{flag}: not a flag of SGLang {ver}" if unknown else f"{flag or 'argv'}: rejected by SGLang {ver}'s parser{where}",
                               detail=e["error"],
                               remedy=(f"Did you mean {close[0]}?" if close else "Remove it or upgrade SGLang.") if unknown
                               else "Fix the value in serving.flags (or the --arg what-if)."))
    if res.get("kind") == "semantic" and not res.get("errors"):
        out = [Finding("service.parser", "fail", f"SGLang {ver} rejects the combination of flags{where}", detail=res.get("error", ""),
                       remedy="Read the message: a flag conflicts with another or with the parallelism.")]
    return out


def verify_unit(r: Rendered, run: Callable = subprocess.run) -> list[Finding]:
    exe = shutil.which("systemd-analyze")
    if not exe:
        return [Finding("service.systemd", "skip", "systemd-analyze not installed: unit syntax not verified",
                        remedy="apt-get install systemd (the CI script installs it)")]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{r.unit_name}.service"
        path.write_text(r.text)
        cp = run([exe, "verify", "--man=no", "--recursive-errors=no", str(path)], capture_output=True, text=True, timeout=60)
    lines = [ln.strip() for ln in (cp.stderr + cp.stdout).splitlines() if ln.strip()]
    out: list[Finding] = []
    for ln in lines:
        m = re.search(r"Command (\S+) is not executable", ln)
        if m:
            # The serving interpreter's absence is already a finding of 00_environment.
            out.append(Finding("service.systemd.binary", "info" if m.group(1) == r.argv[0] else "warn",
                               f"{m.group(1)} does not exist on this machine",
                               detail="systemd-analyze checks ExecStart binaries where it runs; on the serving host it must exist.",
                               evidence=ln.replace(str(Path(d)), "<tmp>")))
            continue
        if "fatal" in ln.lower() and any(f.id == "service.systemd.binary" for f in out):
            continue  # the missing binary is already reported
        out.append(Finding("service.systemd.syntax", "fail" if "fatal" in ln.lower() else "warn", f"systemd-analyze: {ln.split(': ', 1)[-1]}",
                           evidence=ln.replace(str(Path(d)), "<tmp>"), remedy="Fix the spec value that produced this line."))
    if not out:
        out.append(Finding("service.systemd", "pass", "systemd-analyze verify: no warnings" + (f" (node {r.node})" if r.node else "")))
    return out


def cross_checks(spec: Deployment, r: Rendered, quant_rep: Any = None) -> list[Finding]:
    from . import kvplan

    out: list[Finding] = []
    par, hw = spec.parallelism, spec.hardware
    total = hw.gpu_count * max(1, len(par.nodes))
    out.append(Finding("service.gpus", "pass" if par.gpus == total else "warn",
                       f"TP {par.tp} × PP {par.pp} = {par.gpus} GPUs of {total}" + (f" (attention DP {par.attn_dp} inside TP)" if par.attn_dp > 1 else ""),
                       remedy="" if par.gpus == total else "Idle GPUs: raise TP/PP or lower hardware.gpu_count."))
    kv = str(r.flags.get("kv-cache-dtype", "auto"))
    if quant_rep is not None:
        rec = quant_rep.recommended_flags.get("kv-cache-dtype")
        fp8 = kv in ("fp8_e4m3", "fp8_e5m2") or (kv == "auto" and quant_rep.kv_cache.auto_resolves_to.startswith("fp8"))
        if rec == "bf16" and fp8:
            out.append(Finding("service.kv_dtype", "fail", f"--kv-cache-dtype {kv} keeps the FP8 KV cache 10_quant_config flags",
                               detail=f"the checkpoint declares {quant_rep.kv_cache.declared} KV; k/v scales: {quant_rep.kv_cache.scale_coverage}",
                               remedy="--arg kv-cache-dtype=bf16 to try it; then set serving.flags.kv-cache-dtype: bf16 (or serving.apply_recommended: true)."))
        else:
            out.append(Finding("service.kv_dtype", "pass", f"--kv-cache-dtype {kv} agrees with 10_quant_config"))
    try:
        p = kvplan.plan(spec.model_copy(update={"serving": spec.serving.model_copy(update={"flags": r.flags})}))
    except (InputError, SpecError) as e:
        return out + [Finding("service.capacity", "skip", "KV capacity not cross-checked", detail=str(e))]
    res = p.result
    ctx = r.flags.get("context-length")
    if res.max_total_num_tokens is not None and ctx is not None:
        ok = int(ctx) <= res.max_total_num_tokens
        out.append(Finding("service.context_length", "pass" if ok else "fail",
                           f"--context-length {int(ctx):,} {'fits' if ok else 'exceeds'} the KV pool of {res.max_total_num_tokens:,} tokens",
                           remedy="" if ok else "Lower --context-length or raise the KV budget."))
    mrr = r.flags.get("max-running-requests")
    if mrr is not None and res.max_running_requests is not None and res.max_running_requests < int(mrr):
        out.append(Finding("service.max_running_requests", "warn", f"--max-running-requests {mrr} will be capped at {res.max_running_requests}",
                           detail="by the token pool or the linear-attention state slots (20_kv_memory)",
                           remedy=f"Set it to {res.max_running_requests} so the unit says what the server does."))
    spec_frac = spec.serving.flags.get("mem-fraction-static")
    frac = r.flags.get("mem-fraction-static")
    if frac != spec_frac:
        out.append(Finding("service.mem_fraction", "warn", f"--mem-fraction-static {frac} differs from the spec's {spec_frac}",
                           detail="20_kv_memory's capacity tables used the spec's value.",
                           remedy="Put the value in the spec so every notebook uses the same one."))
    elif frac is None:
        out.append(Finding("service.mem_fraction", "info", f"--mem-fraction-static unset: SGLang picks ≈{res.mem_fraction_static}",
                           detail=res.mem_fraction_source))
    if spec.serving.env_file and os.path.exists(spec.serving.env_file):
        mode = os.stat(spec.serving.env_file).st_mode & 0o777
        out.append(Finding("service.env_file", "fail" if mode & 0o077 else "pass", f"{spec.serving.env_file} mode {mode:04o}",
                           remedy=f"chmod 600 {spec.serving.env_file}" if mode & 0o077 else ""))
    return out


def check(spec: Deployment, args: Optional[dict[str, Any]] = None, run: Callable = subprocess.run) -> tuple[list[Rendered], list[Finding]]:
    rec, qrep = recommended_flags(spec)
    units = render(spec, args, rec)
    python, findings = serving_python(spec)
    for r in units:
        if python:
            findings += check_flags(r, python, run)
        findings += verify_unit(r, run)
    findings += cross_checks(spec, units[0], qrep)
    return units, findings


# ---- diff -------------------------------------------------------------------------------------

def _launch_flags(unit: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    starts = unitfile.values(unit, "Service", "ExecStart")
    if not starts:
        return {}
    words = unitfile.split_words(starts[-1])
    if "sglang.launch_server" in words:
        words = words[words.index("sglang.launch_server") + 1:]
    return unitfile.flags_of(words)


def diff(rendered: Rendered, installed: Path) -> tuple[str, list[dict[str, str]], list[Finding]]:
    """Unified diff and a flag-level table of what installing would change."""
    if not installed.exists():
        return "", [], [Finding("service.diff", "info", f"no unit installed at {installed}", detail="install would create it")]
    old = installed.read_text(encoding="utf-8", errors="replace")
    text = "".join(difflib.unified_diff(old.splitlines(True), rendered.text.splitlines(True), str(installed), "rendered"))
    a, b = unitfile.parse(old), unitfile.parse(rendered.text)
    rows: list[dict[str, str]] = []
    for kind, x, y in (("flag", _launch_flags(a), _launch_flags(b)), ("env", unitfile.environment(a), unitfile.environment(b)),
                       ("setting", {k: v for k, v in a.get("Service", []) if k not in ("ExecStart", "Environment")},
                        {k: v for k, v in b.get("Service", []) if k not in ("ExecStart", "Environment")})):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                change = "added" if k not in x else "removed" if k not in y else "changed"
                rows.append({"kind": kind, "name": k, "installed": x.get(k, ""), "rendered": y.get(k, ""), "change": change})
    if not text:
        return "", [], [Finding("service.diff", "pass", f"installed unit {installed} matches the spec")]
    return text, rows, [Finding("service.diff", "warn", f"installed unit differs from the spec in {len(rows)} item(s)",
                                evidence=", ".join(f"{r['change']} {r['name']}" for r in rows[:6]),
                                remedy="Review the diff; `python -m runbook service install --yes` applies the spec.")]


# ---- install ----------------------------------------------------------------------------------

@dataclass
class InstallResult:
    steps: list[dict[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rolled_back: bool = False
    backup: Optional[str] = None


def wait_ready(url: str, timeout: float, interval: float = 2.0) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=min(10.0, max(1.0, timeout))) as resp:
                if resp.status == 200:
                    return True, "200"
                last = str(resp.status)
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(interval)


def install(spec: Deployment, r: Rendered, dry_run: bool = True, root: Optional[Path] = None,
            systemctl: Sequence[str] = ("systemctl",), ready_url: Optional[str] = None, ready_timeout: Optional[float] = None,
            interval: float = 2.0, log: Callable[[str], None] = lambda s: None) -> InstallResult:
    """Back up, write atomically, daemon-reload, restart, wait for readiness; roll back on failure."""
    target = Path(spec.systemd.installed_path)
    path = (Path(root) / target.relative_to("/")) if root else target
    url = ready_url or spec.serving.local_url + spec.systemd.ready_path
    timeout = ready_timeout if ready_timeout is not None else spec.systemd.timeout_start_sec
    res = InstallResult()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    backup = path.with_name(f"{path.name}.bak-{stamp}") if path.exists() else None
    unit = f"{r.unit_name}.service"
    sysctl = list(systemctl)

    def step(name: str, command: str, action: Optional[Callable[[], None]] = None) -> bool:
        entry = {"step": name, "command": command, "status": "planned" if dry_run else "ok"}
        res.steps.append(entry)
        log(f"{'(dry run) ' if dry_run else ''}{name}: {command}")
        if dry_run or action is None:
            return True
        try:
            action()
        except (OSError, subprocess.CalledProcessError) as e:
            entry["status"] = f"failed: {e}"
            return False
        return True

    def ctl(*a: str) -> None:
        subprocess.run(sysctl + list(a), check=True, capture_output=True, text=True, timeout=300)

    if path.exists() and path.read_text(encoding="utf-8", errors="replace") == r.text:
        res.findings.append(Finding("service.install", "pass", f"{path} already matches the spec: nothing to do"))
        return res
    if backup:
        res.backup = str(backup)
        if not step("back up", f"cp -p {path} {backup}", lambda: shutil.copy2(path, backup)):
            res.findings.append(Finding("service.install", "fail", "backup failed: nothing changed", remedy="Check permissions."))
            return res
    ok = step("write unit", f"write {path} (temp file + rename, mode 0644)", lambda: atomic_write_text(path, r.text, 0o644))
    ok = ok and step("reload", " ".join(sysctl + ["daemon-reload"]), lambda: ctl("daemon-reload"))
    ok = ok and step("restart", " ".join(sysctl + ["restart", unit]), lambda: ctl("restart", unit))
    why = ""
    if ok and not dry_run:
        entry = {"step": "wait for readiness", "command": f"GET {url} until 200 (≤ {timeout:.0f} s)", "status": "ok"}
        res.steps.append(entry)
        ready, why = wait_ready(url, timeout, interval)
        if not ready:
            entry["status"] = f"failed: {why}"
            ok = False
    elif dry_run:
        step("wait for readiness", f"GET {url} until 200 (≤ {timeout:.0f} s)")
    if dry_run:
        res.findings.append(Finding("service.install", "info", "dry run: nothing changed",
                                    detail=f"{len(res.steps)} steps planned; `--yes` carries them out (root needed for /etc/systemd)."))
        return res
    if ok:
        res.findings.append(Finding("service.install", "pass", f"installed {path} and the server is ready", evidence=url))
        return res
    res.rolled_back = True
    if backup:
        step("roll back", f"restore {backup} -> {path}", lambda: atomic_write_text(path, backup.read_text(), 0o644))
    else:
        step("roll back", f"remove {path}", lambda: path.unlink(missing_ok=True))
    step("reload", " ".join(sysctl + ["daemon-reload"]), lambda: ctl("daemon-reload"))
    step("restart previous", " ".join(sysctl + ["restart", unit]), lambda: ctl("restart", unit) if backup else None)
    res.findings.append(Finding("service.install", "fail", "the new unit did not become ready: rolled back",
                                detail=f"readiness: {why or 'a step failed'}", evidence=f"backup {backup}" if backup else "",
                                remedy=f"`journalctl -u {unit}` for why; the previous unit is running again."))
    return res


# ---- drift ------------------------------------------------------------------------------------

def _get(url: str, api_key: Optional[str], timeout: float = 10.0) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def redact_server_info(info: dict[str, Any], api_key: Optional[str] = None) -> dict[str, Any]:
    """/server_info returns api_key, admin_api_key, ssl_keyfile_password and launch_command in clear."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if is_secret_key(k) or "password" in k:
            out[k] = MASK if v else v
        elif k == "launch_command" and isinstance(v, str):
            v = re.sub(r"(--(?:admin-)?api-key[ =])\S+", r"\1" + MASK, v)
            out[k] = v.replace(api_key, MASK) if api_key else v
        elif isinstance(v, dict):
            out[k] = redact_server_info(v, api_key)
        else:
            out[k] = v
    return out


def _same(a: Any, b: Any) -> bool:
    norm = {"bf16": "bfloat16"}
    sa, sb = str(a).lower(), str(b).lower()
    sa, sb = norm.get(sa, sa), norm.get(sb, sb)
    if sa == sb:
        return True
    try:
        return float(sa) == float(sb)
    except ValueError:
        return False


def drift(spec: Deployment, url: Optional[str] = None, args: Optional[dict[str, Any]] = None,
          fetch: Callable[[str, Optional[str]], Any] = _get) -> tuple[list[dict[str, str]], list[Finding], dict[str, Any]]:
    """Compare the running server's effective arguments with the spec."""
    base = (url or spec.serving.local_url).rstrip("/")
    api_key = os.environ.get(spec.serving.api_key_env) if spec.serving.api_key_env else None
    info = None
    for path in ("/server_info", "/get_server_info"):
        try:
            info = fetch(base + path, api_key)
            break
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return [], [Finding("service.drift", "fail", f"{base} refused the API key (401)",
                                    remedy=f"Export {spec.serving.api_key_env or 'the API key variable'} for this run.")], {}
            continue
        except (urllib.error.URLError, OSError, ValueError) as e:
            return [], [Finding("service.drift", "skip", f"no server reachable at {base}", evidence=str(getattr(e, "reason", e)),
                                remedy="Start the service, or give the server's URL.")], {}
    if not isinstance(info, dict):
        return [], [Finding("service.drift", "skip", f"{base} has no /server_info", remedy="Is this an SGLang server?")], {}
    info = redact_server_info(info, api_key)
    r = render(spec, args)[0]
    expected = unitfile.flags_of(r.argv[3:])
    expected.pop("api-key", None)
    rows, findings = [], []
    for flag, want in expected.items():
        key = flag.replace("-", "_")
        if key not in info:
            continue
        have = info[key]
        if want == "true":
            want = True
        if not _same(have, want):
            rows.append({"flag": flag, "spec": str(want), "server": str(have)})
    try:
        models = fetch(base + "/v1/models", api_key)
        served = [m.get("id") for m in models.get("data", [])]
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        served = []
    for row in rows:
        findings.append(Finding(f"service.drift.{row['flag']}", "fail", f"server runs --{row['flag']} {row['server']}, the spec says {row['spec']}",
                                remedy="Restart the service from the rendered unit (`service install --yes`), or update the spec if the server is right."))
    kv_in_use = info.get("kv_cache_dtype")
    if not rows:
        findings.append(Finding("service.drift", "pass", f"running server matches the spec on {sum(1 for f in expected if f.replace('-', '_') in info)} flags",
                                detail=f"KV cache dtype in use: {kv_in_use}; serving {', '.join(map(str, served)) or '?'}"))
    subset = {k: info.get(k) for k in ("model_path", "kv_cache_dtype", "tp_size", "context_length", "max_total_num_tokens",
                                       "max_running_requests", "version", "launch_command") if k in info}
    subset["served_models"] = served
    return rows, findings, subset
