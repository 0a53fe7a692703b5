"""The OS layer's one failure model (CommandFailed: the command, its exit code, its stderr's tail) and its signal
save/restore, on real commands and real signals."""
import os
import signal
import sys
import time

import pytest

from runbook.core import oscalls
from runbook.core.errors import RunbookError


def _script(tmp_path, body: str) -> str:
    p = tmp_path / "tool"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return str(p)


def test_a_command_that_cannot_run_times_out_or_fails_is_one_error(tmp_path):
    with pytest.raises(oscalls.CommandFailed) as e:
        oscalls.call([str(tmp_path / "no-such-systemctl"), "is-active", "x"])
    assert e.value.code is None and e.value.reason.startswith("cannot run") and isinstance(e.value, RunbookError)
    with pytest.raises(oscalls.CommandFailed) as e:
        oscalls.call([_script(tmp_path, "sleep 5")], timeout=0.3)
    assert e.value.code is None and e.value.reason == "timed out after 0.3 s"
    tool = _script(tmp_path, "echo noise >&2; echo 'Job for x.service failed.' >&2; exit 5")
    assert oscalls.call([tool]).returncode == 5          # without check: the caller reads the answer
    with pytest.raises(oscalls.CommandFailed) as e:
        oscalls.call([tool, "start", "x.service"], check=True)
    assert (e.value.argv, e.value.code, e.value.stderr_tail) == ([tool, "start", "x.service"], 5, "Job for x.service failed.")
    assert str(e.value) == f"`{tool} start x.service`: exit 5: Job for x.service failed." and "\n" not in str(e.value)


def test_is_active_reads_the_word_or_says_unknown_without_systemd(tmp_path):
    assert oscalls.is_active([_script(tmp_path, "echo inactive; exit 3")], "x") == "inactive"
    no_bus = _script(tmp_path, "echo 'Failed to connect to bus: Host is down' >&2; exit 1")
    assert oscalls.is_active([no_bus], "x") == "unknown"
    with pytest.raises(oscalls.CommandFailed):
        oscalls.is_active([_script(tmp_path, "echo '<html>'")], "x")


def test_a_journal_stream_reports_its_exit_after_the_lines(tmp_path):
    tool = _script(tmp_path, "echo one; echo two; echo 'No journal files' >&2; exit 1")
    s = oscalls.journal([tool], timeout=30, limit=1024)
    assert list(s.lines) == [b"one\n", b"two\n"] and s.failure is not None
    assert s.failure.code == 1 and s.failure.reason == "exit 1: No journal files"
    slow = oscalls.journal([_script(tmp_path, "echo first; sleep 30")], timeout=0.5, limit=1024)
    t0 = time.monotonic()
    assert list(slow.lines) == [b"first\n"] and time.monotonic() - t0 < 10
    assert slow.failure is not None and "deadline" in slow.failure.reason


def test_handlers_come_back_however_the_block_ends():
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(ZeroDivisionError), oscalls.handling(lambda *a: None, (signal.SIGHUP,)):
        assert signal.getsignal(signal.SIGHUP) is not before
        raise ZeroDivisionError
    assert signal.getsignal(signal.SIGHUP) == before


