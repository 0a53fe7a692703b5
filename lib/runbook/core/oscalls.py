"""The one layer between runbook and the operating system's process machinery:

- **systemd's tools** (`systemctl`, `systemd-run`, `journalctl`): `call` runs one bounded command and `journal`
  streams one; both fail one way, `CommandFailed`, carrying the command, its exit code (None when it did not run
  or ran past its deadline) and the tail of its stderr;
- **signals**: `handling` installs a handler for a block and always puts the previous ones back; `on_signals` records
  SIGINT/SIGTERM/SIGHUP rather than raising into whatever frame happens to run (an exception raised from a handler
  lands inside an event loop's callback, which logs and drops it), so long steps check `Shutdown.check`, sleep with
  `Shutdown.sleep`, and coroutines run under `interruptible` are cancelled by the event loop itself; `held`
  keeps them off a teardown or a restore that must not be cut short;
- **child processes**: `dying_with_parent` is a command line the kernel signals when this process dies
  (PR_SET_PDEATHSIG, set by a small interpreter that then execs the command: never `preexec_fn`); `SessionChild`
  starts a server that way in a session of its own and stops the whole group (SIGTERM, SIGKILL after a grace
  period); `start_session` starts a helper in a session of its own; `port_free`, `wait_port_free`, `pid_running`.

Everything else in runbook reaches these through here (tests/test_layout.py checks it).
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import psutil

from runbook.core.errors import RunbookError

T = TypeVar("T")
Completed = subprocess.CompletedProcess
PIPE, DEVNULL, STDOUT, TimeoutExpired = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT, subprocess.TimeoutExpired
TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CTL_TIMEOUT_S = 120.0       # one systemctl call: a stop or start of a big server takes its TimeoutStopSec and more
TAIL_CHARS = 300
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)   # exited, not yet reaped: no longer running
REPEAT_S = 0.5              # a leader signal is sent again when the leader is still there after this


# --- one failure model ------------------------------------------------------------------------------------------

class CommandFailed(RunbookError):
    """A command could not run, ran past its deadline, or exited non-zero. `code` is None when it did not run to
    an exit; `reason` is the one line after the command (`exit 1: Job failed.`, `timed out after 30 s`)."""

    def __init__(self, argv: Sequence[str], code: int | None, stderr_tail: str = "", reason: str = "") -> None:
        self.argv = list(argv)
        self.code = code
        self.stderr_tail = stderr_tail
        self.reason = reason or (f"exit {code}" + (f": {stderr_tail}" if stderr_tail else ""))
        super().__init__(f"`{' '.join(self.argv)}`: {self.reason}")


def tail(text: str | None, limit: int = TAIL_CHARS) -> str:
    """The last non-empty line of a command's output, cut to `limit` characters."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1][:limit] if lines else ""


def call(argv: Sequence[str], *, timeout: float = CTL_TIMEOUT_S, env: Mapping[str, str] | None = None,
         check: bool = False) -> subprocess.CompletedProcess[str]:
    """One bounded run of a systemd tool, output captured as text, stdin closed, in a session of its own: a
    Ctrl-C at the terminal reaches tune's whole process group, and must not kill the `systemctl start` that
    restores production. CommandFailed when it cannot run or passes `timeout` (and, with `check`, when it exits
    non-zero); otherwise its CompletedProcess (an `is-active` answering "inactive" exits 3: the caller reads it)."""
    argv = list(argv)
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                            env=dict(env) if env is not None else None, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise CommandFailed(argv, None, reason=f"timed out after {timeout:g} s") from None
    except OSError as e:
        raise CommandFailed(argv, None, reason=f"cannot run {argv[0] if argv else '(nothing)'}: {e.strerror or e}") from None
    if check and cp.returncode != 0:
        raise CommandFailed(argv, cp.returncode, tail(cp.stderr) or tail(cp.stdout))
    return cp


def systemctl(ctl: Sequence[str], *args: str, timeout: float = CTL_TIMEOUT_S, env: Mapping[str, str] | None = None,
              check: bool = False) -> subprocess.CompletedProcess[str]:
    """`call` of the systemctl command `ctl` (e.g. ["systemctl", "--user"]) with `args`."""
    return call([*ctl, *args], timeout=timeout, env=env, check=check)


