"""The process between the runner and papermill: whatever ends, nothing of the notebook outlives it.

    python reaper.py RUNNER_PID -- COMMAND...

Run by the runner as a script in a new session (its signals and prctl calls are core/oscalls.py's). It

- becomes a child subreaper (Linux), so the kernel that papermill starts in a session of its own
  is re-parented to the reaper, not to init, if papermill dies first;
- asks the kernel (Linux PR_SET_PDEATHSIG) for SIGTERM when the runner dies, even by SIGKILL, and
  also polls the runner's pid, for kernels without that call;
- on SIGTERM/SIGINT/SIGHUP, on the runner's death and when the command exits, kills every process
  below it (SIGKILL) and exits: 128+signal, or the command's exit code.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil

from runbook.core import oscalls


def _descendants() -> list:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:  # pragma: no cover
        return []


def kill_descendants() -> None:
    """SIGKILL everything below this process (twice: a dying parent can spawn or re-parent one)."""
    for _ in range(2):
        procs = _descendants()
        if not procs:
            return
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(procs, timeout=5)  # we are their subreaper: this reaps them too


def _end(code: int) -> None:
    kill_descendants()
    os._exit(code)


def _on_signal(signum: int, _frame: object) -> None:
    _end(128 + signum)


def _watch_parent(runner_pid: int) -> None:
    while True:
        if os.getppid() != runner_pid:
            _end(128 + signal.SIGTERM)
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: reaper.py RUNNER_PID -- COMMAND...", file=sys.stderr)
        return 2
    runner_pid, cmd = int(argv[0]), argv[2:]
    with oscalls.handling(_on_signal):
        oscalls.prctl(oscalls.PR_SET_CHILD_SUBREAPER, 1)
        oscalls.prctl(oscalls.PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != runner_pid:  # the runner died before the line above took effect
            return 128 + signal.SIGTERM
        # SIGKILLed by the kernel if the reaper dies before it can kill it
        proc = subprocess.Popen(oscalls.dying_with_parent(shutil.which(cmd[0]) or cmd[0], cmd, signal.SIGKILL))
        threading.Thread(target=_watch_parent, args=(runner_pid,), daemon=True).start()
        rc = proc.wait()
        kill_descendants()  # an orphaned kernel, if papermill left one
        return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
