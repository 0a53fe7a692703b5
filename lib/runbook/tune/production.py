"""Take the production unit down for a tune run and always bring it back.

`paused(unit, yes=..., ready_url=...)` does nothing when there is no unit or it is not active. An active unit
without `yes` is a `Refused`. With `yes` it first starts a watchdog (runbook/tune/watchdog.py: a separate
process in a session of its own), then stops the unit, runs the block, and restores the unit — start,
`systemctl is-active`, GET ready_url until 200 — however the block ends: normally, by an exception, Ctrl-C,
or SIGTERM/SIGHUP (handlers installed for the block; afterwards the previous handlers are back and the
signal is delivered to them again, so a default SIGTERM still ends the process — after the restore).
Signals are held off while restoring. If tune itself dies without restoring (SIGKILL, a crash of the
interpreter), the watchdog notices — the pipe whose write end only tune holds reaches end-of-file without
the "done" byte, or tune's pid is gone — stops any candidate unit tune launched (runbook-tune-*.service),
waits for the port and restores the unit itself; what it did is in its log (named in the `stopped` finding).
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runbook.core.errors import RunbookError
from runbook.core.findings import Finding
from runbook.tune.launch import UNIT_NAME, UNIT_PREFIX, HeldSignals, port_free
from runbook.tune.watchdog import Watchdog, WatchdogFailed

CTL_TIMEOUT_S = 180.0      # a stop or start of an SGLang unit: its TimeoutStopSec (90 s default) and some
PORT_FREE_S = 60.0         # before the restore: the candidate's port released
ACTIVE = ("active", "activating", "reloading")


class Refused(RunbookError):
    """The production unit is active and yes=False: one-line message naming the unit and `--yes`."""


class StopFailed(Refused):
    """The production unit could not be stopped (or its state not read, or the watchdog not started):
    tune does not go ahead; the unit was started again."""


@dataclass
class Pause:
    unit: str | None
    was_active: bool
    stopped: bool = False
    restored: bool | None = None
    findings: list[Finding] = field(default_factory=list)


class _Interrupted(BaseException):
    """SIGTERM/SIGHUP during the block: unwinds it like Ctrl-C so that the unit is restored."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def ctl(systemctl: Sequence[str], *args: str, timeout: float = CTL_TIMEOUT_S) -> tuple[int, str]:
    """(exit code, one line of what it said) for one bounded systemctl call; (-1, why) when it could not run."""
    try:
        cp = subprocess.run([*systemctl, *args], capture_output=True, text=True, timeout=timeout,  # noqa: S603
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    except OSError as e:
        return -1, f"cannot run {systemctl[0]}: {e.strerror or e}"
    lines = [x.strip() for x in (cp.stdout + "\n" + cp.stderr).splitlines() if x.strip()]
    return cp.returncode, (lines[0] if cp.returncode == 0 and lines else lines[-1] if lines else "")[:300]


def unit_state(systemctl: Sequence[str], unit: str) -> str:
    """`systemctl is-active UNIT`'s one word (active, inactive, failed, …); StopFailed when systemctl cannot answer."""
    code, said = ctl(systemctl, "is-active", unit, timeout=30.0)
    word = said.split()[0] if said else ""
    if code == -1 or not word.replace("-", "").isalnum():
        raise StopFailed(f"cannot tell whether production unit {unit} is active ({' '.join(systemctl)} is-active: "
                         f"{said or f'exit {code}'}): tune stops here; check systemd, or run tune on a spare host")
    return word


def _port(url: str | None) -> tuple[str, int] | None:
    if not url:
        return None
    u = urlsplit(url)
    try:
        return (u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80))
    except ValueError:
        return None


