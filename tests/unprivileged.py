"""A process that file permissions stop, for the tests of read-only directories, wherever the checkout lives.

Root writes anywhere, so as root the command runs as uid 0 with no capabilities (`setpriv --bounding-set=-all`):
the kernel then checks file modes as for any user, and the directory under test belongs to `nobody` (mode 0755),
so this process may read it and not write it: the error path an operator without root meets. Not as `nobody`
itself: nobody cannot import the checkout, or the interpreter and venv it runs on, when they sit under a
folder only root may enter (root's home is 0700: "No module named runbook"), while root without capabilities
still reads what root owns, wherever it is. Without root there is nothing to drop: the directory is 0555.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

NOBODY = 65534
LIB = str(Path(__file__).resolve().parents[1] / "lib")
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONPATH": LIB, "PYTHONDONTWRITEBYTECODE": "1"}


def _prefix() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "skip_reason() said setpriv is there"
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


@functools.cache
def skip_reason() -> str | None:
    """Why such a process cannot be had here, or None. Probed once: the drop must work and still import runbook."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        return "as root, needs setpriv (util-linux) to drop root's capabilities"
    probe = "import runbook.cli; print('ok')"
    try:
        cp = subprocess.run([*_prefix(), sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env=ENV, cwd="/tmp")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"setpriv --bounding-set=-all failed here: {e}"
    if cp.returncode != 0 or "ok" not in cp.stdout:
        tail = (cp.stderr.strip().splitlines() or ["no output"])[-1]
        return f"root without capabilities cannot run {sys.executable} on {LIB} here: {tail}"
    return None


def run(argv: Sequence[str | os.PathLike], timeout: float = 120) -> subprocess.CompletedProcess:
    """argv (an interpreter first) without the privilege to write what it does not own; env and cwd as cron's."""
    return subprocess.run([*_prefix(), *map(str, argv)], capture_output=True, text=True, timeout=timeout, env=ENV, cwd="/tmp")


@contextlib.contextmanager
def readonly_dir(prefix: str) -> Iterator[Path]:
    """An empty directory that `run` may read and not write: nobody's, 0755, as root; 0555 otherwise. The test
    is skipped, saying why, where no such process can be had."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        if os.geteuid() == 0:
            os.chown(d, NOBODY, NOBODY)
            os.chmod(d, 0o755)
        else:
            os.chmod(d, 0o555)
        yield d
    finally:
        os.chmod(d, 0o755)
        shutil.rmtree(d, ignore_errors=True)
