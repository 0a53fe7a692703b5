"""Ports on a busy host (core/ports.py, env/ports.py): a start-up whose port another process takes meanwhile is
relaunched on a free port and the collision recorded with that process; production's own port held by another
process is the `env.host.port` finding naming it. The collisions are real: the test binds the port itself after
it was picked, and the servers are the real llama-server and SGLang."""
import os
import shlex
import socket
import threading
import time
from pathlib import Path

import pytest

from runbook.core import ports
from runbook.core import spec as specmod
from runbook.env import ports as envports
from runbook.tune import launch

REPO = Path(__file__).resolve().parents[1]
SGLANG_SPEC = REPO / "deployments" / "tiny-llama-sglang-cpu.yaml"


def _take_when(port: int, ready) -> tuple[threading.Thread, list[socket.socket]]:
    """A thread that binds and listens on `port` from this process as soon as `ready()` is true."""
    held: list[socket.socket] = []

    def take() -> None:
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        held.append(s)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return t, held


def _me(c: ports.Collision) -> bool:
    return any(h.pid == os.getpid() and h.state == "LISTEN" for h in c.holders)


# ------------------------------------------------------------------ who holds a port, production's own port


def test_holders_name_this_process_and_mask_secret_arguments(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        got = ports.holders(port)
        assert [(h.pid, h.state) for h in got] == [(os.getpid(), "LISTEN")]
        assert got[0].command.split()[0].endswith("python") or "python" in got[0].command
        assert ports.holders(port, exclude=[os.getpid()]) == []
    assert ports.holders(port) == []
    # a command line with a key: the value never shows
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--api-key", "sk-very-secret-1",
                          "HF_TOKEN=hf_secret_22"])
    try:
        time.sleep(0.3)
        cmd = ports.command_line(p.pid)
        assert "sk-very-secret-1" not in cmd and "hf_secret_22" not in cmd and cmd.count("***redacted***") == 2, cmd
    finally:
        p.kill()
        p.wait()


def test_production_port_held_by_another_process_is_a_finding_naming_it():
    dep = specmod.load(SGLANG_SPEC)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        dep = dep.model_copy(update={"serving": dep.serving.model_copy(update={"port": port})})
        (f,) = envports.check(dep)
        assert f.id == "env.host.port" and f.status == "fail"
        assert f.title.startswith(f"server {dep.name}: port {port} (serving.port) is held by pid {os.getpid()} (")
        assert "serving.port" in f.remedy
    (f,) = envports.check(dep)
    assert (f.status, f.title) == ("pass", f"server {dep.name}: port {port} is free (serving.port)")


def test_production_port_held_by_the_deployments_own_server_passes(sglang_server):
    """The session's SGLang server runs its spec's rendered ExecStart: the holder is recognised as the deployment's."""
    (f,) = envports.check(sglang_server.spec)
    assert (f.id, f.status) == ("env.host.port", "pass")
    assert f.title == (f"server {sglang_server.spec.name}: port {sglang_server.port} is held by the deployment's own "
                       f"server (pid {sglang_server.pid})")
    other = sglang_server.spec.model_copy(update={"systemd": sglang_server.spec.systemd.model_copy(
        update={"unit_name": "another"}), "model": sglang_server.spec.model.model_copy(update={"path": "/elsewhere"})})
    (g,) = envports.check(other)      # another deployment's spec on the same port: the server is not its own
    assert g.status == "fail" and f"held by pid {sglang_server.pid} (" in g.title