def is_active(ctl: Sequence[str], unit: str, timeout: float = 30.0) -> str:
    """`systemctl is-active UNIT`'s one word (active, inactive, failed, …); "unknown" when it ran and failed
    without one (no systemd to ask, e.g. "Failed to connect to bus": nothing of it is active); CommandFailed
    when it could not run or its answer is not a word."""
    cp = systemctl(ctl, "is-active", unit, timeout=timeout)
    word = (cp.stdout.split() or [""])[0]
    if not word and cp.returncode != 0:
        return "unknown"
    if not word or len(word) > 32 or not word.replace("-", "").isalnum():
        raise CommandFailed([*ctl, "is-active", unit], cp.returncode, tail(cp.stderr) or tail(cp.stdout))
    return word


@dataclass
class Stream:
    """A command's stdout as lines, read while it runs. `failure` is set once `lines` is exhausted or closed, when
    the command exited non-zero or was stopped at its deadline."""
    argv: list[str]
    lines: Generator[bytes, None, None] = field(default_factory=lambda: (b for b in b"".splitlines()))
    failure: CommandFailed | None = None

    def close(self) -> None:
        """Stop reading: the command is killed (when still running) and `failure` settled."""
        self.lines.close()


def journal(argv: Sequence[str], timeout: float, limit: int) -> Stream:
    """Start `argv` (journalctl) and stream its stdout in lines of at most `limit` bytes (the rest of a longer
    line is skipped); killed when `timeout` passes or the reader stops early. CommandFailed when it cannot start."""
    argv = list(argv)
    try:
        proc = start_session(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)   # killed with what it starts
    except OSError as e:
        raise CommandFailed(argv, None, reason=f"cannot run {argv[0]}: {e.strerror or e}") from None
    out = Stream(argv)
    killed: list[bool] = []

    def kill() -> None:
        killed.append(True)
        kill_group(proc.pid, signal.SIGKILL)     # a child left holding the pipe would keep the reader waiting

    timer = threading.Timer(timeout, kill)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read(65536) if proc.stderr else b""), daemon=True)

    def gen() -> Generator[bytes, None, None]:
        timer.start()
        reader.start()
        try:
            assert proc.stdout is not None
            yield from _bounded_lines(proc.stdout, limit)
        finally:
            timer.cancel()
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            reader.join(5)
            said = tail((err[0] if err else b"").decode("utf-8", errors="replace"))
            if killed:
                out.failure = CommandFailed(argv, None, said, reason=f"passed its {timeout:g} s deadline and was stopped")
            elif rc != 0:
                out.failure = CommandFailed(argv, rc, said)

    out.lines = gen()
    return out


def _bounded_lines(stream: IO[bytes], limit: int) -> Iterator[bytes]:
    while True:
        chunk = stream.readline(limit)
        if not chunk:
            return
        rest = chunk
        while rest and not rest.endswith(b"\n"):     # skip the remainder of an over-long line
            rest = stream.readline(limit)
        yield chunk


# --- signals ----------------------------------------------------------------------------------------------------

