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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from runbook.core import oscalls
from runbook.core.errors import RunbookError, SafetyStop
from runbook.core.findings import Finding
from runbook.core.oscalls import CommandFailed
from runbook.tune.launch import UNIT_NAME, UNIT_PREFIX
from runbook.tune.restore import CTL_TIMEOUT_S, restore
from runbook.tune.watchdog import Watchdog, WatchdogFailed

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
