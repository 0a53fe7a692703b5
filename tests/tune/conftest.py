import json
import os
import signal
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

FAKE = Path(__file__).with_name("fake_systemd.py")


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt during each tune test, whatever pytest inherited (procs.sigint_default)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """systemd-run and systemctl stand-ins (tests/tune/fake_systemd.py) first on PATH, state in a temp dir."""
    bin_dir, state = tmp_path / "fakebin", tmp_path / "systemd-state"
    bin_dir.mkdir()
    state.mkdir()
    for tool in ("systemd-run", "systemctl"):
        exe = bin_dir / tool
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" {tool} "$@"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD_STATE", str(state))

    def calls() -> list[list[str]]:
        log = state / "calls.jsonl"
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    def declare(unit: str, argv: list[str], log: Path) -> None:
        (state / f"{unit}.cmd.json").write_text(json.dumps({"argv": argv, "log": str(log)}))

    def main_pid(unit: str) -> int | None:
        p = state / f"{unit}.pid"
        return int(p.read_text()) if p.exists() else None

    yield SimpleNamespace(bin=bin_dir, state=state, calls=calls, declare=declare, main_pid=main_pid,
                          systemctl=[str(bin_dir / "systemctl")])
    # Nothing a test started may outlive it: the units' process groups, and (when a failing test left a restore in
    # flight, e.g. a watchdog starting the unit after this teardown read the pid files) anything whose command line
    # names this test's directory.
    for p in state.glob("*.pid"):
        with __import__("contextlib").suppress(OSError, ValueError):
            os.killpg(int(p.read_text()), 9)
    _kill_naming(str(tmp_path))


def _kill_naming(path: str) -> None:
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) != os.getpid() and path.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), 9)
        except OSError:
            pass