class Interrupted(BaseException):
    """A signal asked this process to stop. A BaseException, like KeyboardInterrupt: what catches Exception to
    carry on with the next item must not carry on past it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal_name(self.signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


@contextlib.contextmanager
def handling(handler: Callable[[int, Any], Any], signals: Sequence[int] = TERMINATING) -> Iterator[bool]:
    """`handler` for `signals` while the block runs; the previous handlers back afterwards, however it ends.
    Python sets handlers only in the main thread: elsewhere nothing changes and it yields False."""
    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for s in signals:
            with contextlib.suppress(OSError, ValueError):
                saved[s] = signal.signal(s, handler)
    try:
        yield bool(saved)
    finally:
        for s, h in saved.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(s, h if h is not None else signal.SIG_DFL)


def raise_interrupted(signum: int, _frame: Any) -> None:
    """A handler for plain synchronous code (no event loop): the signal surfaces as Interrupted where it runs."""
    raise Interrupted(signum)


def serve_until_signalled(proc: subprocess.Popen[Any], stop: Callable[[], None]) -> int:
    """A foreground server: wait for `proc` until it exits (0) or Ctrl-C, SIGTERM or SIGHUP ends the wait
    (128+signal); `stop` runs however the wait ends, so no server outlives its `serve` command."""
    try:
        with handling(raise_interrupted):
            proc.wait()
        return 0
    except Interrupted as e:
        return e.exit_code
    finally:
        stop()


class Shutdown:
    """The signals received while `on_signals` is active: the first is `signum`; every one is in `received`. The
    handler only records and wakes (the event, then each registered wake-up, e.g. an event loop cancelling its
    task): a second signal while something is being restored cannot cut the restore short."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.received: list[int] = []
        self._event = threading.Event()
        self._wakeups: list[Callable[[], None]] = []

    def record(self, signum: int, _frame: Any = None) -> None:
        self.received.append(signum)
        if self.signum is None:
            self.signum = signum
        self._event.set()
        for wake in list(self._wakeups):
            with contextlib.suppress(Exception):   # a closed loop: nothing left to wake
                wake()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Interrupted when a signal arrived: called between the steps of a long run."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def sleep(self, seconds: float) -> None:
        """time.sleep that ends with Interrupted as soon as a signal arrives."""
        if self._event.wait(max(0.0, seconds)):
            self.check()

    @contextlib.contextmanager
    def wakeup(self, wake: Callable[[], None]) -> Iterator[None]:
        """Call `wake` (from the handler, in the main thread) when a signal arrives during the block; at once when
        one already has."""
        self._wakeups.append(wake)
        try:
            if self.requested:
                wake()
            yield
        finally:
            self._wakeups.remove(wake)


_active: Shutdown | None = None
_NEVER = Shutdown()          # what `current()` gives when no block records signals: never requested


@contextlib.contextmanager
def on_signals(signals: Sequence[int] = TERMINATING) -> Iterator[Shutdown]:
    """Record `signals` in a Shutdown for the block instead of acting on them (see Shutdown); the previous handlers
    are back afterwards. Nested blocks share the outer one's Shutdown."""
    global _active
    if _active is not None:
        yield _active
        return
    sd = Shutdown()
    with handling(sd.record, signals) as installed:
        _active = sd if installed else None
        try:
            yield sd
        finally:
            _active = None


def current() -> Shutdown:
    """The Shutdown of the active `on_signals` block; outside one, a Shutdown no signal ever reaches."""
    return _active or _NEVER


@contextlib.contextmanager
def held(signals: Sequence[int] = TERMINATING) -> Iterator[Shutdown]:
    """Signals held off for the block (a teardown a second Ctrl-C must not cut short). Inside an `on_signals` block
    they stay recorded there; otherwise they are delivered again to the previous handlers afterwards, except a
    Ctrl-C while an exception is already on its way (it would only replace that exception)."""
    if _active is not None:
        yield _active
        return
    failure: BaseException | None = None
    with on_signals(signals) as sd:
        try:
            yield sd
        except BaseException as e:  # raised again below, once the held signals are delivered
            failure = e
    for s in dict.fromkeys(sd.received):
        if failure is None or s != signal.SIGINT:
            signal.raise_signal(s)     # the previous handler's turn (Ctrl-C -> KeyboardInterrupt, SIGTERM -> exit)
    if failure is not None:
        raise failure


async def interruptible(aw: Awaitable[T]) -> T:
    """Await `aw` as a task that the event loop cancels when a signal is recorded (`on_signals`); then Interrupted.
    The loop cancels it through call_soon_threadsafe, so it works on asyncio and uvloop alike, and from a thread."""
    sd = _active
    if sd is None:
        return await aw
    sd.check()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    with sd.wakeup(cancel):
        try:
            return await task
        except asyncio.CancelledError:
            sd.check()
            raise


# --- child processes --------------------------------------------------------------------------------------------

