"""Installing the unit (opt-in): back up, write atomically, daemon-reload, restart, wait for
readiness, roll back on failure.

Once the new unit file is written, ANY failure — a systemctl call that fails or runs past its
timeout, readiness not reached in time, an exception, Ctrl-C or SIGTERM/SIGHUP — rolls back: the
previous unit file is restored byte for byte (mode kept), or the new one removed (its service
stopped first) when there was none; systemd is reloaded again; the previous service is restarted
when the install had restarted it. The finding then says which unit is installed now and what
`systemctl is-active` answers for the service, rather than assuming it is running again.
"""
from __future__ import annotations

import datetime as dt
import shutil
import signal
import socket
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.core import oscalls
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.fsutil import atomic_write_bytes
from runbook.core.oscalls import CommandFailed, Interrupted
from runbook.core.spec import Deployment
from runbook.endpoint import reach
from runbook.service.gateway import render_unit as render_gateway
from runbook.service.render import Rendered, build

CTL_TIMEOUT_S = 120.0   # one systemctl call (daemon-reload on a busy host takes seconds, restart returns once started)
_STDERR_TAIL = 300
_READY_BYTES = 64 << 10    # a readiness answer is a few bytes: more is read as a broken one, not waited for


@dataclass
class InstallResult:
    steps: list[dict[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rolled_back: bool = False
    backup: str | None = None
    interrupted: bool = False                 # Ctrl-C / SIGTERM / SIGHUP arrived during the install
    installed: str | None = None           # after the call: "new", "previous", "none" or "unknown"
    service_state: str | None = None       # `systemctl is-active` after a rollback (active, inactive, failed, …)


class _StepFailed(Exception):
    pass


def wait_ready(url: str, timeout: float, interval: float = 2.0) -> tuple[bool, str]:
    """(True, "200") once `url` answers 200 within `timeout` seconds, else (False, the last reason)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        left = max(0.5, deadline - time.monotonic())
        try:
            status, _ = reach.get(url, timeout=min(10.0, left), max_bytes=_READY_BYTES)
            if status == 200:
                return True, "200"
            last = str(status)
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        except reach.BadResponse as e:   # answered, but cut off, too large or too slow
            last = e.reason
        except Exception as e:  # a malformed URL or a broken answer: not ready, with the reason
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def _tail(text: str | None) -> str:
    lines = [x for x in (text or "").strip().splitlines() if x.strip()]
    return lines[-1][:_STDERR_TAIL] if lines else ""


def _run_ctl(argv: list[str], timeout: float) -> oscalls.Completed[str]:
    """One systemctl call, bounded in time; raises _StepFailed with a one-line reason when it cannot run."""
    try:
        return oscalls.call(argv, timeout=timeout)
    except CommandFailed as e:
        raise _StepFailed(e.reason) from None


def _unchanged(path: Path, prev: bytes | None) -> bool:
    try:
        return (path.read_bytes() == prev) if path.exists() else prev is None
    except OSError:
        return False


def _backup_name(path: Path) -> Path:
    """A backup path that does not exist yet (two installs in one second keep both backups)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    cand = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while cand.exists() or cand.is_symlink():
        cand = path.with_name(f"{path.name}.bak-{stamp}.{n}")
        n += 1
    return cand


@dataclass
class _Install:
    """One install's state, shared by its steps (and by the rollback)."""
    res: InstallResult
    path: Path
    unit: str
    new: bytes
    sysctl: list[str]
    ctl_timeout: float
    dry_run: bool
    log: Callable[[str], None]
    prev: bytes | None = None      # the installed unit's bytes, read once: the rollback writes exactly these back
    prev_mode: int = 0o644
    backup: Path | None = None
    restarted: bool = False        # the restart was attempted: the running service may be the new one
    stage: str = ""

    def record(self, name: str, command: str) -> dict[str, str]:
        entry = {"step": name, "command": command, "status": "planned" if self.dry_run else "running"}
        self.res.steps.append(entry)
        self.log(f"{'(dry run) ' if self.dry_run else ''}{name}: {command}")
        return entry

    def run_step(self, name: str, command: str, action: Callable[[], Any]) -> Any:
        """Run one step; a failure (or an exception) marks it and raises _StepFailed."""
        entry = self.record(name, command)
        try:
            out = action()
        except _StepFailed as e:
            entry["status"] = f"failed: {e}"
            raise _StepFailed(f"{name}: {e}") from None
        except OSError as e:
            entry["status"] = f"failed: {e.strerror or e}"
            raise _StepFailed(f"{name}: {e.strerror or e}") from None
        except BaseException as e:
            entry["status"] = f"failed: {type(e).__name__}" + (f": {e}" if str(e) else "")
            raise
        entry["status"] = "ok"
        return out

    def query(self, *a: str) -> oscalls.Completed[str]:
        return _run_ctl(self.sysctl + list(a), self.ctl_timeout)

    def ctl(self, *a: str) -> None:
        cp = self.query(*a)
        if cp.returncode != 0:
            raise _StepFailed(f"exit {cp.returncode}" + (f": {_tail(cp.stderr) or _tail(cp.stdout)}" if (cp.stderr or cp.stdout) else ""))

    def cmd(self, *a: str) -> str:
        return " ".join(self.sysctl + list(a))


_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def this_host() -> set[str]:
    """The names this machine answers to: its hostname, short and fully qualified, and loopback."""
    name = socket.gethostname()
    return {name, name.split(".")[0], socket.getfqdn(), *_LOOPBACK}


def local_units(spec: Deployment, args: dict[str, Any] | None = None, one: bool = False,
                here: set[str] | None = None) -> list[Rendered]:
    """The units this host installs: the one server's, or, with replicas, node ranks or a gateway, those whose host
    (topology.replicas[].host, parallelism.nodes[].address, topology.gateway.host) names this machine. None placed
    here is an InputError naming the fields, so a unit is never installed on a host the spec gives it no place on;
    `one`: an option that speaks of one unit (--installed, --ready-url) with several here is refused."""
    units = build(spec, args).units
    if spec.topology.gateway is not None:
        units = [*units, render_gateway(spec)]
    if len(units) == 1:
        return units
    names = here if here is not None else this_host()
    mine = [u for u in units if u.host in names or u.node in names]
    if not mine:
        raise InputError(f"service: this host ({socket.gethostname()}) runs none of the spec's {len(units)} units; "
                         "run it on a host that topology.replicas[].host, topology.gateway.host or "
                         "parallelism.nodes[] names (or install per host with the Ansible playbook's units tag)")
    if one and len(mine) > 1:
        raise InputError(f"service: {{installed_unit}} and {{ready_url}} name one unit, but this host runs {len(mine)} "
                         f"({', '.join(u.unit_name for u in mine)}); leave them out")
    return mine


def unit_path(spec: Deployment, r: Rendered) -> Path:
    """Where a unit is installed: systemd.installed_path for the one server; beside it, under its own name, for a
    replica's, a node rank's or the gateway's unit."""
    target = Path(spec.systemd.installed_path)
    return target if r.unit_name == spec.systemd.unit_name else target.with_name(f"{r.unit_name}.service")


def unit_ready_url(spec: Deployment, r: Rendered) -> str:
    """The URL that answers 200 once the unit's process serves: the gateway's /health, a replica's own port."""
    if r.role == "gateway" and spec.topology.gateway is not None:
        g = spec.topology.gateway
        host = "127.0.0.1" if g.bind in ("0.0.0.0", "::", "") else g.bind
        return f"http://{f'[{host}]' if ':' in host else host}:{g.port}/health"
    port = next((x.port for x in spec.topology.replicas if x.name == r.replica), spec.serving.port)
    return spec.serving.model_copy(update={"port": port}).local_url + spec.systemd.ready_path


def install(spec: Deployment, r: Rendered, dry_run: bool = True, root: Path | None = None,
            systemctl: Sequence[str] = ("systemctl",), ready_url: str | None = None, ready_timeout: float | None = None,
            interval: float = 2.0, log: Callable[[str], None] = lambda s: None,
            ctl_timeout: float = CTL_TIMEOUT_S) -> InstallResult:
    """Back up, write atomically, daemon-reload, restart, wait for readiness; roll back on any failure after the write."""
    res = InstallResult()
    target = unit_path(spec, r)
    if not target.is_absolute():
        res.findings.append(Finding("service.install", "fail", f"systemd.unit_path {target} is not absolute: nothing changed",
                                    remedy="Give systemd.unit_path as an absolute path, e.g. /etc/systemd/system/<name>.service."))
        return res
    path = (Path(root) / target.relative_to("/")) if root else target
    url = ready_url or unit_ready_url(spec, r)
    timeout = ready_timeout if ready_timeout is not None else spec.systemd.timeout_start_sec
    ins = _Install(res, path, f"{r.unit_name}.service", r.text.encode("utf-8"), list(systemctl), ctl_timeout, dry_run, log)
    if not _read_current(ins):
        return res
    if ins.prev is not None and ins.prev == ins.new:
        res.installed = "new"
        res.findings.append(Finding("service.install", "pass", f"{path} already matches the spec: nothing to do"))
        return res
    ready_cmd = f"GET {url} until 200 (≤ {timeout:.0f} s)"
    if dry_run:
        _plan(ins, ready_cmd)
    elif _back_up(ins):
        _apply(ins, url, timeout, interval, ready_cmd)
    return res


def _read_current(ins: _Install) -> bool:
    """Read what is installed now, once, as bytes (and its mode); False (with the finding) when it cannot be read."""
    path = ins.path
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        if path.exists():
            ins.prev_mode = path.stat().st_mode & 0o7777
            ins.prev = path.read_bytes()
    except OSError as e:
        ins.res.findings.append(Finding("service.install", "fail", f"cannot read the installed unit {path}: nothing changed",
                                        detail=e.strerror or str(e),
                                        remedy="Point systemd.unit_path (or --root) at a unit file, and check its permissions."))
        return False
    ins.backup = _backup_name(path) if ins.prev is not None else None
    return True


def _plan(ins: _Install, ready_cmd: str) -> None:
    """Dry run: record the steps an install would take, change nothing."""
    if ins.backup:
        ins.record("back up", f"cp -p {ins.path} {ins.backup}")
    ins.record("write unit", f"write {ins.path} (temp file + rename, mode 0644)")
    ins.record("reload", ins.cmd("daemon-reload"))
    ins.record("restart", ins.cmd("restart", ins.unit))
    ins.record("wait for readiness", ready_cmd)
    ins.res.findings.append(Finding("service.install", "info", "dry run: nothing changed",
                                    detail=f"{len(ins.res.steps)} steps planned; `--yes` carries them out "
                                           "(root needed for /etc/systemd)."))


def _back_up(ins: _Install) -> bool:
    """Copy the installed unit aside (when there is one); False (with the finding) when that fails: nothing changed."""
    backup, path = ins.backup, ins.path
    if not backup:
        return True
    try:
        ins.run_step("back up", f"cp -p {path} {backup}", lambda: shutil.copy2(path, backup))
    except (_StepFailed, Exception) as e:
        ins.res.findings.append(Finding("service.install", "fail", "backup failed: nothing changed", detail=str(e),
                                        remedy="Check permissions on the unit's directory."))
        return False
    ins.res.backup = str(backup)
    return True


def _write_reload_restart_wait(ins: _Install, url: str, timeout: float, interval: float, ready_cmd: str) -> None:
    """The steps that change the host, in order; `ins.stage` says which one a failure happened in."""
    path, unit = ins.path, ins.unit
    ins.stage = "write unit"
    ins.run_step("write unit", f"write {path} (temp file + rename, mode 0644)", lambda: atomic_write_bytes(path, ins.new, 0o644))
    ins.stage = "reload"
    ins.run_step("reload", ins.cmd("daemon-reload"), lambda: ins.ctl("daemon-reload"))
    ins.stage = "restart"
    ins.restarted = True
    ins.run_step("restart", ins.cmd("restart", unit), lambda: ins.ctl("restart", unit))
    ins.stage = "wait for readiness"
    entry = ins.record("wait for readiness", ready_cmd)
    ready, reason = wait_ready(url, timeout, interval)
    if not ready:
        entry["status"] = f"failed: {reason}"
        raise _StepFailed(f"readiness: {reason}")
    entry["status"] = "ok"


def _apply(ins: _Install, url: str, timeout: float, interval: float, ready_cmd: str) -> None:
    """Carry the install out; any failure once the unit may have changed rolls back, signals held off meanwhile."""
    res, path = ins.res, ins.path
    try:
        # SIGTERM/SIGHUP surface where the install is, like Ctrl-C: plain synchronous steps, no event loop
        with oscalls.handling(oscalls.raise_interrupted, (signal.SIGTERM, signal.SIGHUP)):
            _write_reload_restart_wait(ins, url, timeout, interval, ready_cmd)
    except _StepFailed as e:
        why = str(e)
        if ins.stage == "write unit" and _unchanged(path, ins.prev):
            # The write is atomic (temp file + rename): a failed write left the old state.
            res.installed = "previous" if ins.prev is not None else "none"
            res.findings.append(Finding("service.install", "fail", f"cannot write {path}: nothing changed", detail=why,
                                        evidence=f"backup {ins.backup}" if ins.backup else "",
                                        remedy="Check that the unit's directory is writable (root for /etc/systemd) and not full."))
            return
    except (KeyboardInterrupt, Interrupted) as e:
        res.interrupted = True
        name = e.name if isinstance(e, Interrupted) else "SIGINT (Ctrl-C)"
        why = f"interrupted by {name} during {ins.stage}"
    except Exception as e:  # anything else after the write must still roll back
        why = f"{ins.stage}: {type(e).__name__}" + (f": {' '.join(str(e).split())}" if str(e) else "")
    else:
        res.installed = "new"
        res.findings.append(Finding("service.install", "pass", f"installed {path} and the server is ready", evidence=url))
        return
    with oscalls.on_signals() as held:      # a second Ctrl-C must not stop the rollback half way
        _roll_back(ins, why)
    if held.received:
        res.interrupted = True


def _roll_back(ins: _Install, why: str) -> None:
    """Undo the install and say honestly what is installed and running afterwards. Never raises."""
    ins.res.rolled_back = True
    problems = _undo(ins)
    _read_back(ins)
    ins.res.service_state = _is_active(ins.query, ins.cmd, ins.unit, ins.record)
    ins.res.findings.append(_rollback_finding(ins, why, problems))


def _undo(ins: _Install) -> list[str]:
    """Restore the previous unit (or remove the new one), reload, restart the previous service; the steps that failed."""
    problems: list[str] = []
    path, unit, prev = ins.path, ins.unit, ins.prev

    def attempt(name: str, command: str, action: Callable[[], Any]) -> bool:
        entry = ins.record(name, command)
        try:
            action()
        except _StepFailed as e:
            entry["status"] = f"failed: {e}"
        except OSError as e:
            entry["status"] = f"failed: {e.strerror or e}"
        except Exception as e:  # a rollback step failing is reported, never raised
            entry["status"] = f"failed: {type(e).__name__}: {e}"
        else:
            entry["status"] = "ok"
            return True
        problems.append(f"{name} {entry['status']}")
        return False

    if prev is None:
        if ins.restarted:
            attempt("stop new", ins.cmd("stop", unit), lambda: ins.ctl("stop", unit))
        attempt("roll back", f"remove {path}", lambda: path.unlink(missing_ok=True))
    else:
        old = prev
        src = f"{ins.backup}" if ins.backup else "the bytes read before the install"
        attempt("roll back", f"restore {src} -> {path} (byte for byte, mode {ins.prev_mode:04o})",
                lambda: atomic_write_bytes(path, old, ins.prev_mode))
    attempt("reload", ins.cmd("daemon-reload"), lambda: ins.ctl("daemon-reload"))
    if prev is not None and ins.restarted:
        attempt("restart previous", ins.cmd("restart", unit), lambda: ins.ctl("restart", unit))
    return problems


def _read_back(ins: _Install) -> None:
    """What is really installed now: read back, not assumed."""
    res, prev = ins.res, ins.prev
    try:
        on_disk: bytes | None = ins.path.read_bytes() if ins.path.exists() else None
    except OSError:
        res.installed = "unknown"
    else:
        res.installed = ("previous" if prev is not None and on_disk == prev else
                         "none" if prev is None and on_disk is None else
                         "new" if on_disk == ins.new else "unknown")


def _rollback_finding(ins: _Install, why: str, problems: list[str]) -> Finding:
    """The one finding a rollback ends with: what is installed, whether the service runs, what to do by hand."""
    res, path, unit, backup, state = ins.res, ins.path, ins.unit, ins.backup, ins.res.service_state
    if res.installed == "previous":
        what = f"previous unit restored; service {unit} is {state}"
    elif res.installed == "none":
        what = f"new unit removed (there was none before); service {unit} is {state}"
    elif res.installed == "new":
        what = f"ROLLBACK FAILED: the NEW unit is still installed at {path}; service {unit} is {state}"
    else:
        what = f"ROLLBACK FAILED: {path} holds neither the previous nor the new unit; service {unit} is {state}"
    service_ok = state == "active" if (ins.prev is not None and ins.restarted) else True
    if res.installed in ("previous", "none") and not problems and service_ok:
        remedy = f"`journalctl -u {unit}` for why the install failed; fix it and run install again."
    elif res.installed in ("previous", "none"):
        remedy = (f"The unit file is rolled back but not every step succeeded: see `systemctl status {unit}` and "
                  f"`journalctl -u {unit}`, then `systemctl daemon-reload && systemctl restart {unit}` by hand.")
    else:
        undo = f"`cp -p {backup} {path}`" if backup else f"`rm {path}`"
        remedy = f"Undo it by hand: {undo}, then `systemctl daemon-reload` and `systemctl restart {unit}`."
    title = ("interrupted: rolled back — " if res.interrupted else "install failed: rolled back — ") + what
    detail = why + (f"; rollback problems: {'; '.join(problems)}" if problems else "")
    return Finding("service.install", "fail", title, detail=detail, evidence=f"backup {backup}" if backup else "", remedy=remedy)


def _is_active(query: Callable[..., oscalls.Completed[str]], cmd: Callable[..., str], unit: str,
               record: Callable[[str, str], dict[str, str]]) -> str:
    """`systemctl is-active UNIT`: its one-word answer (active, inactive, failed, activating, …), or why there is none."""
    entry = record("is it running", cmd("is-active", unit))
    try:
        cp = query("is-active", unit)
    except _StepFailed as e:
        entry["status"] = f"failed: {e}"
        return f"in an unknown state (is-active {e})"
    word = _tail(cp.stdout).split()[0] if _tail(cp.stdout) else ""
    entry["status"] = word or f"exit {cp.returncode}"
    if word and all(c.isalnum() or c == "-" for c in word) and len(word) <= 32:
        return word
    return "active" if cp.returncode == 0 else f"not active (is-active exit {cp.returncode})"