def restore(unit: str, systemctl: Sequence[str], ready_url: str | None, ready_timeout_s: float) -> tuple[bool, Finding]:
    """Start the unit (once its port is free), check it is active, wait until ready_url answers 200.
    (restored, the one finding that says so). Never raises."""
    from runbook.service import wait_ready

    addr = _port(ready_url) if ctl(systemctl, "is-active", unit, timeout=30.0)[0] != 0 else None
    deadline = time.monotonic() + PORT_FREE_S
    while addr and time.monotonic() < deadline:      # a candidate may still be letting go of the port
        with contextlib.suppress(OSError):
            if port_free(*addr):
                break
        time.sleep(0.5)
    start = f"{' '.join(systemctl)} start {unit}"
    code, said = ctl(systemctl, "start", unit)
    why = "" if code == 0 else f"`{start}` failed: {said or f'exit {code}'}"
    if not why:
        state = ctl(systemctl, "is-active", unit, timeout=30.0)[1].split()
        if not state or state[0] != "active":
            why = f"started, but `systemctl is-active {unit}` says {state[0] if state else 'nothing'}"
    if not why and ready_url:
        ok, last = wait_ready(ready_url, ready_timeout_s, interval=1.0)
        why = "" if ok else f"active, but {ready_url} did not answer 200 within {ready_timeout_s:g} s (last: {last})"
    if not why:
        return True, Finding("tune.production.restored", "pass", f"production unit {unit} restored: active"
                             + (" and ready" if ready_url else ""), evidence=ready_url or "")
    return False, Finding("tune.production.restore_failed", "fail", f"production unit {unit} was NOT restored", detail=why,
                          remedy=f"Start it by hand: `{start}`, then check `systemctl status {unit}` and `journalctl -u {unit}`.")


def _catch_signals() -> dict[int, Any]:
    """SIGTERM/SIGHUP raise _Interrupted in the block (main thread only); the previous handlers, to put back."""
    saved: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return saved

    def interrupt(signum: int, _frame: Any) -> None:
        raise _Interrupted(signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(OSError, ValueError):
            saved[s] = signal.signal(s, interrupt)
    return saved


def _put_back(saved: dict[int, Any]) -> None:
    for s, h in saved.items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(s, h)


def _stop(pause: Pause, unit: str, systemctl: Sequence[str], watchdog: Watchdog) -> None:
    stop = f"{' '.join(systemctl)} stop {unit}"
    code, said = ctl(systemctl, "stop", unit)
    if code != 0:
        raise StopFailed(f"cannot stop production unit {unit} (`{stop}`: {said or f'exit {code}'}): tune does not go ahead")
    pause.stopped = True
    pause.findings.append(Finding("tune.production.stopped", "info", f"production unit {unit} stopped for the tune run",
                                  evidence=f"{stop}; watchdog log {watchdog.log} (removed unless it had to act)",
                                  remedy="It is started again when tune ends, however it ends."))


@contextlib.contextmanager
def paused(unit: str | None, *, yes: bool, ready_url: str | None, ready_timeout_s: float = 600.0,
           systemctl: Sequence[str] = ("systemctl",)) -> Iterator[Pause]:
    """unit None or not active → nothing stopped, nothing restored. Active and not yes → Refused. Otherwise stop
    it, yield, and ALWAYS restore it (see the module docstring for how, and on what)."""
    pause = Pause(unit, False)
    if unit is None:
        yield pause
        return
    if not UNIT_NAME.match(unit):
        raise Refused(f"production unit name {unit!r} is not a systemd unit name (letters, digits, :_.-@, "
                      "not starting with -): fix the spec's systemd unit")
    pause.was_active = unit_state(systemctl, unit) in ACTIVE
    if not pause.was_active:
        yield pause
        return
    if not yes:
        raise Refused(f"production unit {unit} is active: tune stops it for the run and restores it afterwards; "
                      "pass --yes to allow that, or run tune on a spare host")
    try:
        watchdog = Watchdog(systemctl, stop_units=(f"{UNIT_PREFIX}*.service",), restore_unit=unit, ready_url=ready_url,
                            ready_timeout_s=ready_timeout_s)
    except WatchdogFailed as e:
        raise StopFailed(f"{e}; production unit {unit} was not stopped") from None
    saved = _catch_signals()
    signum = None
    try:
        _stop(pause, unit, systemctl, watchdog)
        yield pause
    except _Interrupted as e:
        signum = e.signum
        raise
    finally:
        _put_back(saved)
        with HeldSignals():      # a second Ctrl-C or SIGTERM must not stop the restore half way
            pause.restored, finding = restore(unit, systemctl, ready_url, ready_timeout_s)
            pause.findings.append(finding)
            watchdog.disarm()
        if signum is not None:
            signal.raise_signal(signum)      # the previous handler's turn (default: the process ends with the signal)
