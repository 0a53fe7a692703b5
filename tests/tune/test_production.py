"""paused(): a production stand-in (a real HTTP server run as a unit by tests/tune/fake_systemd.py) stopped for
the block and restored — after a normal exit, an exception, SIGTERM, and SIGKILL of tune (by the watchdog)."""
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from runbook.core.ports import free_port
from runbook.tune.launch import port_free
from runbook.tune.production import Refused, StopFailed, paused, unit_state
from tune.procs import http_server, sigint_default

REPO = Path(__file__).resolve().parents[2]
UNIT = "prod-llm.service"


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def eventually(check, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def prod(tmp_path, fake_systemd):
    """The production unit, declared and running: GET /health on its port answers 200."""
    port = free_port()
    fake_systemd.declare(UNIT, http_server(tmp_path / "www", port), tmp_path / "prod.log")
    url = f"http://127.0.0.1:{port}/health"
    assert subprocess.run([*fake_systemd.systemctl, "start", UNIT]).returncode == 0
    assert eventually(lambda: ready(url), 15)
    fake_systemd.url, fake_systemd.port = url, port
    return fake_systemd


def verbs(fake) -> list[str]:
    return [" ".join(c[1:]) for c in fake.calls() if c[0] == "systemctl"]


def test_no_unit_or_inactive_unit_changes_nothing(fake_systemd):
    with paused(None, yes=True, ready_url=None, systemctl=fake_systemd.systemctl) as p:
        assert (p.unit, p.was_active, p.stopped, p.restored, p.findings) == (None, False, False, None, [])
    fake_systemd.declare(UNIT, ["/bin/true"], Path("/dev/null"))
    with paused(UNIT, yes=True, ready_url=None, systemctl=fake_systemd.systemctl) as p:
        assert not p.was_active and not p.stopped
    assert p.restored is None and p.findings == [] and verbs(fake_systemd) == [f"is-active {UNIT}"]


def test_active_without_yes_is_refused_and_nothing_stopped(prod):
    with pytest.raises(Refused) as e, paused(UNIT, yes=False, ready_url=prod.url, systemctl=prod.systemctl):
        pytest.fail("the block must not run")
    assert UNIT in str(e.value) and "--yes" in str(e.value) and "\n" not in str(e.value)
    assert verbs(prod) == [f"start {UNIT}", f"is-active {UNIT}"] and ready(prod.url)


def test_stopped_during_the_block_and_restored_after(prod):
    with paused(UNIT, yes=True, ready_url=prod.url, ready_timeout_s=30, systemctl=prod.systemctl) as p:
        assert p.was_active and p.stopped and unit_state(prod.systemctl, UNIT) == "inactive"
        assert port_free("127.0.0.1", prod.port)
    assert p.restored and ready(prod.url) and unit_state(prod.systemctl, UNIT) == "active"
    assert [f.id for f in p.findings] == ["tune.production.stopped", "tune.production.restored"]
    log = Path(p.findings[0].evidence.split("watchdog log ")[1].split()[0])
    assert eventually(lambda: not log.exists(), 10)       # the watchdog saw "done", removed its log and left


def test_restored_after_an_exception(prod):
    with pytest.raises(ZeroDivisionError), paused(UNIT, yes=True, ready_url=prod.url, systemctl=prod.systemctl) as p:
        assert not ready(prod.url)
        raise ZeroDivisionError
    assert p.restored and ready(prod.url)


def test_restore_failure_names_the_unit_and_the_command(prod, monkeypatch):
    monkeypatch.setenv("FAKE_SYSTEMD_FAIL", f"start:{UNIT}")
    with paused(UNIT, yes=True, ready_url=prod.url, ready_timeout_s=2, systemctl=prod.systemctl) as p:
        pass
    f = p.findings[-1]
    assert p.restored is False and f.id == "tune.production.restore_failed" and f.status == "fail"
    assert UNIT in f.title and f"{' '.join(prod.systemctl)} start {UNIT}" in f.remedy and "failed" in f.detail


def test_stop_failure_does_not_go_ahead(prod, monkeypatch):
    monkeypatch.setenv("FAKE_SYSTEMD_FAIL", f"stop:{UNIT}")
    with pytest.raises(StopFailed, match=f"cannot stop production unit {UNIT}"), paused(
            UNIT, yes=True, ready_url=prod.url, systemctl=prod.systemctl):
        pytest.fail("the block must not run")
    assert ready(prod.url)


def test_systemctl_missing_is_refused(tmp_path):
    with pytest.raises(StopFailed, match="cannot tell whether production unit"), paused(
            UNIT, yes=True, ready_url=None, systemctl=[str(tmp_path / "no-systemctl")]):
        pass


def _tune(prod, tmp_path: Path, with_candidate: bool) -> subprocess.Popen:
    """A tune process holding the unit paused (and, optionally, a candidate on the production port)."""
    script = tmp_path / "tune.py"
    cand = (f"launched(Launch({tuple(http_server(tmp_path / 'cand', prod.port))!r}, Path({str(tmp_path / 'c.log')!r}), "
            f"{prod.port}, ready_timeout_s=30))" if with_candidate else "contextlib.nullcontext()")
    script.write_text(textwrap.dedent(f"""
        import contextlib, sys
        from pathlib import Path
        from runbook.core import oscalls
        from runbook.tune.launch import Launch, launched
        from runbook.tune.production import paused
        with oscalls.on_signals() as shutdown:       # as tune's run records them
            try:
                with paused({UNIT!r}, yes=True, ready_url={prod.url!r}, ready_timeout_s=30, systemctl={prod.systemctl!r}) as p:
                    with {cand}:
                        print(p.findings[0].evidence.split("watchdog log ")[1].split()[0], flush=True)
                        shutdown.sleep(300)
            except oscalls.Interrupted as e:
                sys.exit(e.exit_code)
    """))
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"), TMPDIR=str(tmp_path))   # the watchdog log lands there
    tune = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, preexec_fn=sigint_default)
    tune.watchdog_log = Path(tune.stdout.readline().strip())
    return tune


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_restored_after_a_signal_to_tune(prod, tmp_path, sig):
    tune = _tune(prod, tmp_path, with_candidate=True)
    try:
        assert unit_state(prod.systemctl, UNIT) == "inactive"
        tune.send_signal(sig)
        # restored first, then ended with the signal's exit code
        assert tune.wait(60) == 128 + sig
        assert ready(prod.url) and unit_state(prod.systemctl, UNIT) == "active"
    finally:
        tune.kill()
    assert not tune.watchdog_log.exists()       # tune restored it itself: the watchdog was disarmed


def test_bad_unit_name_is_refused_before_any_systemctl_call(fake_systemd):
    for bad in ("--force", "a b.service", "x;reboot"):
        with pytest.raises(Refused, match="not a systemd unit name"), paused(bad, yes=True, ready_url=None,
                                                                             systemctl=fake_systemd.systemctl):
            pass
    assert fake_systemd.calls() == []


@pytest.mark.parametrize("with_candidate", [False, True], ids=["idle", "candidate-on-the-port"])
def test_watchdog_restores_after_sigkill_of_tune(prod, tmp_path, with_candidate):
    tune = _tune(prod, tmp_path, with_candidate)
    try:
        assert unit_state(prod.systemctl, UNIT) == "inactive" and ready(prod.url) is with_candidate
        tune.kill()
        tune.wait(10)
        assert eventually(lambda: ready(prod.url) and unit_state(prod.systemctl, UNIT) == "active", 60)
    finally:
        tune.kill()
    assert eventually(lambda: f"pass: production unit {UNIT} restored" in tune.watchdog_log.read_text(), 10)
    assert "ended without undoing" in tune.watchdog_log.read_text()
