"""launched(): real servers (llama-server, a Python HTTP server) started, refused, failed and always torn down."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runbook.core.ports import free_port
from runbook.tune.launch import Launch, LaunchFailed, launched, port_free
from tune.procs import http_server, pid_gone, sigint_default

REPO = Path(__file__).resolve().parents[2]


def llama_argv(port: int, *extra: str) -> tuple[str, ...]:
    from runbook.demo import llama as demo

    exe = demo.llama_server_path()
    if not exe.is_file():
        pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    model = demo.tiny_model() / "model.gguf"
    return (str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-np", "1", "-c", "512",
            "--no-cache-prompt", "--cache-ram", "0", *extra)


def sleeper(seconds: int = 120) -> tuple[str, ...]:
    """A server that never answers (nothing listens)."""
    return (sys.executable, "-c", f"import time; time.sleep({seconds})")


@pytest.mark.llama
def test_llama_server_ready_then_gone(tmp_path):
    port = free_port()
    log = tmp_path / "logs" / "cand.log"
    with launched(Launch(llama_argv(port), log, port, ready_timeout_s=60)) as run:
        assert run.url == f"http://127.0.0.1:{port}" and run.alive() and run.pid
        assert 0 < run.ready_s < 60 and not port_free("127.0.0.1", port)
        pid = run.pid
    assert pid_gone(pid) and not run.alive() and port_free("127.0.0.1", port)
    assert oct(log.stat().st_mode & 0o777) == "0o600" and f"listening on http://127.0.0.1:{port}" in log.read_text()


@pytest.mark.llama
def test_llama_server_bad_flag_exits_fast_with_reason(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as e, launched(Launch(llama_argv(port, "--no-such-flag"), tmp_path / "c.log", port)):
        pass
    assert e.value.kind == "exited" and time.monotonic() - t0 < 20
    msg = str(e.value)
    assert "\n" not in msg and "exited with code 1" in msg and "no-such-flag" in msg, msg
    assert "no-such-flag" in e.value.log_tail and port_free("127.0.0.1", port)


def test_taken_port_refused_without_launching(tmp_path):
    port = free_port()
    marker = tmp_path / "started"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(LaunchFailed) as e, launched(Launch((sys.executable, "-c", f"open({str(marker)!r}, 'w')"),
                                                               tmp_path / "c.log", port)):
            pass
    assert e.value.kind == "port" and f"port {port}" in str(e.value) and "already in use" in str(e.value)
    assert not marker.exists() and not (tmp_path / "c.log").exists()


def test_never_ready_is_a_timeout_within_the_bound_and_killed(tmp_path):
    port = free_port()
    pidfile = tmp_path / "pid"
    argv = (sys.executable, "-c", f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(120)")
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as e, launched(Launch(argv, tmp_path / "c.log", port, ready_timeout_s=1.5)):
        pass
    took = time.monotonic() - t0
    assert e.value.kind == "timeout" and 1.5 <= took < 1.5 + 5, took
    assert "not ready within 1.5 s" in str(e.value) and "Connection refused" in str(e.value)
    assert pid_gone(int(pidfile.read_text()))


def test_missing_or_not_executable_is_spawn(tmp_path):
    for argv in (("/nonexistent/llama-server", "-m", "x"), (str(tmp_path),), ("no-such-server-binary-xyz",)):
        with pytest.raises(LaunchFailed) as e, launched(Launch(argv, tmp_path / "c.log", free_port())):
            pass
        assert e.value.kind == "spawn" and argv[0] in str(e.value), str(e.value)
    plain = tmp_path / "server.sh"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(LaunchFailed, match="not executable") as e, launched(Launch((str(plain),), tmp_path / "c.log", free_port())):
        pass


def test_keyboard_interrupt_in_block_tears_down(tmp_path):
    port = free_port()
    with pytest.raises(KeyboardInterrupt), launched(Launch(tuple(http_server(tmp_path / "www", port)), tmp_path / "c.log",
                                                           port, ready_timeout_s=30)) as run:
        pid = run.pid
        raise KeyboardInterrupt
    assert pid_gone(pid) and port_free("127.0.0.1", port)


def test_ctrl_c_while_waiting_for_readiness_tears_down(tmp_path):
    import _thread
    import threading

    pidfile = tmp_path / "pid"
    argv = (sys.executable, "-c", f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(120)")
    threading.Timer(1.0, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt), launched(Launch(argv, tmp_path / "c.log", free_port(), ready_timeout_s=30)):
        pytest.fail("never ready: the block must not run")
    assert pid_gone(int(pidfile.read_text()))


def test_signals_are_held_off_while_tearing_down():
    from runbook.core import oscalls

    with pytest.raises(KeyboardInterrupt), oscalls.held() as held:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert held.received == [signal.SIGINT]     # noted, not raised: the teardown goes on
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_recorded_signal_ends_the_readiness_wait_and_tears_down(tmp_path):
    """Inside tune's run a signal is recorded, not raised: the readiness wait sees it at once."""
    from runbook.core import oscalls

    pidfile = tmp_path / "pid"
    argv = (sys.executable, "-c", f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(120)")
    import threading
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    with oscalls.on_signals(), pytest.raises(oscalls.Interrupted) as e, \
            launched(Launch(argv, tmp_path / "c.log", free_port(), ready_timeout_s=60)):
        pytest.fail("never ready: the block must not run")
    assert e.value.signum == signal.SIGTERM and time.monotonic() - t0 < 20
    assert pid_gone(int(pidfile.read_text()))


@pytest.mark.parametrize("argv, env, what", [
    ((sys.executable, "-c", "pass\0"), {}, "NUL byte"),
    ((sys.executable,), {"BAD=NAME": "x"}, "'BAD=NAME'"),
    ((sys.executable,), {"-x": "x"}, "'-x'"),
])
def test_what_no_exec_can_carry_is_spawn(tmp_path, argv, env, what):
    with pytest.raises(LaunchFailed, match=what) as e, launched(Launch(argv, tmp_path / "c.log", free_port(), env=env)):
        pass
    assert e.value.kind == "spawn" and not (tmp_path / "c.log").exists()


def test_term_ignoring_server_and_its_children_are_killed(tmp_path, monkeypatch):
    """SIGTERM ignored by the leader and a grandchild: SIGKILL to the whole group after the grace period."""
    from runbook.tune import launch as mod

    monkeypatch.setattr(mod, "GRACE_S", 0.5)
    port = free_port()
    kid = tmp_path / "kid"
    script = tmp_path / "srv.py"
    script.write_text(textwrap.dedent(f"""
        import http.server, os, signal, subprocess, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        p = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
        open({str(kid)!r}, "w").write(str(p.pid))
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
        http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """))
    with launched(Launch((sys.executable, str(script)), tmp_path / "c.log", port, ready_timeout_s=30)) as run:
        pid = run.pid
    assert pid_gone(pid) and pid_gone(int(kid.read_text())) and port_free("127.0.0.1", port)


def test_candidate_killed_mid_run_is_not_alive_and_exit_does_not_hang(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    with launched(Launch(tuple(http_server(tmp_path / "www", port)), tmp_path / "c.log", port, ready_timeout_s=30)) as run:
        os.kill(run.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while run.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not run.alive()
    assert time.monotonic() - t0 < 15 and port_free("127.0.0.1", port)


@pytest.mark.parametrize("systemd", [False, True], ids=["child", "systemd"])
def test_candidate_dies_with_tune_on_sigkill(tmp_path, fake_systemd, systemd):
    """tune killed by SIGKILL: the kernel kills a child candidate (PR_SET_PDEATHSIG); the watchdog stops a unit."""
    port = free_port()
    script = tmp_path / "tune.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from runbook.tune.launch import Launch, launched
        argv = {tuple(http_server(tmp_path / "www", port))!r}
        with launched(Launch(argv, Path({str(tmp_path / "c.log")!r}), {port}, ready_timeout_s=30, systemd={systemd})) as run:
            print(run.pid, flush=True)
            time.sleep(300)
    """))
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"), TMPDIR=str(tmp_path))   # the watchdog log lands there
    tune = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, preexec_fn=sigint_default)
    try:
        pid = int(tune.stdout.readline())
        tune.kill()
        tune.wait(10)
        deadline = time.monotonic() + 15
        while not (pid_gone(pid) and port_free("127.0.0.1", port)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_gone(pid) and port_free("127.0.0.1", port)
    finally:
        tune.kill()
    assert (["systemctl", "stop", f"runbook-tune-{port}.service"] in fake_systemd.calls()) is systemd


def test_env_reaches_server_and_secrets_are_scrubbed_from_the_tail(tmp_path):
    secret = "hf_TOPSECRET_value_123"
    argv = (sys.executable, "-c", "import os,sys; print('token is', os.environ['HF_TOKEN']); sys.exit(3)")
    with pytest.raises(LaunchFailed) as e, launched(Launch(argv, tmp_path / "c.log", free_port(), env={"HF_TOKEN": secret})):
        pass
    assert e.value.kind == "exited" and "exited with code 3" in str(e.value)
    assert secret in (tmp_path / "c.log").read_text()          # the server's own log is the server's (mode 0600)
    assert secret not in str(e.value) and secret not in e.value.log_tail and "***redacted***" in e.value.log_tail


def test_unresolvable_host_is_refused_before_launch(tmp_path):
    with pytest.raises(LaunchFailed) as e, launched(Launch(sleeper(), tmp_path / "c.log", free_port(), host="no-such-host.invalid")):
        pass
    assert e.value.kind == "port" and "\n" not in str(e.value)


# ---------------------------------------------------------------- the systemd path (fake systemd-run/systemctl:
# systemd is not PID 1 in CI containers; tests/tune/fake_systemd.py starts and stops real processes)

def test_systemd_unit_ready_then_stopped(tmp_path, fake_systemd):
    port = free_port()
    log = tmp_path / "unit.log"
    secret = "sk-unit-secret-987654"
    launch = Launch(tuple(http_server(tmp_path / "www", port)), log, port, systemd=True, ready_timeout_s=30,
                    env={"API_KEY": secret})
    with launched(launch) as run:
        assert run.alive() and run.pid == fake_systemd.main_pid(f"runbook-tune-{port}.service")
        pid = run.pid
    assert pid_gone(pid) and not run.alive() and port_free("127.0.0.1", port)
    calls = fake_systemd.calls()
    start = next(c for c in calls if c[0] == "systemd-run")
    assert f"--unit=runbook-tune-{port}.service" in start and "--collect" in start
    assert f"--property=StandardOutput=file:{log}" in start and "--setenv=API_KEY" in start
    assert secret not in str(calls)                                   # the value travels in the environment only
    assert ["systemctl", "stop", f"runbook-tune-{port}.service"] in calls
    assert oct(log.stat().st_mode & 0o777) == "0o600" and "GET /health" in log.read_text()


def test_systemd_unit_that_exits_is_exited_with_code(tmp_path, fake_systemd):
    argv = (sys.executable, "-c", "import sys; print('bad flag --frobnicate'); sys.exit(2)")
    with pytest.raises(LaunchFailed) as e, launched(Launch(argv, tmp_path / "u.log", free_port(), systemd=True, unit_name="cand-a")):
        pass
    assert e.value.kind == "exited" and "exited with code 2" in str(e.value) and "frobnicate" in str(e.value)
    assert ["systemctl", "stop", "cand-a.service"] in fake_systemd.calls()


def test_systemd_dollar_is_escaped_and_bad_names_refused(tmp_path, fake_systemd):
    port = free_port()
    www = tmp_path / "a$HOME"
    with launched(Launch(tuple(http_server(www, port)), tmp_path / "u.log", port, systemd=True, ready_timeout_s=30)):
        pass
    start = next(c for c in fake_systemd.calls() if c[0] == "systemd-run")
    assert str(tmp_path / "a$$HOME") in start
    for bad in ({"unit_name": "x; rm -rf /"}, {"unit_name": "--force"}, {"log_path": Path("rel.log")},
                {"log_path": tmp_path / "a b.log"}, {"log_path": tmp_path / "100%.log"}):
        kw = {"log_path": tmp_path / "u.log", **bad}
        with pytest.raises(LaunchFailed) as e, launched(Launch(sleeper(), port=free_port(), systemd=True, **kw)):
            pass
        assert e.value.kind == "spawn"


def test_systemd_missing_or_old_is_spawn(tmp_path, fake_systemd, monkeypatch):
    monkeypatch.setenv("FAKE_SYSTEMD_VERSION", "219")
    with pytest.raises(LaunchFailed, match="older than 236") as e, launched(Launch(sleeper(), tmp_path / "u.log", free_port(),
                                                                                systemd=True)):
        pass
    assert e.value.kind == "spawn"
    monkeypatch.setenv("FAKE_SYSTEMD_VERSION", "252")
    monkeypatch.setenv("FAKE_SYSTEMD_FAIL", f"systemd-run:runbook-tune-{(port := free_port())}.service")
    with pytest.raises(LaunchFailed, match="systemd-run could not start") as e, launched(Launch(sleeper(), tmp_path / "u.log",
                                                                                              port, systemd=True)):
        pass
    assert e.value.kind == "spawn"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_run_properties_are_valid_for_systemd(tmp_path):
    """Differential: the properties and service type given to systemd-run, written as a unit file, pass systemd's
    own `systemd-analyze verify` (which works without systemd running); a misspelt one is caught."""
    from runbook.tune.launch import systemd_run_argv

    argv = systemd_run_argv(Launch(("/bin/sleep", "5"), tmp_path / "u.log", 8000, env={"HF_TOKEN": "x" * 8}),
                            "/bin/sleep", "runbook-tune-8000.service", user=False)
    props = [a.split("=", 1)[1] for a in argv if a.startswith("--property=")]
    service_type = next(a.split("=", 1)[1] for a in argv if a.startswith("--service-type="))

    def verify(lines: list[str]) -> str:
        unit = tmp_path / "runbook-tune-8000.service"
        unit.write_text("\n".join(["[Service]", f"Type={service_type}", "ExecStart=/bin/sleep 5", *lines]) + "\n")
        cp = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        return "\n".join(x for x in (cp.stdout + cp.stderr).splitlines() if unit.name in x)

    assert verify(props) == ""
    assert "Failed to parse kill mode" in verify([*props, "KillMode=control-grup"])     # the check can fail
    stop_int = systemd_run_argv(Launch(("/bin/sleep", "5"), tmp_path / "u.log", 8000, stop_signal=signal.SIGINT),
                                "/bin/sleep", "runbook-tune-8000.service", user=False)
    props = [a.split("=", 1)[1] for a in stop_int if a.startswith("--property=")]
    assert "KillSignal=SIGINT" in props and verify(props) == ""
