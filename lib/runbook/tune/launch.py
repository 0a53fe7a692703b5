"""Launch one candidate server, wait until it is ready, and always take it down again.

`launched(Launch(...))` is a context manager. Before anything starts it refuses a port that is already
taken (kind "port") and an executable that is missing (kind "spawn"). It then starts the server

- as a child process in a session (process group) of its own, whose stdout and stderr go to `log_path`
  (created 0600), and which the kernel kills (PR_SET_PDEATHSIG) if tune itself dies, even by SIGKILL; or
- with `systemd=True`, as a transient service unit through `systemd-run` (`--user` when not root,
  `--collect`, output to `log_path` with StandardOutput=file:, systemd >= 236), stopped with `systemctl stop`;

and polls GET ready_path with the bounded probe of endpoint/reach.py until it answers 200, failing fast when
the process exits (kind "exited", with its exit code and log tail) or the deadline passes (kind "timeout"). A
server that exited because another process took its port during start-up (core/ports.py) is started again on
a free port when the launch can say its command for another port (`argv_for`), at most ports.RELAUNCHES times;
`Running.collisions` records each (the lost attempt's log is kept beside the log as `NAME.portN.log`).
On leaving the block — normally, by an exception or Ctrl-C — the whole process group gets SIGTERM, then
SIGKILL after a grace period (systemd: `systemctl stop`, then `systemctl kill --signal=SIGKILL`), and the
block waits until the port is free. Ctrl-C, SIGTERM and SIGHUP are held off while tearing down, so a second
Ctrl-C cannot leave the server half stopped; inside tune's run (core/oscalls.on_signals) a signal ends the
readiness wait at once. The OS calls (the child's session, systemctl, systemd-run) are core/oscalls.py's.
Values of `env` are never written to any message or log of ours; the log tail shown in an error has secret
values scrubbed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import time
import urllib.error
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runbook.core import oscalls, ports
from runbook.core.errors import RunbookError
from runbook.core.oscalls import CommandFailed, pid_running, port_free
from runbook.core.secrets import redact_text, secret_values
from runbook.endpoint import reach
from runbook.tune.watchdog import Watchdog, WatchdogFailed

GRACE_S = 15.0            # SIGTERM -> SIGKILL: SGLang frees GPU memory in a few seconds once told to stop
PORT_FREE_S = 30.0        # after the server is gone, how long the port may take to be released
POLL_S = 0.2              # readiness / exit polling interval
PROBE_S = 2.0             # one readiness GET
CTL_TIMEOUT_S = 60.0      # one systemd-run / systemctl call
TAIL_LINES = 20
_READY_BYTES = 64 << 10
UNIT_PREFIX = "runbook-tune-"   # transient candidate units: the watchdog stops runbook-tune-*.service if tune dies
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@][A-Za-z0-9:_.\\@-]{0,199}$")   # systemd's unit-name characters; no leading "-"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SYSTEMD_MIN = 236         # StandardOutput=file:


class LaunchFailed(RunbookError):
    """str(e) is a one-line reason naming the cause and the fix."""

    def __init__(self, kind: str, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.kind = kind            # "port" | "exited" | "timeout" | "spawn"
        self.log_tail = log_tail    # last lines of the server's log (secrets scrubbed)


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    log_path: Path
    port: int
    host: str = "127.0.0.1"
    env: Mapping[str, str] = field(default_factory=dict)
    ready_path: str = "/health"
    ready_timeout_s: float = 600.0
    systemd: bool = False
    unit_name: str | None = None
    stop_signal: int | None = None      # None: SIGTERM to every process; else sent to the server's main process alone
    # (argv, env) that serve on another port: a start-up whose port was taken meanwhile is relaunched there.
    argv_for: Callable[[int], tuple[tuple[str, ...], Mapping[str, str]]] | None = field(default=None, compare=False)

    def on_port(self, port: int) -> Launch:
        if self.argv_for is None or port == self.port:
            return self
        argv, env = self.argv_for(port)
        return dataclasses.replace(self, argv=tuple(argv), env=dict(env), port=port)


@dataclass
class Running:
    url: str
    ready_s: float
    log_path: Path
    pid: int | None
    _alive: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    port: int = 0
    collisions: list[ports.Collision] = field(default_factory=list)   # start-ups that lost their port first

    def alive(self) -> bool:
        """The server process (systemd: the unit) is still running."""
        if self._alive is not None:
            return self._alive()
        return self.pid is not None and pid_running(self.pid)


def log_tail(path: Path, secrets: set[str], lines: int = TAIL_LINES) -> str:
    """The last lines of a log (at most 64 KiB read), secret values scrubbed."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - (64 << 10)))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return redact_text("\n".join(text.splitlines()[-lines:]), secrets)


