"""Undo what tune left running or stopped when tune dies without undoing it itself (SIGKILL, a crash).

    python -m runbook.tune.watchdog --pid TUNE_PID --log FILE [--stop UNIT]... [--unit UNIT [--ready-url URL]
                                    [--ready-timeout S]] -- SYSTEMCTL...

`Watchdog(...)` starts it in a session of its own (so a Ctrl-C or SIGTERM aimed at tune's group does not
reach it), with stdin the read end of a pipe whose write end only tune holds, and waits until it says
"armed". `disarm()` writes the "done" byte and closes the pipe: the watchdog removes its log and exits.
End-of-file without that byte, or tune's pid gone, means tune died: the watchdog stops the `--stop`
units (the candidate transient units; a pattern such as runbook-tune-*.service is allowed, as systemctl
allows it), then restores `--unit` as tune would have (restore.restore: start once the port is free,
is-active, ready) and writes what it did to its log. Exit 0 when all went well, 1 when not.

Used by production.paused() (stops candidates, restores the production unit) and by launch.launched() in
systemd mode (stops the candidate's transient unit, which no PR_SET_PDEATHSIG can reach).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from runbook.core import oscalls
from runbook.core.errors import RunbookError
from runbook.core.oscalls import CommandFailed
from runbook.tune.restore import restore

POLL_S = 1.0
ARM_TIMEOUT_S = 30.0       # the watchdog's interpreter starting on a loaded host
DONE = b"d"                # written by tune to the pipe once it has undone everything itself


class WatchdogFailed(RunbookError):
    """The watchdog could not be started: the caller changes nothing."""


class Watchdog:
    """The tune side: start `python -m runbook.tune.watchdog` detached and armed; `disarm()` when done."""

    def __init__(self, systemctl: Sequence[str], *, stop_units: Sequence[str] = (), restore_unit: str | None = None,
                 ready_url: str | None = None, ready_timeout_s: float = 600.0) -> None:
        fd, log = tempfile.mkstemp(prefix="runbook-tune-watchdog-", suffix=".log")
        os.close(fd)
        self.log = Path(log)
        read, self.write = os.pipe()     # not inheritable (PEP 446): no server tune starts gets the write end
        lib = str(oscalls.lib_root())     # runbook importable however this process found it
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (lib, os.environ.get("PYTHONPATH", "")) if p))
        argv = [sys.executable, "-m", "runbook.tune.watchdog", f"--pid={os.getpid()}", f"--log={log}",   # NAME=VALUE:
                *(f"--stop={u}" for u in stop_units), *([f"--unit={restore_unit}"] if restore_unit else []),   # a value
                *([f"--ready-url={ready_url}"] if ready_url else []), f"--ready-timeout={ready_timeout_s:g}",  # is never
                "--", *systemctl]                                                                          # an option
        try:
            self.proc = oscalls.start_session(argv, stdin=read, stdout=oscalls.PIPE, stderr=oscalls.DEVNULL, env=env,
                                              cwd="/")
        except OSError as e:
            os.close(self.write)
            raise WatchdogFailed(f"cannot start the watchdog ({sys.executable}): {e.strerror or e}") from None
        finally:
            os.close(read)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline() if oscalls.readable(self.proc.stdout, ARM_TIMEOUT_S) else b""
        self.proc.stdout.close()
        if line.strip() != b"armed":
            self.disarm()
            self.proc.kill()
            raise WatchdogFailed(f"the watchdog did not start within {ARM_TIMEOUT_S:g} s (see {log})")

    def disarm(self) -> None:
        """All is undone: say so (the "done" byte), close the pipe, let the watchdog exit."""
        if self.write < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self.write, DONE)
        with contextlib.suppress(OSError):
            os.close(self.write)
        self.write = -1
        with contextlib.suppress(oscalls.TimeoutExpired):
            self.proc.wait(10.0)


def wait_for_tune(pid: int) -> bool:
    """True when tune said "done"; False when it died without saying it."""
    while True:
        if oscalls.readable(0, POLL_S):
            data = os.read(0, 64)
            if DONE in data:
                return True
            if not data:
                return False
        elif not oscalls.pid_running(pid):
            return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.tune.watchdog")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--stop", action="append", default=[])
    ap.add_argument("--unit")
    ap.add_argument("--ready-url")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("systemctl", nargs="+")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        with open(a.log, "a", encoding="utf-8") as fh:
            fh.write(f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} {msg}\n")

    log(f"armed for tune pid {a.pid}: stops {', '.join(a.stop) or 'nothing'}; restores {a.unit or 'nothing'}")
    print("armed", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)     # tune stops reading: a later write must not hit a closed pipe
    if wait_for_tune(a.pid):
        Path(a.log).unlink(missing_ok=True)          # tune undid everything itself: nothing to tell
        return 0
    log(f"tune (pid {a.pid}) ended without undoing what it changed")
    ok = True
    for unit in a.stop:
        try:
            oscalls.systemctl(a.systemctl, "stop", unit, check=True)
            log(f"stop {unit}: exit 0")
        except CommandFailed as e:
            ok = False
            log(f"stop {unit}: {e.reason}")
    if a.unit:
        restored, finding = restore(a.unit, a.systemctl, a.ready_url, a.ready_timeout)
        ok &= restored
        log(f"{finding.status}: {finding.title}" + (f" — {finding.detail}" if finding.detail else "")
            + (f" — {finding.remedy}" if finding.remedy else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
