"""One notebook through papermill's CLI, in a session of its own under the reaper (runner/reaper.py): its exit,
its bound, and the runner's SIGTERM/SIGINT handler that kills what is running."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from runbook.core import oscalls

_DEAD_KERNEL = 138
_REAPER = Path(__file__).with_name("reaper.py")
# Sessions (reaper pids) of the notebooks running now, killed by the runner's SIGTERM/SIGINT handler.
_CHILDREN: set[int] = set()


def _kill_tree(pid: int) -> None:
    """SIGKILL a notebook's reaper, its session and everything below it (the kernel has a session of its own)."""
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    oscalls.kill_group(pid, signal.SIGKILL)  # the reaper leads its session: anything else left in it
    psutil.wait_procs(procs, timeout=10)


def on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGINT of the runner: end the running notebook's processes, then exit 128+signal.

    The half-built run stays in its 0700 .inprogress folder; the next run of the deployment removes it."""
    for pid in list(_CHILDREN):
        _kill_tree(pid)
    try:
        print(f"runbook: stopped by signal {signum}; the running notebook and its kernel were killed", file=sys.stderr, flush=True)
    finally:
        os._exit(128 + signum)


def _error_line(stderr: str) -> str:
    """The most telling line of papermill's stderr: the last 'SomethingError: …' line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln):
            return ln[:500]
    return (lines[-1] if lines else "no output")[:500]


def execute(nb: Path, out_nb: Path, parameters: dict[str, Any], cwd: Path, timeout: float, log_path: Path,
            kernel: str | None = None) -> tuple[int | None, str | None, bool]:
    """Run one notebook through papermill's CLI in its own process group.

    Parameters travel as one JSON document through `-y`, so their types survive. Returns
    (exit code or None on timeout, error text, timed_out)."""
    cmd = [sys.executable, str(_REAPER), str(os.getpid()), "--", sys.executable, "-m", "papermill", str(nb), str(out_nb), "-y",
           json.dumps(parameters),
           "--cwd", str(cwd), "--no-progress-bar", "--log-output", "--execution-timeout", str(int(max(1, timeout)))]
    if kernel:
        cmd += ["-k", kernel]
    lib = os.pathsep.join(p for p in (str(oscalls.lib_root()), os.environ.get("PYTHONPATH", "")) if p)   # the reaper's import
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline", PYTHONUNBUFFERED="1", PYTHONPATH=lib)
    with open(log_path, "w", encoding="utf-8") as logf:  # inside the 0700 in-progress folder
        proc = oscalls.start_session(cmd, stdout=logf, stderr=oscalls.STDOUT, env=env, cwd=str(cwd))
        _CHILDREN.add(proc.pid)
        try:
            rc = proc.wait(timeout=timeout + 30)  # papermill's per-cell bound fires first; this catches the rest
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            return None, f"timed out after {timeout:.0f} s (per-notebook bound); notebook and kernel killed", True
        finally:
            _CHILDREN.discard(proc.pid)
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if rc == 0:
        return 0, None, False
    if rc == _DEAD_KERNEL:
        return rc, "kernel died (out of memory or killed): " + _error_line(text), False
    if "CellTimeoutError" in text or "Cell execution timed out" in text:
        return rc, f"timed out after {timeout:.0f} s in one cell (per-notebook bound)", True
    return rc, _error_line(text), False


def kernel_for(nb: Path, requested: str | None, log: Callable[[str], None]) -> str | None:
    """--kernel, else None (the notebook's own kernel) when it is installed, else "python3": ipykernel's
    kernel on this interpreter (a pip-installed runbook has no "runbook" kernel registered)."""
    if requested:
        return requested
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel  # lazy: ~45 ms, only when a notebook runs

    try:
        name = ((json.loads(nb.read_text(encoding="utf-8")).get("metadata") or {}).get("kernelspec") or {}).get("name")
    except (OSError, ValueError, AttributeError):
        return None                    # papermill reports the unreadable notebook itself
    try:
        if name:
            KernelSpecManager().get_kernel_spec(name)
        return None
    except NoSuchKernel:
        log(f"{nb.stem}: kernel {name!r} is not installed; running it on this interpreter's python3 kernel")
        return "python3"
