"""SIGTERM, SIGINT or SIGHUP sent to `python -m runbook tune --yes` in each phase of a real run — a llama-server
candidate on the port of a production stand-in (a real HTTP server run as a unit by tests/tune/fake_systemd.py):
the candidate is taken down, production is started, active and ready again within 60 s of the signal, tune exits
128+signal and prints the `--resume` command. The benchmark phase runs on asyncio and on uvloop, in one process
and in two worker processes. Each test prints its restore time (signal to production ready)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from runbook.core import spec as spec_mod
from runbook.core.ports import free_port
from tune.procs import http_server, pid_gone, sigint_default
from tune.test_tune_llama import REPO, write_spec

pytestmark = pytest.mark.llama
CHILD = Path(__file__).with_name("tune_child.py")
RESTORE_BOUND_S = 60.0
# A benchmark and a guard long enough (seconds on the tiny CPU model) for a signal to land inside them.
LONGER = {"concurrency": [2], "requests_per_level": 12, "output_len": 48,
          "guard": {"identity_prompts": 4, "identity_max_tokens": 48, "min_identical_tokens": 8, "recall_lengths": [256],
                    "toolcall": False}}
# phase: (the mark to wait for, the variant, seconds after the mark before the signal)
PHASES = {
    "precheck": ("precheck", "uvloop", 0.5),
    "launch": ("launch", "uvloop", 0.5),
    "launch-systemd-run": ("launch", "uvloop,unit", 0.5),
    "readiness": ("ready", "uvloop,slow-start", 1.0),
    "bench-asyncio": ("bench", "asyncio", 1.0),
    "bench-uvloop": ("bench", "uvloop", 1.0),
    "bench-asyncio-2-workers": ("pool", "asyncio,w2", 0.5),
    "bench-uvloop-2-workers": ("pool", "uvloop,w2", 0.5),
    "guard": ("guard", "uvloop", 0.3),
    "archive": ("archive", "uvloop", 0.5),
}
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
# One handler takes all three (oscalls.on_signals: Shutdown.record), so each phase gets one signal, in turn: each
# signal lands in a synchronous step, on an event loop and in the worker pool (the 30 pairs took 5.5 min on 2 cores;
# tests/tune/test_tune_operator.py holds the handler's mechanics for every signal).
CASES = [(phase, SIGNALS[i % len(SIGNALS)]) for i, phase in enumerate(PHASES)]


def _answers(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _state(fake, unit: str) -> str:
    return subprocess.run([*fake.systemctl, "is-active", unit], capture_output=True, text=True).stdout.strip()


def _production_ready(fake, unit: str, port: int) -> bool:
    """The unit is active and what answers on the port is production (http.server: /health 200, no /v1/models)."""
    base = f"http://127.0.0.1:{port}"
    return _state(fake, unit) == "active" and _answers(base + "/health") == 200 and _answers(base + "/v1/models") == 404


def _wait_mark(marks: Path, phase: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marks.exists() and phase in marks.read_text().split():
            return
        if proc.poll() is not None:
            pytest.fail(f"tune ended (exit {proc.returncode}) before phase {phase}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    pytest.fail(f"phase {phase} never started")


def _left_behind(tmp_path: Path) -> list[str]:
    """tune's own children still running (the benchmark's worker processes, the candidate server), known by the
    TMPDIR they inherited from it."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"TMPDIR={tmp_path}".encode() in env and ("multiprocessing" in cmd or "llama-server" in cmd):
            out.append(f"{proc.name}: {cmd}")
    return out


@pytest.fixture
def production(tmp_path, fake_systemd):
    """A tune spec (one llama-server candidate: the reference) whose production unit is running on its port."""
    port = free_port()
    path = write_spec(tmp_path, {}, port, **LONGER)
    unit = spec_mod.load(path).systemd.unit_name
    fake_systemd.declare(unit, http_server(tmp_path / "www", port), tmp_path / "prod.log")
    assert subprocess.run([*fake_systemd.systemctl, "start", unit]).returncode == 0
    deadline = time.monotonic() + 15
    while not _production_ready(fake_systemd, unit, port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _production_ready(fake_systemd, unit, port)
    fake_systemd.spec, fake_systemd.unit, fake_systemd.port = path, unit, port
    yield fake_systemd
    subprocess.run([*fake_systemd.systemctl, "stop", unit])


def _start_tune(prod, tmp_path: Path, variant: str, session: bool = False) -> tuple[subprocess.Popen, Path, Path]:
    marks, arch = tmp_path / "marks", tmp_path / "arch"
    if "unit" in variant:          # candidates as transient units (systemd-run) rather than child processes
        data = yaml.safe_load(prod.spec.read_text())
        data["tune"]["systemd_run"] = True
        prod.spec.write_text(yaml.safe_dump(data, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "lib"), str(REPO / "tests")]), TMPDIR=str(tmp_path))
    argv = ["tune", "--deployment", str(prod.spec), "--archive", str(arch), "--yes"]
    proc = subprocess.Popen([sys.executable, str(CHILD), str(marks), variant, "--", *argv], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default,
                            start_new_session=session)
    return proc, marks, arch