def prctl(option: int, arg: int) -> bool:
    """Linux prctl(2); False where there is none."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # pragma: no cover
        return False


# Runs between fork and the server's exec: the kernel sends the server argv[2] when its parent dies
# (PR_SET_PDEATHSIG = 1), and a parent that died before that took effect is noticed. A separate interpreter rather
# than preexec_fn, which is unsafe once the parent has threads (tests/test_layout.py keeps preexec_fn out of lib/).
_SHIM = ("import ctypes,os,sys\n"
         "try: ctypes.CDLL(None).prctl(1,int(sys.argv[2]),0,0,0)\n"
         "except (OSError,AttributeError): pass\n"
         "if os.getppid()!=int(sys.argv[1]): os._exit(137)\n"
         "try: os.execv(sys.argv[3],sys.argv[4:])\n"
         "except OSError as e: sys.stderr.write('cannot execute %s: %s\\n'%(sys.argv[3],e.strerror)); os._exit(127)\n")


def dying_with_parent(exe: str, argv: Sequence[str], death_signal: int = signal.SIGKILL) -> list[str]:
    """The command line that runs `exe` (a path) with `argv` (its argv[0] included), under the same pid, once the
    kernel is set to send it `death_signal` when this process dies, even by SIGKILL (Linux; elsewhere it just runs)."""
    return [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), str(int(death_signal)), exe, *argv]


def start_session(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """A helper process in a session (and process group) of its own: a Ctrl-C or SIGTERM aimed at this process's
    group does not reach it. stdin is closed unless given. OSError when it cannot start."""
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(list(argv), start_new_session=True, **popen)  # argv, no shell


class SessionChild:
    """`exe` with `argv` in a session of its own, stdout and stderr to `log_fd`; the kernel sends it `death_signal`
    when this process dies, even by SIGKILL (`dying_with_parent`). OSError when it cannot start."""

    def __init__(self, exe: str, argv: Sequence[str], log_fd: int, env: Mapping[str, str],
                 death_signal: int = signal.SIGKILL) -> None:
        self.proc = start_session(dying_with_parent(exe, argv, death_signal), stdout=log_fd, stderr=subprocess.STDOUT,
                                  env=dict(env))
        self.pid = self.proc.pid

    def _status(self) -> tuple[int, int] | None:
        """(si_code, si_status) once the leader has exited, without reaping it (its pid stays the group's id)."""
        try:
            r = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            rc = self.proc.returncode
            return (os.CLD_EXITED, rc) if rc is not None and rc >= 0 else (os.CLD_KILLED, -(rc or 9))
        return None if r is None else (r.si_code, r.si_status)

    def exited(self) -> str | None:
        """None while it runs; else how it ended ("exited with code 1", "was killed by SIGKILL")."""
        st = self._status()
        if st is None:
            return None
        code, status = st
        return f"exited with code {status}" if code == os.CLD_EXITED else f"was killed by {signal_name(status)}"

    def alive(self) -> bool:
        return self._status() is None

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._status() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def stop(self, grace: float, leader_signal: int | None = None) -> None:
        """SIGTERM to the group, or `leader_signal` to the leader alone (a server that stops its own children), twice
        when it is still there after REPEAT_S (a second Ctrl-C: uvicorn then stops waiting for its background tasks);
        SIGKILL to the group after `grace` and to any straggler once the leader is gone; then wait until no process of
        the group is left (at most 10 s more) and reap the leader."""
        if self.proc.returncode is None:
            if leader_signal is None:
                kill_group(self.pid, signal.SIGTERM)
            else:
                for _ in range(2):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(self.pid, leader_signal)
                    if self._wait(min(REPEAT_S, grace)):
                        break
            if not self._wait(grace):
                kill_group(self.pid, signal.SIGKILL)
                self._wait(10.0)
            kill_group(self.pid, signal.SIGKILL)    # the leader is not reaped yet: its pid is still this group's id
            deadline = time.monotonic() + 10.0
            while group_pids(self.pid) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)


def group_pids(pgid: int) -> list[int]:
    """The live processes (not zombies) of process group `pgid`."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(p.pid) == pgid and p.status() not in _GONE:
                out.append(p.pid)
    return out


def kill_group(pgid: int, sig: int) -> None:
    """Signal a process group; one that is gone (or not ours) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def pid_running(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def port_free(host: str, port: int) -> bool:
    """Nothing listens on host:port (a bind with SO_REUSEADDR succeeds, as the server's own bind would).
    OSError for a host that does not resolve or is not an address of this machine."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def wait_port_free(host: str, port: int, timeout: float, poll: float = 0.2) -> bool:
    """True once nothing listens on host:port (or nothing of ours could: the address is not here), False when
    `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if port_free(host, port):
                return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def readable(fd: Any, timeout: float) -> bool:
    """`fd` (a file or descriptor) has something to read, or end-of-file, within `timeout` seconds."""
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)


def lib_root() -> Path:
    """The folder holding the runbook package: put on PYTHONPATH for a helper started as `python -m runbook…`."""
    return Path(__file__).resolve().parents[2]
