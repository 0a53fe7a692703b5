"""Restore the production unit when tune dies without restoring it (SIGKILL, a crash of the interpreter).

    python -m runbook.tune.watchdog --pid TUNE_PID --unit UNIT --log FILE [--ready-url URL] [--ready-timeout S] -- SYSTEMCTL...

Started by production.paused() in a session of its own, before the unit is stopped, with stdin the read end
of a pipe whose write end only tune holds. It prints "armed" and then waits. The "done" byte on the pipe means
tune restored the unit itself: exit 0. End-of-file without it, or tune's pid gone, means tune died: stop the
candidate units tune may have left (runbook-tune-*.service), then restore the unit as tune would have (start,
is-active, ready) and write what happened to the log. Exit 0 when restored, 1 when not.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import select
import sys
from pathlib import Path

POLL_S = 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def wait_for_tune(pid: int, done: bytes) -> bool:
    """True when tune said "done"; False when it died without saying it."""
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready:
            data = os.read(0, 64)
            if done in data:
                return True
            if not data:
                return False
        elif not _alive(pid):
            return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.tune.watchdog")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--unit", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--ready-url")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("systemctl", nargs="+")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        with open(a.log, "a", encoding="utf-8") as fh:
            fh.write(f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} {msg}\n")

    from runbook.tune.launch import UNIT_PREFIX
    from runbook.tune.production import DONE, ctl, restore

    log(f"armed: restores {a.unit} if tune (pid {a.pid}) dies before restoring it")
    print("armed", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)     # tune stops reading: later writes must not hit a closed pipe
    if wait_for_tune(a.pid, DONE):
        Path(a.log).unlink(missing_ok=True)     # tune restored the unit itself: nothing to tell
        return 0
    log(f"tune (pid {a.pid}) ended without restoring {a.unit}: restoring it")
    code, said = ctl(a.systemctl, "stop", f"{UNIT_PREFIX}*.service")
    log(f"stop {UNIT_PREFIX}*.service: exit {code} {said}".rstrip())
    restored, finding = restore(a.unit, a.systemctl, a.ready_url, a.ready_timeout)
    log(f"{finding.status}: {finding.title}" + (f" — {finding.detail}" if finding.detail else "")
        + (f" — {finding.remedy}" if finding.remedy else ""))
    return 0 if restored else 1


if __name__ == "__main__":
    sys.exit(main())