def _restore_time(prod, t_signal: float) -> float:
    """Seconds from the signal until production is active and ready again (fails past the bound)."""
    while time.monotonic() - t_signal < RESTORE_BOUND_S:
        if _production_ready(prod, prod.unit, prod.port):
            return time.monotonic() - t_signal
        time.sleep(0.05)
    pytest.fail(f"production was not restored within {RESTORE_BOUND_S:g} s of the signal "
                f"(is-active: {_state(prod, prod.unit)})")


def _check_ended(prod, proc: subprocess.Popen, sig: int, arch: Path, tmp_path: Path) -> str:
    """tune exited 128+signal with the resume command, having restored production itself; its stderr."""
    try:
        proc.wait(RESTORE_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Exception in callback" not in err and "Traceback" not in err, err[-3000:]
    run_id = re.search(r"run (\S+): started", err).group(1)
    assert f"stopped by {signal.Signals(sig).name}" in err
    resume = re.search(r"to continue run (\S+): (.*)", err)
    assert resume and resume.group(1) == run_id, err[-2000:]
    assert resume.group(2).endswith(f"--resume {run_id}") and "--yes" in resume.group(2) and str(arch) in resume.group(2)
    assert (arch / "tune" / run_id / "run.json").is_file()
    assert not list(tmp_path.glob("runbook-tune-watchdog-*.log")), "the watchdog had to act: tune did not restore itself"
    deadline = time.monotonic() + 10
    while _left_behind(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _left_behind(tmp_path)
    return err


@pytest.mark.parametrize(("phase", "sig"), CASES, ids=[f"{p}-{s.name}" for p, s in CASES])
def test_a_signal_in_each_phase_restores_production(production, tmp_path, phase, sig):
    mark, variant, delay = PHASES[phase]
    proc, marks, arch = _start_tune(production, tmp_path, variant)
    try:
        _wait_mark(marks, mark, proc)
        time.sleep(delay)
        assert proc.poll() is None, f"tune ended before the signal: {proc.stderr.read()[-2000:]}"
        seen = marks.read_text().split()
        t_signal = time.monotonic()
        proc.send_signal(sig)
        restore_s = _restore_time(production, t_signal)
        err = _check_ended(production, proc, sig, arch, tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the signal landed in the phase meant: the phases after it never started
    after = {"precheck": "launch", "launch": "bench", "ready": "bench", "bench": "guard", "pool": "guard",
             "guard": "archive", "archive": None}[mark]
    assert after is None or after not in marks.read_text().split(), marks.read_text()
    if phase.startswith("bench"):
        assert f"loop:{variant.split(',')[0]}" in seen, seen
        assert ("pool" in seen) is ("w2" in variant)
    rows = list(arch.glob("tune/*/candidates/*.json"))
    assert (len(rows) == 1) is (phase == "archive")           # a candidate cut short is not archived: --resume runs it
    if "unit" in variant:
        assert ["systemctl", "stop", f"runbook-tune-{production.port}.service"] in production.calls()
    stopped = any(c[1:3] == ["stop", production.unit] for c in production.calls())
    assert stopped is (phase != "precheck")                   # the pre-check runs before production is touched
    assert "restored: active and ready" in err or phase == "precheck"
    print(f"\nRESTORE {phase} {signal.Signals(sig).name} {restore_s:.2f} s")


def test_a_second_signal_during_the_restore_does_not_stop_it(production, tmp_path):
    """Then a Ctrl-C as a terminal sends it, to tune's whole process group, while `systemctl start` runs."""
    proc, marks, arch = _start_tune(production, tmp_path, "uvloop", session=True)
    try:
        _wait_mark(marks, "bench", proc)
        time.sleep(1.0)
        t_signal = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not any(c[1:3] == ["start", production.unit] for c in production.calls()[1:]) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)        # while production is being started again
        proc.send_signal(signal.SIGTERM)
        restore_s = _restore_time(production, t_signal)
        _check_ended(production, proc, signal.SIGTERM, arch, tmp_path)    # the first signal's code
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nRESTORE second-signal SIGTERM+SIGINT+SIGTERM {restore_s:.2f} s")
    assert json.loads((next(arch.glob("tune/*/run.json"))).read_text())["candidates"] == ["reference"]
    assert pid_gone(proc.pid)
