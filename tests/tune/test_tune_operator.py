"""What an operator sees from `runbook tune`: the help's metavars, the safety stop without --yes (its own exit
code and wording), the --resume command after an interrupt, and --plan-only without an SGLang parser saying the
flags were not checked."""
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO

from runbook import cli
from runbook.core import oscalls
from runbook.core.ports import free_port
from runbook.tune import trials as tune_run
from tune.procs import http_server

DEFAULT = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml"


def test_help_names_what_to_type(capsys):
    assert cli.main(["tune", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--resume RUN_ID" in out and "--archive DIR" in out and "--resume VALUE" not in out


def test_resume_command_repeats_the_flags_and_replaces_a_resume():
    argv = ["tune", "--deployment", "my spec.yaml", "--archive", "/a", "--yes", "--resume", "old-run", "--budget-s=60"]
    cmd = cli.resume_command(argv, "20260101T000000Z-x")
    assert cmd.endswith("tune --deployment 'my spec.yaml' --archive /a --yes --budget-s=60 --resume 20260101T000000Z-x")
    assert "old-run" not in cmd and cli.resume_command(["tune", "--resume=r1"], "r2").endswith("tune --resume r2")


def test_an_interrupt_prints_how_production_was_left_and_the_resume_command(monkeypatch, capsys):
    from runbook.core.findings import Finding

    def stopped(spec, s, **hooks):
        raise tune_run.Stopped(signal.SIGTERM, "20260101T000000Z-demo", [
            Finding("tune.production.restored", "pass", "production unit demo.service restored: active and ready")])

    monkeypatch.setattr(tune_run, "tune", stopped)
    code = cli.main(["tune", "--deployment", str(DEFAULT), "--yes"])
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGTERM == 143
    assert "runbook tune: stopped by SIGTERM" in err and "restored: active and ready" in err
    assert err.rstrip().endswith(f"to continue run 20260101T000000Z-demo: {sys.executable} -m runbook tune --deployment "
                                 f"{DEFAULT} --yes --resume 20260101T000000Z-demo")


def test_without_yes_an_active_production_unit_is_a_safety_stop(tmp_path, fake_systemd, capsys):
    import yaml

    port = free_port()
    data = yaml.safe_load(DEFAULT.read_text())
    data["serving"]["port"] = port
    data["model"]["card"] = str(REPO / "models" / "qwen3.5-397b-a17b-nvfp4")
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data))
    from runbook.core import spec as spec_mod
    unit = spec_mod.load(path).systemd.unit_name
    fake_systemd.declare(unit, http_server(tmp_path / "www", port), tmp_path / "prod.log")
    assert subprocess.run([*fake_systemd.systemctl, "start", unit]).returncode == 0
    try:
        code = cli.main(["tune", "--deployment", str(path), "--archive", str(tmp_path / "arch")])
        calls = [c[1:] for c in fake_systemd.calls() if c[0] == "systemctl"]
    finally:
        subprocess.run([*fake_systemd.systemctl, "stop", unit])
    err = capsys.readouterr().err
    assert code == cli.EXIT_SAFETY_STOP == 77
    assert err.startswith(f"runbook tune: safety stop: production unit {unit} is active") and "--yes" in err
    assert "error" not in err and err.count("\n") == 1
    assert not (tmp_path / "arch").exists()                  # stopped before anything was made, pre-check included
    assert calls == [["start", unit], ["is-active", unit]]      # asked, nothing stopped


@pytest.mark.serving      # about the serving environment (here: its absence); the marker rule goes by the variable's name
def test_plan_only_without_a_parser_says_the_flags_were_not_checked(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RUNBOOK_SERVING_PYTHON", raising=False)
    code = cli.main(["tune", "--deployment", str(DEFAULT), "--plan-only", "--candidates", "fp8-kv", "--json"])
    import json
    doc = json.loads(capsys.readouterr().out)
    pre = [f for f in doc["findings"] if f["id"] == "tune.precheck"]
    assert pre and all(f["status"] == "warn" and "flags were NOT checked" in f["title"] for f in pre), pre
    assert all("RUNBOOK_SERVING_PYTHON" in f["remedy"] for f in pre)
    assert code == 0 and cli.main(["tune", "--deployment", str(DEFAULT), "--plan-only", "--candidates", "fp8-kv",
                                   "--strict"]) == 1


def test_a_signal_during_a_synchronous_step_is_recorded_not_raised():
    """Inside on_signals a handler never raises into the running frame; check() raises where the run can stop. The
    handler it found is put back: SIG_DFL, or SIG_IGN under nohup (a suite started with nohup failed on SIG_DFL)."""
    before = signal.getsignal(signal.SIGHUP)
    with oscalls.on_signals() as sd:
        signal.raise_signal(signal.SIGHUP)
        assert sd.signum == signal.SIGHUP                  # reached here: nothing was raised
        with pytest.raises(oscalls.Interrupted) as e:
            sd.check()
    assert e.value.exit_code == 128 + signal.SIGHUP
    assert signal.getsignal(signal.SIGHUP) is before


def test_a_signal_cancels_a_coroutine_through_its_event_loop():
    """The benchmark and the guard run coroutines: the loop itself cancels them, on asyncio and on uvloop."""
    import asyncio
    import threading

    from runbook.endpoint.reach import run_sync

    async def long() -> None:
        await asyncio.sleep(30)

    for fast in (False, True):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()    # process-directed, as `kill` sends it
        with oscalls.on_signals(), pytest.raises(oscalls.Interrupted) as e:
            run_sync(long(), fast_loop=fast)
        assert e.value.signum == signal.SIGTERM