def test_a_connection_using_the_port_as_its_local_end_is_named_too():
    """The likeliest thief on a busy host: a client connection the kernel gave the picked port as its local end."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = ports.free_port()
        with socket.socket() as c:
            c.bind(("127.0.0.1", port))
            c.connect(srv.getsockname())
            conn, _ = srv.accept()
            with conn:
                got = ports.holders(port)
                assert [(h.pid, h.state) for h in got] == [(os.getpid(), "ESTABLISHED")]


def test_a_start_that_failed_for_another_reason_is_not_relaunched():
    calls = []

    def start(port: int) -> None:
        calls.append(port)
        raise launch.LaunchFailed("exited", "boom")

    with pytest.raises(launch.LaunchFailed, match="boom"):
        ports.relaunching(start, ports.free_port(), failed_log=lambda e: "ValueError: no KV cache left\n")
    assert len(calls) == 1


# ------------------------------------------------------------------ real collisions during start-up


@pytest.mark.llama
def test_tune_launch_relaunches_llama_server_whose_port_was_taken_during_start_up(tmp_path):
    """tune's launch path (launch.launched) with the real llama-server, which binds after a 2 s start-up here (a shell
    sleeps first, as SGLang loads for a minute): the test takes the port meanwhile."""
    from runbook.demo import llama as demo

    exe = demo.llama_server_path()
    if not exe.is_file():
        pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    model = demo.tiny_model() / "model.gguf"

    def argv(port: int) -> tuple[str, ...]:
        cmd = [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-c", "512"]
        return ("sh", "-c", f"sleep 2; exec {shlex.join(cmd)}")

    port = ports.free_port()
    log = tmp_path / "cand.log"
    t, held = _take_when(port, lambda: log.exists())     # the server is starting: the pre-launch check is behind it
    try:
        with launch.launched(launch.Launch(argv(port), log, port, ready_timeout_s=120,
                                           argv_for=lambda p: (argv(p), {}))) as srv:
            (c,) = srv.collisions
            assert srv.port == c.relaunched_on != port and srv.url.endswith(f":{srv.port}")
            assert _me(c) and "couldn't bind HTTP server socket" in c.evidence and f"port: {port}" in c.evidence
            assert c.text().startswith(f"port {port} taken by pid {os.getpid()} (")
            assert c.text().endswith(f"during start-up; relaunched on {srv.port}")
            lost = tmp_path / f"cand.port{port}.log"       # the lost attempt's log, kept
            assert "couldn't bind" in lost.read_text() and f"--port {srv.port}" not in log.read_text()
    finally:
        t.join(5)
        for s in held:
            s.close()


@pytest.mark.llama
def test_demo_llama_server_given_a_taken_port_comes_up_on_another():
    from runbook.demo import llama as demo

    if not demo.llama_server_path().is_file():
        pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with demo.start_llama_server(demo.llama_server_path(), port=port, parallel=1) as srv:
            (c,) = srv.collisions
            assert c.port == port and _me(c) and srv.url == f"http://127.0.0.1:{c.relaunched_on}"


@pytest.mark.llama
def test_no_relaunch_asked_the_collision_is_named_as_such(tmp_path):
    from runbook.demo import llama as demo

    if not demo.llama_server_path().is_file():
        pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            demo.start_llama_server(demo.llama_server_path(), port=port, parallel=1, relaunch=0)
    msg = str(e.value)
    assert "\n" not in msg and f"port {port} taken by pid {os.getpid()} (" in msg and "not relaunched again" in msg, msg


@pytest.mark.sglang
def test_sglang_whose_port_was_taken_during_start_up_is_relaunched(tmp_path):
    """The real case of issue 42: SGLang binds its port only when start-up ends; the test takes it meanwhile."""
    from runbook.demo import sglang as demo

    log = tmp_path / "server.log"
    port = ports.free_port()
    t, held = _take_when(port, lambda: log.exists() and log.stat().st_size > 0)    # SGLang is loading
    try:
        srv = demo.start(demo.deployment(port), log_path=log)
        try:
            (c,) = srv.collisions
            assert _me(c) and "[Errno 98]" in c.evidence, c
            assert srv.port == c.relaunched_on != port and srv.spec.serving.port == srv.port
            assert demo.fetch_json(srv.url + "/server_info")["port"] == srv.port
            assert "[Errno 98]" in (tmp_path / f"server.port{port}.log").read_text()
        finally:
            srv.stop()
    finally:
        t.join(5)
        for s in held:
            s.close()


def test_a_relaunched_candidate_is_a_tune_port_warning_not_a_failure():
    """tune's row keeps each collision (trials.run_candidate); findings make it `tune.port`, never `tune.failed`."""
    from runbook.tune import findings as tune_findings

    c = ports.Collision(41000, (ports.Holder(os.getpid(), "python -m pytest", "LISTEN"),), 41007,
                        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 41000)")
    row = {"name": "chunked-512", "status": "done", "port": 41007, "port_collisions": [c.to_dict()],
           "repeats": [{"status": "done", "port_collisions": [c.to_dict()]}]}
    got = tune_findings._ports(row)
    assert [f.id for f in got] == ["tune.port", "tune.port"] and {f.status for f in got} == {"warn"}
    assert got[0].title == (f"chunked-512: port 41000 taken by pid {os.getpid()} (python -m pytest) during start-up; "
                            "relaunched on 41007")
    assert "[Errno 98]" in got[0].evidence
