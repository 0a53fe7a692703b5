"""Take the production unit down for a tune run and always bring it back.

`paused(unit, yes=..., ready_url=...)` does nothing when there is no unit or it is not active. An active unit
without `yes` is a `Refused`. With `yes` it first starts a watchdog (runbook/tune/watchdog.py: a separate
process in a session of its own), then stops the unit, runs the block, and restores the unit — start,
`systemctl is-active`, GET ready_url until 200 — however the block ends: normally, by an exception (an
`oscalls.Interrupted` when tune's run records a SIGINT/SIGTERM/SIGHUP), or Ctrl-C. Signals are held off while
restoring: a second one cannot cut the restore short. If tune itself dies without restoring (SIGKILL, a crash of the
interpreter), the watchdog notices — the pipe whose write end only tune holds reaches end-of-file without
the "done" byte, or tune's pid is gone — stops any candidate unit tune launched (runbook-tune-*.service),
waits for the port and restores the unit itself; what it did is in its log (named in the `stopped` finding).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from runbook.core import oscalls
from runbook.core.errors import RunbookError, SafetyStop
from runbook.core.findings import Finding
from runbook.core.oscalls import CommandFailed, port_free
from runbook.tune.launch import UNIT_NAME, UNIT_PREFIX
from runbook.tune.watchdog import Watchdog, WatchdogFailed

CTL_TIMEOUT_S = 180.0      # a stop or start of an SGLang unit: its TimeoutStopSec (90 s default) and some
PORT_FREE_S = 60.0         # before the restore: the candidate's port released
ACTIVE = ("active", "activating", "reloading")


class Refused(RunbookError):
    """tune does not go ahead with the production unit: one-line message naming the unit and what to do."""


class NotAllowed(Refused, SafetyStop):
    """The production unit is active and yes=False: a safety stop naming the unit and `--yes`."""


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


def unit_state(systemctl: Sequence[str], unit: str) -> str:
    """`systemctl is-active UNIT`'s one word (active, inactive, failed, …); StopFailed when systemctl cannot answer."""
    try:
        return oscalls.is_active(systemctl, unit)
    except CommandFailed as e:
        raise StopFailed(f"cannot tell whether production unit {unit} is active ({' '.join(systemctl)} is-active: "
                         f"{e.reason}): tune stops here; check systemd, or run tune on a spare host") from None


def _state(systemctl: Sequence[str], unit: str) -> str:
    """is-active's word, or why there is none (for a message, never raised)."""
    try:
        return oscalls.is_active(systemctl, unit)
    except CommandFailed as e:
        return f"unknown ({e.reason})"


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

    addr = _port(ready_url) if _state(systemctl, unit) != "active" else None
    deadline = time.monotonic() + PORT_FREE_S
    while addr and time.monotonic() < deadline:      # a candidate may still be letting go of the port
        with contextlib.suppress(OSError):
            if port_free(*addr):
                break
        time.sleep(0.5)
    start = f"{' '.join(systemctl)} start {unit}"
    try:
        oscalls.systemctl(systemctl, "start", unit, timeout=CTL_TIMEOUT_S, check=True)
        why = ""
    except CommandFailed as e:
        why = f"`{start}` failed: {e.reason}"
    if not why:
        state = _state(systemctl, unit)
        if state != "active":
            why = f"started, but `systemctl is-active {unit}` says {state}"
    if not why and ready_url:
        ok, last = wait_ready(ready_url, ready_timeout_s, interval=1.0)
        why = "" if ok else f"active, but {ready_url} did not answer 200 within {ready_timeout_s:g} s (last: {last})"
    if not why:
        return True, Finding("tune.production.restored", "pass", f"production unit {unit} restored: active"
                             + (" and ready" if ready_url else ""), evidence=ready_url or "")
    return False, Finding("tune.production.restore_failed", "fail", f"production unit {unit} was NOT restored", detail=why,
                          remedy=f"Start it by hand: `{start}`, then check `systemctl status {unit}` and `journalctl -u {unit}`.")


def _stop(pause: Pause, unit: str, systemctl: Sequence[str], watchdog: Watchdog) -> None:
    stop = f"{' '.join(systemctl)} stop {unit}"
    try:
        oscalls.systemctl(systemctl, "stop", unit, timeout=CTL_TIMEOUT_S, check=True)
    except CommandFailed as e:
        raise StopFailed(f"cannot stop production unit {unit} (`{stop}`: {e.reason}): tune does not go ahead") from None
    pause.stopped = True
    pause.findings.append(Finding("tune.production.stopped", "info", f"production unit {unit} stopped for the tune run",
                                  evidence=f"{stop}; watchdog log {watchdog.log} (removed unless it had to act)",
                                  remedy="It is started again when tune ends, however it ends."))


def require_consent(unit: str | None, *, yes: bool, systemctl: Sequence[str] = ("systemctl",)) -> bool:
    """Whether the production unit is active; NotAllowed when it is and `yes` is not given (StopFailed when
    systemctl cannot tell, Refused for a name that is not a unit's)."""
    if unit is None:
        return False
    if not UNIT_NAME.match(unit):
        raise Refused(f"production unit name {unit!r} is not a systemd unit name (letters, digits, :_.-@, "
                      "not starting with -): fix the spec's systemd unit")
    active = unit_state(systemctl, unit) in ACTIVE
    if active and not yes:
        raise NotAllowed(f"production unit {unit} is active: tune stops it for the run and restores it afterwards; "
                         "pass --yes to allow that, or run tune on a spare host")
    return active


@contextlib.contextmanager
def paused(unit: str | None, *, yes: bool, ready_url: str | None, ready_timeout_s: float = 600.0,
           systemctl: Sequence[str] = ("systemctl",)) -> Iterator[Pause]:
    """unit None or not active → nothing stopped, nothing restored. Active and not yes → NotAllowed. Otherwise stop
    it, yield, and ALWAYS restore it (see the module docstring for how, and on what)."""
    pause = Pause(unit, False)
    pause.was_active = require_consent(unit, yes=yes, systemctl=systemctl)
    if unit is None or not pause.was_active:
        yield pause
        return
    try:
        watchdog = Watchdog(systemctl, stop_units=(f"{UNIT_PREFIX}*.service",), restore_unit=unit, ready_url=ready_url,
                            ready_timeout_s=ready_timeout_s)
    except WatchdogFailed as e:
        raise StopFailed(f"{e}; production unit {unit} was not stopped") from None
    if oscalls.current().requested:      # a signal while the watchdog started: production is left as it is
        watchdog.disarm()
        oscalls.current().check()
    try:
        _stop(pause, unit, systemctl, watchdog)
        yield pause
    finally:
        with oscalls.held():      # a second Ctrl-C or SIGTERM must not stop the restore half way
            pause.restored, finding = restore(unit, systemctl, ready_url, ready_timeout_s)
            pause.findings.append(finding)
            watchdog.disarm()
