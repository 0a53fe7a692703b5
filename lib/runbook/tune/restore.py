"""Bring the production unit back: start it once the candidate has let go of its port, check it is active, wait
until it answers. Used by tune (production.paused) and by its watchdog when tune died without restoring; a leaf
of tune's process layer, so the watchdog and production do not import each other."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from runbook.core import oscalls
from runbook.core.findings import Finding
from runbook.core.oscalls import CommandFailed, port_free
from runbook.service import wait_ready

CTL_TIMEOUT_S = 180.0      # a stop or start of an SGLang unit: its TimeoutStopSec (90 s default) and some
PORT_FREE_S = 60.0         # before the restore: the candidate's port released


def state(systemctl: Sequence[str], unit: str) -> str:
    """is-active's word, or why there is none (for a message, never raised)."""
    try:
        return oscalls.is_active(systemctl, unit)
    except CommandFailed as e:
        return f"unknown ({e.reason})"


def port_of(url: str | None) -> tuple[str, int] | None:
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
    addr = port_of(ready_url) if state(systemctl, unit) != "active" else None
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
        now = state(systemctl, unit)
        if now != "active":
            why = f"started, but `systemctl is-active {unit}` says {now}"
    if not why and ready_url:
        ok, last = wait_ready(ready_url, ready_timeout_s, interval=1.0)
        why = "" if ok else f"active, but {ready_url} did not answer 200 within {ready_timeout_s:g} s (last: {last})"
    if not why:
        return True, Finding("tune.production.restored", "pass", f"production unit {unit} restored: active"
                             + (" and ready" if ready_url else ""), evidence=ready_url or "")
    return False, Finding("tune.production.restore_failed", "fail", f"production unit {unit} was NOT restored", detail=why,
                          remedy=f"Start it by hand: `{start}`, then check `systemctl status {unit}` and `journalctl -u {unit}`.")