def _last_line(tail: str) -> str:
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    return lines[-1][:300] if lines else "(the log is empty)"


def _executable(argv: tuple[str, ...], env: Mapping[str, str], extra_env: Mapping[str, str]) -> str:
    """The absolute path of argv[0], or LaunchFailed kind "spawn" (also for what no exec can carry)."""
    if not argv or not argv[0]:
        raise LaunchFailed("spawn", "empty command: give the server's executable and its arguments")
    if any("\0" in a for a in argv):
        raise LaunchFailed("spawn", f"an argument of {argv[0]} contains a NUL byte: remove it")
    bad = [k for k in extra_env if not _ENV_NAME.match(k) or "\0" in extra_env[k]]
    if bad:      # the name only: a value may be a secret
        raise LaunchFailed("spawn", f"environment variable {bad[0]!r} cannot be passed to a server (name: letters, digits, _; "
                                    "value: no NUL byte): fix it")
    found = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if found is None:
        p = Path(argv[0])
        why = ("is not executable" if p.exists() and not p.is_dir() else "is a directory" if p.is_dir() else "not found")
        raise LaunchFailed("spawn", f"cannot execute {argv[0]}: {why}; install it, or fix the path (and its mode)")
    return os.path.abspath(found)


def _open_log(path: Path) -> int:
    """The log file, created (or truncated) with mode 0600, never through a symlink."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise LaunchFailed("spawn", f"cannot write the server log {path}: {e.strerror or e}; "
                                    "give a writable log path (not a symlink)") from None
    os.fchmod(fd, 0o600)
    return fd


class _Child:
    """A server started as a child process in its own session; killed by the kernel if tune dies."""

    def __init__(self, launch: Launch, env: dict[str, str], exe: str) -> None:
        fd = _open_log(launch.log_path)
        try:
            self.proc = oscalls.SessionChild(exe, launch.argv, fd, env)
        except OSError as e:
            raise LaunchFailed("spawn", f"cannot start {launch.argv[0]}: {e.strerror or e}") from None
        finally:
            os.close(fd)
        self.pid: int | None = self.proc.pid
        self.exited, self.alive = self.proc.exited, self.proc.alive
        self.stop_signal = launch.stop_signal

    def stop(self, grace: float) -> None:
        self.proc.stop(grace, self.stop_signal)


class _Unit:
    """A server started as a transient systemd service unit."""

    def __init__(self, launch: Launch, env: dict[str, str], exe: str) -> None:
        user = os.geteuid() != 0
        self.env = env
        self.ctl = ["systemctl"] + (["--user"] if user else [])
        self.unit = _unit_name(launch)
        _check_systemd(self.ctl, env)
        _check_log_path(launch.log_path)
        os.close(_open_log(launch.log_path))    # created 0600 by us; systemd then writes into it (file: keeps the mode)
        argv = systemd_run_argv(launch, exe, self.unit, user)
        try:    # tune SIGKILLed or SIGTERMed: no PR_SET_PDEATHSIG reaches a unit, the watchdog stops it
            self.watchdog = Watchdog(self.ctl, stop_units=(self.unit,))
        except WatchdogFailed as e:
            raise LaunchFailed("spawn", f"{e}: unit {self.unit} not started; launch without systemd") from None
        try:
            oscalls.call(argv, timeout=CTL_TIMEOUT_S, env=env, check=True)
        except CommandFailed as e:
            self.stop(GRACE_S)      # a systemd-run that timed out may still have started it
            why = redact_text(e.reason, secret_values(env))
            raise LaunchFailed("spawn", f"systemd-run could not start unit {self.unit}: {why}; "
                                        f"see `systemctl status {self.unit}`, or launch without systemd",
                               log_tail(launch.log_path, secret_values(env))) from None
        main = self._show().get("MainPID", "")
        self.pid: int | None = int(main) if main.isdigit() and int(main) > 0 else None

    def _show(self) -> dict[str, str]:
        try:
            cp = oscalls.systemctl(self.ctl, "show", self.unit, "--property=LoadState,ActiveState,SubState,MainPID,ExecMainStatus",
                                   timeout=CTL_TIMEOUT_S, env=self.env, check=True)
        except CommandFailed:
            return {}
        return dict(line.split("=", 1) for line in cp.stdout.splitlines() if "=" in line)

    def exited(self) -> str | None:
        st = self._show()
        if not st:
            return None     # systemctl itself failed this once: ask again
        if st.get("ActiveState") in ("active", "activating", "reloading", "deactivating") and st.get("SubState") != "exited":
            return None
        code = st.get("ExecMainStatus")
        known = st.get("LoadState") == "loaded" and code not in (None, "")
        return f"exited with code {code}" if known else "exited (the unit is gone; its exit code was not kept)"

    def alive(self) -> bool:
        return self.exited() is None

    def stop(self, grace: float) -> None:
        """`systemctl stop` (systemd sends SIGTERM, then SIGKILL after TimeoutStopSec); SIGKILL if that fails."""
        try:
            oscalls.systemctl(self.ctl, "stop", self.unit, timeout=grace + CTL_TIMEOUT_S, env=self.env, check=True)
            stopped = not self.alive()
        except CommandFailed:
            stopped = False
        if not stopped:
            with contextlib.suppress(CommandFailed):     # the unit gone meanwhile: nothing to kill
                oscalls.systemctl(self.ctl, "kill", "--signal=SIGKILL", self.unit, timeout=CTL_TIMEOUT_S, env=self.env)
        deadline = time.monotonic() + 10.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self.watchdog.disarm()


def systemd_run_argv(launch: Launch, exe: str, unit: str, user: bool) -> list[str]:
    """The `systemd-run` command for a candidate (tests check its properties with `systemd-analyze verify`)."""
    return (["systemd-run"] + (["--user"] if user else []) +
            [f"--unit={unit}", "--collect", "--quiet", "--service-type=exec",
             f"--property=StandardOutput=file:{launch.log_path}", "--property=StandardError=inherit",
             "--property=KillMode=control-group", f"--property=TimeoutStopSec={int(GRACE_S)}s",
             "--property=SendSIGKILL=yes"] +
            ([f"--property=KillSignal={signal.Signals(launch.stop_signal).name}"] if launch.stop_signal else []) +
            [f"--setenv={k}" for k in sorted(launch.env)] +   # the value comes from systemd-run's environment
            ["--", exe, *(a.replace("$", "$$") for a in launch.argv[1:])])  # $ is systemd's variable syntax


def _unit_name(launch: Launch) -> str:
    name = launch.unit_name or f"{UNIT_PREFIX}{launch.port}"
    name = name if name.endswith(".service") else name + ".service"
    if not UNIT_NAME.match(name):
        raise LaunchFailed("spawn", f"unit name {name!r} is not a valid systemd unit name: use letters, digits and :_.-@ only")
    return name


def _check_log_path(path: Path) -> None:
    """The path goes into a unit property: absolute, and nothing systemd would split or read as syntax."""
    if not path.is_absolute() or any(c.isspace() or ord(c) < 32 for c in str(path)) or "%" in str(path):
        raise LaunchFailed("spawn", f"log path {str(path)!r} cannot be given to systemd: use an absolute path "
                                    "without spaces, control characters or %")


def _check_systemd(ctl: list[str], env: Mapping[str, str]) -> None:
    """systemd is there and new enough for StandardOutput=file: (236)."""
    try:
        said = oscalls.call([ctl[0], "--version"], timeout=CTL_TIMEOUT_S, env=env, check=True).stdout
    except CommandFailed:
        said = ""
    m = re.match(r"systemd (\d+)", said)
    if m is None:
        raise LaunchFailed("spawn", "systemctl --version did not answer: systemd is not available here; launch without systemd")
    if int(m.group(1)) < SYSTEMD_MIN:
        raise LaunchFailed("spawn", f"systemd {m.group(1)} is older than {SYSTEMD_MIN} (StandardOutput=file:); "
                                    "launch without systemd")


def _wait_ready(launch: Launch, server: _Child | _Unit, url: str, t0: float, secrets: set[str]) -> float:
    """Seconds from t0 until GET url answers 200; LaunchFailed when the server exits first or the deadline passes."""
    deadline = t0 + launch.ready_timeout_s
    shutdown = oscalls.current()
    last = "no answer yet"
    name = Path(launch.argv[0]).name
    while True:
        shutdown.check()
        why = server.exited()
        if why is not None:
            tail = log_tail(launch.log_path, secrets)
            raise LaunchFailed("exited", f"{name} {why} before it was ready: {_last_line(tail)} (log {launch.log_path})", tail)
        lost = ports.bind_line(log_tail(launch.log_path, secrets, 50))
        if lost is not None:    # SGLang 0.5.23 logs Errno 98 and then hangs in its shutdown: do not wait for it to exit
            tail = log_tail(launch.log_path, secrets)
            raise LaunchFailed("exited", f"{name} could not bind its port: {lost} (log {launch.log_path})", tail)
        left = deadline - time.monotonic()
        if left <= 0:
            raise LaunchFailed("timeout", f"{name} was not ready within {launch.ready_timeout_s:g} s (GET {url}: {last}); "
                                          f"see {launch.log_path}, or raise the readiness timeout",
                               log_tail(launch.log_path, secrets))
        try:
            status, _ = reach.get(url, timeout=min(PROBE_S, max(0.1, left)), max_bytes=_READY_BYTES)
            if status == 200:
                return time.monotonic() - t0
            last = f"HTTP {status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except reach.BadResponse as e:
            last = e.reason
        except OSError as e:
            last = " ".join(str(getattr(e, "reason", e) or type(e).__name__).split())[:200]
        shutdown.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))


def _refuse_taken_port(launch: Launch) -> None:
    try:
        free = port_free(launch.host, launch.port)
    except OSError as e:
        raise LaunchFailed("port", f"cannot listen on {launch.host}:{launch.port}: {e.strerror or e}; "
                                   "give an address of this machine") from None
    if not free:
        who = ports.held_by(launch.port)
        raise LaunchFailed("port", f"port {launch.port} on {launch.host} is already in use"
                                   + (f" (held by {who})" if who else "") +
                                   ": stop what listens there (or the production server), or use another port")


def _url(launch: Launch) -> str:
    return f"http://{launch.host if ':' not in launch.host else f'[{launch.host}]'}:{launch.port}"


def _keep_log(launch: Launch, c: ports.Collision) -> None:
    """The lost attempt's log, kept beside the next one's as NAME.portN.log (the last one stays where it is)."""
    if c.relaunched_on is None:
        return
    with contextlib.suppress(OSError):
        os.replace(launch.log_path, launch.log_path.with_name(f"{launch.log_path.stem}.port{c.port}{launch.log_path.suffix}"))


@contextlib.contextmanager
def launched(launch: Launch) -> Iterator[Running]:
    """Refuse a taken port; start; wait ready (failing fast on exit or deadline; relaunched on another port when
    its own was taken meanwhile); yield; always stop it and wait until the port is free. Never leaves a child
    behind, never hangs."""
    _refuse_taken_port(launch)
    env = {**os.environ, **launch.env}
    secrets = secret_values(env) | {v for k, v in launch.env.items() if v and len(v) >= 6}
    exe = _executable(launch.argv, env, launch.env)

    def start(port: int) -> tuple[Launch, _Child | _Unit, float]:
        lp = launch.on_port(port)
        env = {**os.environ, **lp.env}
        t0 = time.monotonic()
        server: _Child | _Unit = _Unit(lp, env, exe) if lp.systemd else _Child(lp, env, exe)
        try:
            return lp, server, _wait_ready(lp, server, _url(lp) + lp.ready_path, t0, secrets)
        except BaseException:
            with oscalls.held():
                server.stop(GRACE_S)
            raise

    def failed_log(e: BaseException) -> str | None:
        return log_tail(launch.log_path, secrets, 200) if isinstance(e, LaunchFailed) and e.kind == "exited" else None

    try:
        (lp, server, ready_s), collisions = ports.relaunching(
            start, launch.port, failed_log=failed_log, host=launch.host,
            attempts=ports.RELAUNCHES if launch.argv_for else 0, on_collision=lambda c: _keep_log(launch, c))
    except ports.PortsTaken as e:
        raise LaunchFailed("port", str(e), log_tail(launch.log_path, secrets)) from None
    ok = False
    try:
        yield Running(_url(lp), ready_s, lp.log_path, server.pid, server.alive, lp.port, collisions)
        ok = True
    finally:
        with oscalls.held():      # a second Ctrl-C or SIGTERM must not leave the server half stopped
            server.stop(GRACE_S)
            freed = oscalls.wait_port_free(lp.host, lp.port, PORT_FREE_S, POLL_S)
        if ok and not freed:
            raise LaunchFailed("port", f"port {lp.port} on {lp.host} is still in use {PORT_FREE_S:g} s after the "
                                       "server was stopped: see what listens there (ss -ltnp)")