def test_a_second_signal_is_recorded_and_the_first_one_counts():
    with oscalls.on_signals() as sd:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while len(sd.received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with oscalls.on_signals() as inner:             # nested: the same record
            assert inner is sd
        assert sd.received == [signal.SIGTERM, signal.SIGINT] and sd.signum == signal.SIGTERM
        t0 = time.monotonic()
        with pytest.raises(oscalls.Interrupted):
            sd.sleep(30)                                # a pause ends at once once a signal is in
        assert time.monotonic() - t0 < 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_session_child_is_stopped_with_its_group(tmp_path):
    kid = tmp_path / "kid"
    code = (f"import signal,subprocess,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']); open({str(kid)!r},'w').write(str(p.pid)); "
            f"time.sleep(300)")
    child = _python_child(tmp_path, code, kid)
    assert child.alive() and os.getpgid(child.pid) == child.pid != os.getpgid(0)
    child.stop(grace=0.5)                                # SIGTERM ignored: SIGKILL to the whole group
    assert not child.alive() and child.exited() == "was killed by SIGKILL"
    assert not oscalls.pid_running(int(kid.read_text()))


def _python_child(tmp_path, code: str, marker) -> oscalls.SessionChild:
    """A Python child in a session of its own, returned once it has written `marker` (its handlers are set)."""
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    child = oscalls.SessionChild(sys.executable, [sys.executable, "-c", code], fd, os.environ)
    os.close(fd)
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return child


@pytest.mark.parametrize("death_signal", [signal.SIGKILL, signal.SIGTERM])
def test_a_session_child_gets_its_death_signal_when_its_parent_is_sigkilled(tmp_path, death_signal):
    """What the demo's SGLang (SIGTERM: it still stops its scheduler) and every other server (SIGKILL) rely on."""
    import subprocess

    got, kid = tmp_path / "got", tmp_path / "kid"
    leaf = (f"import os,signal,time; signal.signal(signal.SIGTERM, lambda *a: (open({str(got)!r},'w').write('TERM'), "
            f"os._exit(0))); open({str(kid)!r},'w').close(); time.sleep(300)")
    code = (f"import os,sys,time; from runbook.core import oscalls\n"
            f"c = oscalls.SessionChild(sys.executable, [sys.executable, '-c', {leaf!r}], 2, os.environ, {int(death_signal)})\n"
            f"print(c.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 20
    while not kid.exists() and time.monotonic() < deadline:     # its handler is set
        time.sleep(0.05)
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 10
    while oscalls.pid_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not oscalls.pid_running(pid)
    assert got.exists() == (death_signal == signal.SIGTERM)


def test_a_leader_signal_reaches_the_leader_alone_and_every_process_of_the_group_is_waited_for(tmp_path):
    """leader_signal (SGLang's SIGINT): only the main process gets it; a child that outlives it (here it ignores
    SIGINT and SIGTERM) is SIGKILLed with the group, and stop returns only once no process of the group is left."""
    kid, got = tmp_path / "kid", tmp_path / "got"
    # SIGINT's Python handler set again: a suite started in the background (`cmd &`) inherits SIGINT ignored, and
    # the leader then waited out the grace (11 s seen)
    code = (f"import signal,subprocess,sys,time\n"
            f"signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"p=subprocess.Popen([sys.executable,'-c','import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            f"signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
            f"open({str(kid)!r},'w').write(str(p.pid))\n"
            f"try: time.sleep(300)\n"
            f"except KeyboardInterrupt: open({str(got)!r},'w').write('SIGINT')\n")
    child = _python_child(tmp_path, code, kid)
    time.sleep(0.3)                                      # the grandchild's handlers are set
    assert sorted(oscalls.group_pids(child.pid)) == sorted([child.pid, int(kid.read_text())])
    t0 = time.monotonic()
    child.stop(grace=10, leader_signal=signal.SIGINT)
    assert time.monotonic() - t0 < 5                     # the leader exits on SIGINT: no grace period spent
    assert got.read_text() == "SIGINT" and child.exited() == "exited with code 0"
    assert oscalls.group_pids(child.pid) == [] and not oscalls.pid_running(int(kid.read_text()))


def test_a_leader_that_waits_on_the_first_signal_gets_a_second(tmp_path):
    """uvicorn's shutdown waits for its background tasks after one Ctrl-C and stops waiting on the second."""
    ready = tmp_path / "ready"
    code = (f"import signal,sys,time\nn=[]\n"
            f"signal.signal(signal.SIGINT, lambda *a: n.append(1) or (len(n) > 1 and sys.exit(3)))\n"
            f"open({str(ready)!r},'w').close()\n"
            f"while True: time.sleep(0.01)\n")
    child = _python_child(tmp_path, code, ready)
    t0 = time.monotonic()
    child.stop(grace=10, leader_signal=signal.SIGINT)
    assert child.exited() == "exited with code 3" and time.monotonic() - t0 < 5     # not SIGKILLed after the grace


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_foreground_server_is_stopped_by_the_signal_that_ends_its_wait(tmp_path, sig):
    """`serve` of the demo engines: the signal ends the wait with 128+signal, and the server is stopped, not left."""
    import subprocess

    code = ("import subprocess, sys\nfrom runbook.core import oscalls\n"
            "p = subprocess.Popen(['sleep', '60'])\nprint(p.pid, flush=True)\n"
            "sys.exit(oscalls.serve_until_signalled(p, lambda: (p.kill(), p.wait(), print('stopped', flush=True))))\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    server = int(child.stdout.readline())
    time.sleep(0.3)                      # the handlers are in place once the wait has begun
    child.send_signal(sig)
    assert child.wait(10) == 128 + sig
    assert child.stdout.read().strip() == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)
