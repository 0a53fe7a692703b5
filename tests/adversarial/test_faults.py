"""Faults and hostile files (issue 13, second half): install rollback, bounded HTTP reads, checkpoint JSON,
absurd spec sizes and YAML 1.1 scalars, non-UTF-8 workload files.

Every case asserts the documented outcome, a one-line message naming the file/field (or an honest
finding), no traceback, and that nothing already written was lost.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import sys
import tempfile
import time
import urllib.error
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt_factory import attn_layer, llama_config, make
from conftest import DEFAULT_SPEC, spec_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tcpserver import tcp_server

from runbook import service
from runbook.bench import workloads
from runbook.core import spec
from runbook.core.errors import InputError, RunbookError, SpecError
from runbook.endpoint import reach
from runbook.model import checkpoint

install_mod = sys.modules["runbook.service.install"]   # the module (runbook.service.install is also the function's name)

UNIT = "sglang-qwen.service"
# Not UTF-8, CRLF, no trailing newline: restored byte for byte or the test fails.
OLD_UNIT = b"[Unit]\r\nDescription=old \xff\xfe unit\r\n[Service]\r\nExecStart=/bin/true"


def _one_line(msg: str) -> None:
    assert "\n" not in msg and "Traceback" not in msg, msg


# =============================================================================================
# 1. install: rollback on any failure after the write, every systemctl call bounded
# =============================================================================================

def fake_systemctl(tmp: Path, fail: dict[str, str] | None = None, hang: tuple[str, ...] = (), state: str = "active") -> tuple[Path, Path]:
    """A systemctl on disk that logs its argv. fail[verb] = "once" (the first call fails) or "always";
    a verb in `hang` sleeps (as a hung daemon-reload would); is-active prints `state`."""
    log = tmp / "systemctl.log"
    exe = tmp / "systemctl"
    lines = ["#!/bin/sh", f'echo "$@" >> "{log}"']
    for verb, how in (fail or {}).items():
        mark = tmp / f".failed-{verb}"
        if how == "once":
            lines.append(f'if [ "$1" = "{verb}" ] && [ ! -e "{mark}" ]; then : > "{mark}"; '
                         f'echo "Failed to {verb}: Unit {UNIT} failed (fake)" >&2; exit 1; fi')
        else:
            lines.append(f'if [ "$1" = "{verb}" ]; then echo "Failed to {verb} (fake)" >&2; exit 1; fi')
    for verb in hang:
        lines.append(f'if [ "$1" = "{verb}" ]; then exec sleep 30; fi')
    ok = "0" if state == "active" else "3"
    lines.append(f'if [ "$1" = "is-active" ]; then echo "{state}"; exit {ok}; fi')
    lines.append("exit 0")
    exe.write_text("\n".join(lines) + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, log


def _dep() -> spec.Deployment:
    return spec.from_dict(spec_data(), str(DEFAULT_SPEC))


def _unit_path(root: Path, d: spec.Deployment) -> Path:
    return root / d.systemd.installed_path.lstrip("/")


@contextmanager
def ready_server(status: int = 200) -> Iterator[str]:
    from httpfake import serve

    with serve({"/ready": (status, {"ok": status == 200})}) as (url, _):
        yield url + "/ready"


def _install(tmp: Path, exe: Path, old: bytes | None = OLD_UNIT, ready_url: str = "http://127.0.0.1:9/ready",
             ready_timeout: float = 0.3, ctl_timeout: float = 5.0) -> tuple[spec.Deployment, Path, Any]:
    d = _dep()
    root = tmp / "root"
    unit = _unit_path(root, d)
    unit.parent.mkdir(parents=True, exist_ok=True)
    if old is not None:
        unit.write_bytes(old)
        unit.chmod(0o640)
    res = service.install(d, service.render(d)[0], dry_run=False, root=root, systemctl=[str(exe)], ready_url=ready_url,
                          ready_timeout=ready_timeout, interval=0.05, ctl_timeout=ctl_timeout)
    return d, unit, res


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _assert_restored(unit: Path, res: Any, state: str = "active") -> None:
    assert unit.read_bytes() == OLD_UNIT, "the previous unit must come back byte for byte"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o640, "and with its mode"
    assert res.rolled_back and res.installed == "previous" and res.service_state == state
    f = res.findings[-1]
    assert f.status == "fail" and f.id == "service.install"
    assert f"previous unit restored; service {UNIT} is {state}" in f.title, f.title
    _one_line(f.title)
    _one_line(f.detail)
    assert "the previous unit is running again" not in f.remedy   # the old claim, made without asking systemd


# (id, fail plan, hang, which step failed as the detail says, whether the restart was reached)
FAIL_CASES = [
    ("daemon-reload-fails", {"daemon-reload": "once"}, (), "reload: exit 1", False),
    ("restart-fails", {"restart": "once"}, (), "restart: exit 1", True),
]


@pytest.mark.parametrize("plan, hang, why, restarted", [pytest.param(p, h, w, r, id=i) for i, p, h, w, r in FAIL_CASES])
def test_failing_systemctl_step_rolls_back_byte_for_byte(tmp_path, plan, hang, why, restarted):
    exe, log = fake_systemctl(tmp_path, fail=plan, hang=hang)
    with ready_server() as url:
        _, unit, res = _install(tmp_path, exe, ready_url=url)
    _assert_restored(unit, res)
    assert why in res.findings[-1].detail and "(fake)" in res.findings[-1].detail
    calls = _calls(log)
    assert calls[-1] == f"is-active {UNIT}" and calls.count("daemon-reload") == 2
    assert (f"restart {UNIT}" in calls[1:]) == restarted   # never restart a service the install did not touch
    assert Path(res.backup).read_bytes() == OLD_UNIT


@pytest.mark.parametrize("verb", ["daemon-reload", "restart"])
def test_hanging_systemctl_times_out_and_rolls_back(tmp_path, verb):
    exe, log = fake_systemctl(tmp_path, hang=(verb,))
    t0 = time.monotonic()
    with ready_server() as url:
        _, unit, res = _install(tmp_path, exe, ready_url=url, ctl_timeout=0.5)
    took = time.monotonic() - t0
    # The rollback calls the same verb again (and it hangs again): two bounded waits, not forever.
    assert took < 10, took
    assert "timed out after 0.5 s" in res.findings[-1].detail
    assert unit.read_bytes() == OLD_UNIT and res.rolled_back and res.installed == "previous"
    assert f"previous unit restored; service {UNIT} is active" in res.findings[-1].title
    assert "rollback problems" in res.findings[-1].detail   # the second hang is reported, not hidden


def test_readiness_timeout_rolls_back_and_asks_systemd(tmp_path):
    exe, log = fake_systemctl(tmp_path, state="inactive")
    with ready_server(503) as url:
        _, unit, res = _install(tmp_path, exe, ready_url=url)
    _assert_restored(unit, res, state="inactive")
    assert "HTTP 503" in res.findings[-1].detail
    assert _calls(log) == ["daemon-reload", f"restart {UNIT}", "daemon-reload", f"restart {UNIT}", f"is-active {UNIT}"]
    assert "journalctl" in res.findings[-1].remedy and "restart" in res.findings[-1].remedy


def test_restart_of_previous_failing_is_reported_not_assumed(tmp_path):
    exe, log = fake_systemctl(tmp_path, fail={"restart": "always"}, state="failed")
    _, unit, res = _install(tmp_path, exe)
    _assert_restored(unit, res, state="failed")
    f = res.findings[-1]
    assert "restart previous failed" in f.detail and "by hand" in f.remedy


@pytest.mark.parametrize("exc", [RuntimeError("boom in the readiness probe"), KeyboardInterrupt(), ValueError("unknown url type")],
                         ids=["exception", "ctrl-c", "bad-url"])
def test_exception_or_ctrl_c_during_readiness_rolls_back(tmp_path, monkeypatch, exc):
    exe, log = fake_systemctl(tmp_path)

    def boom(*a, **k):
        raise exc
    monkeypatch.setattr(install_mod, "wait_ready", boom)
    _, unit, res = _install(tmp_path, exe)
    _assert_restored(unit, res)
    assert res.interrupted == isinstance(exc, KeyboardInterrupt)
    if isinstance(exc, KeyboardInterrupt):
        assert res.findings[-1].title.startswith("interrupted: rolled back") and "SIGINT" in res.findings[-1].detail
    else:
        assert type(exc).__name__ in res.findings[-1].detail


def test_sigterm_during_install_rolls_back(tmp_path, monkeypatch):
    exe, log = fake_systemctl(tmp_path)

    def term(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)   # the handler raises before this ends
        return True, "200"
    monkeypatch.setattr(install_mod, "wait_ready", term)
    before = signal.getsignal(signal.SIGTERM)
    _, unit, res = _install(tmp_path, exe)
    _assert_restored(unit, res)
    assert res.interrupted and "SIGTERM" in res.findings[-1].detail
    assert signal.getsignal(signal.SIGTERM) == before   # handlers put back


def test_exception_in_restart_step_rolls_back(tmp_path, monkeypatch):
    exe, log = fake_systemctl(tmp_path)
    real = install_mod._run_ctl

    def flaky(argv, timeout):
        if argv[1:2] == ["restart"] and not (tmp_path / ".raised").exists():
            (tmp_path / ".raised").touch()
            raise MemoryError("simulated")
        return real(argv, timeout)
    monkeypatch.setattr(install_mod, "_run_ctl", flaky)
    _, unit, res = _install(tmp_path, exe)
    _assert_restored(unit, res)
    assert "MemoryError" in res.findings[-1].detail


def test_missing_systemctl_binary_rolls_back(tmp_path):
    _, unit, res = _install(tmp_path, tmp_path / "no-such-systemctl")
    assert unit.read_bytes() == OLD_UNIT and res.rolled_back and res.installed == "previous"
    f = res.findings[-1]
    assert "cannot run" in f.detail and "previous unit restored" in f.title and "is in an unknown state" in f.title


def test_without_previous_unit_the_new_one_is_stopped_and_removed(tmp_path):
    exe, log = fake_systemctl(tmp_path, state="inactive")
    d, unit, res = _install(tmp_path, exe, old=None)
    assert not unit.exists() and res.rolled_back and res.installed == "none" and res.backup is None
    assert f"new unit removed (there was none before); service {UNIT} is inactive" in res.findings[-1].title
    calls = _calls(log)
    assert calls.index(f"stop {UNIT}") < calls.index("daemon-reload", 1)   # stopped before systemd forgets it


def test_success_installs_and_keeps_the_backup(tmp_path):
    exe, log = fake_systemctl(tmp_path)
    with ready_server() as url:
        d, unit, res = _install(tmp_path, exe, ready_url=url)
    assert res.findings[0].status == "pass" and not res.rolled_back and res.installed == "new"
    assert unit.read_text() == service.render(d)[0].text
    assert Path(res.backup).read_bytes() == OLD_UNIT
    assert _calls(log) == ["daemon-reload", f"restart {UNIT}"]


def test_two_installs_in_one_second_keep_both_backups(tmp_path):
    exe, _ = fake_systemctl(tmp_path)
    d = _dep()
    root = tmp_path / "root"
    unit = _unit_path(root, d)
    unit.parent.mkdir(parents=True)
    backups = []
    with ready_server() as url:
        for text in (b"first\n", b"second\n"):
            unit.write_bytes(text)
            res = service.install(d, service.render(d)[0], dry_run=False, root=root, systemctl=[str(exe)], ready_url=url,
                                  ready_timeout=2, interval=0.05)
            backups.append(res.backup)
    assert len(set(backups)) == 2 and [Path(b).read_bytes() for b in backups] == [b"first\n", b"second\n"]


def test_unit_path_a_directory_changes_nothing(tmp_path):
    exe, log = fake_systemctl(tmp_path)
    d = _dep()
    root = tmp_path / "root"
    _unit_path(root, d).mkdir(parents=True)
    res = service.install(d, service.render(d)[0], dry_run=False, root=root, systemctl=[str(exe)])
    assert res.findings[0].status == "fail" and "nothing changed" in res.findings[0].title
    assert _unit_path(root, d).is_dir() and not log.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_unwritable_unit_directory_changes_nothing(tmp_path):
    exe, log = fake_systemctl(tmp_path)
    d = _dep()
    root = tmp_path / "root"
    unit = _unit_path(root, d)
    unit.parent.mkdir(parents=True)
    unit.write_bytes(OLD_UNIT)
    unit.parent.chmod(0o555)
    try:
        res = service.install(d, service.render(d)[0], dry_run=False, root=root, systemctl=[str(exe)])
    finally:
        unit.parent.chmod(0o755)
    assert res.findings[0].status == "fail" and unit.read_bytes() == OLD_UNIT and not log.exists()


def test_relative_unit_path_is_refused_without_a_traceback(tmp_path):
    d = spec.from_dict(spec_data(**{"systemd.unit_path": "units/x.service"}), str(DEFAULT_SPEC))
    res = service.install(d, service.render(d)[0], dry_run=False, root=tmp_path)
    assert res.findings[0].status == "fail" and "not absolute" in res.findings[0].title
    assert not any(tmp_path.iterdir())


def test_cli_install_failure_exits_1_with_an_honest_finding(tmp_path, cli):
    exe, log = fake_systemctl(tmp_path, fail={"restart": "once"})
    spec_file = tmp_path / "d.yaml"
    doc = spec_data()
    doc["model"]["card"] = str((DEFAULT_SPEC.parent / doc["model"]["card"]).resolve())
    spec_file.write_text(yaml.safe_dump(doc))
    root = tmp_path / "root"
    unit = _unit_path(root, spec.load(spec_file))
    unit.parent.mkdir(parents=True)
    unit.write_bytes(OLD_UNIT)
    cp = cli("service", "install", "--deployment", spec_file, "--root", root, "--systemctl", exe, "--yes", "--json",
             "--ready-url", "http://127.0.0.1:9/ready", "--ready-timeout", "0.5", timeout=120)
    assert cp.returncode == 1, cp.stderr[-2000:]
    assert "Traceback" not in cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["rolled_back"] is True and unit.read_bytes() == OLD_UNIT
    assert f"previous unit restored; service {UNIT} is active" in doc["findings"][-1]["title"]


_VERBS = ["daemon-reload", "restart", "stop", "is-active"]


@pytest.mark.slow  # 20 installs with rollbacks, ~10 s
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=st.dictionaries(st.sampled_from(_VERBS[:3]), st.sampled_from(["once", "always"]), max_size=3),
       had_unit=st.booleans(), ready=st.booleans(), state=st.sampled_from(["active", "inactive", "failed"]))
def test_property_after_install_the_disk_and_the_finding_agree(plan, had_unit, ready, state):
    """Whatever fails, the unit on disk is the new one (and the finding passes) or exactly the old state
    (and the finding says so and what is-active answered)."""
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        exe, log = fake_systemctl(tmp, fail=plan, state=state)
        with ready_server(200 if ready else 503) as url:
            d, unit, res = _install(tmp, exe, old=OLD_UNIT if had_unit else None, ready_url=url, ready_timeout=0.2)
        f = res.findings[-1]
        _one_line(f.title)
        if f.status == "pass":
            assert unit.read_text() == service.render(d)[0].text and not res.rolled_back
        else:
            assert res.rolled_back
            if had_unit:
                assert unit.read_bytes() == OLD_UNIT and f"previous unit restored; service {UNIT} is {state}" in f.title
            else:
                assert not unit.exists() and f"service {UNIT} is {state}" in f.title


# =============================================================================================
# 2. bounded HTTP reads: size, time, garbage, wrong shape
# =============================================================================================

def raw_server(handler: Callable[[socket.socket], None]) -> AbstractContextManager[str]:
    """A real TCP server on loopback: `handler(conn)` writes whatever bytes it likes after the request arrives."""
    def serve(conn: socket.socket) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = conn.recv(4096)
            if not got:
                return
            buf += got
        handler(conn)
    return tcp_server(serve, backlog=8)


def _answer(status: str, body: bytes, ctype: str = "application/json", length: bool = True) -> Callable[[socket.socket], None]:
    def h(conn: socket.socket) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nConnection: close\r\n"
        if length:
            head += f"Content-Length: {len(body)}\r\n"
        conn.sendall(head.encode() + b"\r\n" + body)
    return h


def _endless(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"a\": \"")
    chunk = b"x" * 65536
    for _ in range(2000):            # 128 MiB at most, the client stops long before
        conn.sendall(chunk)


def _trickle(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{")
    for _ in range(200):
        time.sleep(0.05)
        conn.sendall(b" ")


def _trickle_headers(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for i in range(200):
        time.sleep(0.05)
        conn.sendall(f"X-{i}: y\r\n".encode())


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()


def _reset_mid_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"model_path\": ")
    time.sleep(0.05)
    _reset(conn)


def _deep() -> bytes:
    return b"[" * 5000 + b"]" * 5000


# (id, handler, expected exception type, text in its message)
HTTP_CASES: list[tuple[str, Callable[[socket.socket], None], type, str]] = [
    ("huge-body-no-length", _endless, reach.BadResponse, "larger than the 1,048,576 bytes"),
    ("huge-content-length", lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n{"),
     reach.BadResponse, "larger than the 1,048,576"),
    ("slow-trickle", _trickle, reach.BadResponse, "did not finish within 1 s"),
    ("invalid-json", _answer("200 OK", b"{not json"), reach.BadResponse, "not JSON"),
    ("html-200", _answer("200 OK", b"<html><body>login</body></html>", "text/html"), reach.BadResponse, "an HTML page"),
    ("json-list", _answer("200 OK", b"[1, 2, 3]"), reach.BadResponse, "expected an object, got a list"),
    ("json-string", _answer("200 OK", b'"hello"'), reach.BadResponse, "expected an object, got a string"),
    ("json-null", _answer("200 OK", b"null"), reach.BadResponse, "expected an object, got null"),
    ("deep-nesting", _answer("200 OK", _deep()), reach.BadResponse, "nested"),
    ("not-utf8", _answer("200 OK", b'{"a": "\xff\xfe"}'), reach.BadResponse, "not UTF-8"),
    ("not-http", lambda c: c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n"), reach.BadResponse, "not an HTTP answer"),
    ("cut-mid-body", _reset_mid_body, reach.BadResponse, "cut off"),
    ("no-length-then-close", _answer("200 OK", b'{"a": 1', length=False), reach.BadResponse, "not JSON"),
    ("http-500-html", _answer("500 Internal Server Error", b"<html>oops</html>", "text/html"), urllib.error.HTTPError, "500"),
    ("reset-before-answer", _reset, OSError, ""),
    # A status line and then headers that never end: it answered, but never finished (bounded all the same).
    ("headers-never-end", _trickle_headers, reach.BadResponse, "did not finish within 1 s"),
]


@pytest.mark.parametrize("handler, exc, text", [pytest.param(h, e, t, id=i) for i, h, e, t in HTTP_CASES])
def test_json_probe_is_bounded_and_says_what_came_back(handler, exc, text):
    with raw_server(handler) as base:
        t0 = time.monotonic()
        with pytest.raises(exc) as ei:
            reach.fetch_json(base + "/server_info", timeout=1.0, max_bytes=1 << 20)
        took = time.monotonic() - t0
    assert took < 4, f"took {took:.1f} s: not bounded"
    msg = str(ei.value)
    _one_line(msg)
    assert text in msg, msg
    if exc is reach.BadResponse:
        assert reach.NOT_SGLANG in msg and "/server_info" in msg


@pytest.mark.parametrize("case", ["invalid-json", "html-200", "json-list", "slow-trickle", "http-500-html"])
def test_garbage_is_never_reported_as_no_server(case):
    handler = next(h for i, h, _, _ in HTTP_CASES if i == case)
    with raw_server(handler) as base:
        try:
            reach.fetch_json(base + "/server_info", timeout=1.0)
        except (reach.BadResponse, urllib.error.HTTPError) as e:
            f = reach.failure_finding("service.drift", base, e)
    assert f.status == "fail" and reach.NOT_SGLANG in f.title and "no server" not in f.title
    _one_line(f.title)


def test_nothing_listening_is_no_server():
    with pytest.raises(OSError) as ei:
        reach.fetch_json("http://127.0.0.1:9/server_info", timeout=1.0)
    assert not isinstance(ei.value, reach.BadResponse)
    f = reach.failure_finding("service.drift", "http://127.0.0.1:9", ei.value)
    assert f.status == "skip" and "no server reachable" in f.title


def test_good_answers_pass_through():
    info = {"model_path": "x", "tp_size": 8, "nested": {"a": [1, {"b": None}]}}
    body = json.dumps(info).encode()
    with raw_server(_answer("200 OK", body)) as base:
        assert reach.fetch_json(base + "/server_info") == info
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    with raw_server(lambda c: c.sendall(chunked)) as base:
        assert reach.fetch_json(base + "/server_info") == info


def test_the_api_key_never_appears_in_a_message_even_when_echoed():
    key = "sk-live-SECRET-123456789"
    with raw_server(_answer("200 OK", f"Bearer {key} <- not JSON".encode())) as base, pytest.raises(reach.BadResponse) as ei:
        reach.fetch_json(base + "/server_info", api_key=key, timeout=1.0)
    assert key not in str(ei.value) and "redacted" in str(ei.value)


@pytest.mark.parametrize("doc, text", [
    ({"data": None}, "\"data\" should be a list of models, got null"),
    ({"data": "qwen"}, "got a string"),
    ({"data": [5]}, "data[0] should be an object"),
    ({"data": [{"id": 5}]}, "got id a number"),
    ({"data": [{"id": None}]}, "got id null"),
    ([{"id": "x"}], "expected an object"),
])
def test_v1_models_of_the_wrong_shape(doc, text):
    with pytest.raises(reach.BadResponse, match=re.escape(text)):
        reach.served_models(doc, "http://h/v1/models")
    assert reach.served_models({"data": [{"id": "a"}, {"id": "b", "x": None}]}) == ["a", "b"]


@pytest.mark.parametrize("doc", [[], "x", {"model_path": 5}, {"model_path": ["a"]}, {"tokenizer_path": {}}])
def test_get_model_info_of_the_wrong_shape(doc):
    with pytest.raises(reach.BadResponse):
        reach.model_info(doc)
    assert reach.model_info({"model_path": "m", "is_generation": True}) == {"model_path": "m", "is_generation": True}


@pytest.mark.parametrize("case", ["huge-body-no-length", "slow-trickle", "json-list", "invalid-json", "reset-before-answer"])
def test_model_name_is_bounded_and_falls_back_to_none(case):
    handler = next(h for i, h, _, _ in HTTP_CASES if i == case)
    with raw_server(handler) as base:
        t0 = time.monotonic()
        assert asyncio.run(reach.model_name(base, None, timeout=1.0, max_bytes=1 << 20)) is None
        assert time.monotonic() - t0 < 4


def test_model_name_reads_a_good_answer():
    with raw_server(_answer("200 OK", b'{"object": "list", "data": [{"id": "qwen3.5-397b"}]}')) as base:
        assert asyncio.run(reach.model_name(base, None)) == "qwen3.5-397b"


@pytest.mark.parametrize("case, ready, text", [
    ("huge-body-no-length", False, "larger than the 65,536 bytes"),   # urllib said ready at the status line
    ("slow-trickle", False, "did not finish"),
    ("http-500-html", False, "HTTP 500"),
    ("reset-before-answer", False, ""),
    ("empty-200", True, "200"),
])
def test_readiness_wait_goes_through_the_bounded_get(case, ready, text):
    """service install's readiness wait reads /ready with reach.get: bounded in size and time, the reason kept."""
    handler = _answer("200 OK", b"") if case == "empty-200" else next(h for i, h, _, _ in HTTP_CASES if i == case)
    with raw_server(handler) as base:
        t0 = time.monotonic()
        ok, why = service.wait_ready(base + "/ready", timeout=1.0, interval=0.2)
        took = time.monotonic() - t0
    assert ok is ready and text in why and took < 4, (ok, why, took)
    _one_line(why)


@pytest.mark.parametrize("handler, want", [
    (_answer("200 OK", b'{"object": "list", "data": [{"id": "m"}]}'), None),   # a model list: an OpenAI-compatible server
    (_answer("401 Unauthorized", b""), None),                      # one that wants the API key
    (_answer("404 Not Found", b"no"), "HTTP 404"),                 # another web server (issue 29: was "reachable")
    (_answer("200 OK", b"<html>x</html>", "text/html"), "an HTML page"),
    (_answer("503 Service Unavailable", b""), "HTTP 503"),
    (_endless, "not with SGLang's JSON"),                         # bounded in size and time, and no model list
])
def test_reachability_probe_uses_the_bounded_get(handler, want):
    with raw_server(handler) as base:
        why = asyncio.run(reach.probe(base, timeout=1.0))
        assert why == want if want is None else want in (why or ""), why
    assert asyncio.run(reach.probe("http://127.0.0.1:9", timeout=1.0))   # refused: a reason


def test_get_redacts_the_key_and_returns_the_status():
    key = "sk-live-SECRET-123456789"
    with raw_server(_answer("200 OK", b"")) as base:
        assert reach.get(base + "/health", api_key=key, timeout=1.0) == (200, b"")
    # a reason phrase that echoes the key
    with raw_server(_answer(f"401 Bad {key}", b"")) as base, pytest.raises(urllib.error.HTTPError) as ei:
        reach.get(base + f"/x?{key}", api_key=key, timeout=1.0)
    assert ei.value.code == 401 and key not in str(ei.value.reason) and "Bad" in str(ei.value.reason)


class _Body:
    value = b""


@pytest.mark.slow  # a real HTTP round trip per example
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
                              max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_property_any_body_is_json_or_bad_response(body):
    _Body.value = body
    with raw_server(lambda c: _answer("200 OK", _Body.value)(c)) as base:
        try:
            doc = reach.fetch_json(base + "/v1/models", timeout=2.0)
        except reach.BadResponse as e:
            _one_line(str(e))
            return
    assert isinstance(doc, dict)
    try:
        reach.served_models(doc)
    except reach.BadResponse as e:
        _one_line(str(e))


# =============================================================================================
# 3. checkpoint files: wrong types, absurd sizes, bytes, size, links
# =============================================================================================

def _ck(tmp: Path, **files: Any) -> Path:
    d = make(tmp / "ck", llama_config())
    for name, content in files.items():
        name = name.replace("__", ".")
        p = d / name
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(json.dumps(content))
    return d


def _cfg(**changes: Any) -> dict:
    c = llama_config()
    c.update(changes)
    return c


def _index(**meta_or_map: Any) -> dict:
    doc: dict[str, Any] = {"metadata": {"total_size": 1000}, "weight_map": {"model.embed_tokens.weight": "model.safetensors"}}
    doc.update(meta_or_map)
    return doc


# (id, files to write, file named, field named)
CKPT_CASES: list[tuple[str, dict, str, str]] = [
    ("config-list", {"config.json": [1, 2]}, "config.json", "expected a JSON object"),
    ("layers-string", {"config.json": _cfg(num_hidden_layers="32")}, "config.json", "'num_hidden_layers'"),
    ("layers-absurd", {"config.json": _cfg(num_hidden_layers=10**9)}, "config.json", "'num_hidden_layers'"),
    ("layers-negative", {"config.json": _cfg(num_hidden_layers=-4)}, "config.json", "'num_hidden_layers'"),
    ("layers-bool", {"config.json": _cfg(num_hidden_layers=True)}, "config.json", "'num_hidden_layers'"),
    ("heads-float", {"config.json": _cfg(num_attention_heads=64.5)}, "config.json", "'num_attention_heads'"),
    ("hidden-2-70", {"config.json": _cfg(hidden_size=2**70)}, "config.json", "'hidden_size'"),
    ("architectures-5", {"config.json": _cfg(architectures=5)}, "config.json", "'architectures'"),
    ("architectures-nulls", {"config.json": _cfg(architectures=[None])}, "config.json", "'architectures'"),
    ("text-config-list", {"config.json": _cfg(text_config=[1])}, "config.json", "'text_config'"),
    ("text-config-layers-null-list", {"config.json": _cfg(text_config={"num_hidden_layers": [None]})}, "config.json",
     "'text_config.num_hidden_layers'"),
    ("quant-config-string", {"config.json": _cfg(quantization_config="fp8")}, "config.json", "'quantization_config'"),
    ("quant-ignore-5", {"config.json": _cfg(quantization_config={"quant_method": "fp8", "ignore": 5})}, "config.json",
     "'quantization_config.ignore'"),
    ("block-size-strings", {"config.json": _cfg(quantization_config={"quant_method": "fp8", "weight_block_size": ["128", "128"]})},
     "config.json", "'quantization_config.weight_block_size'"),
    ("model-type-5", {"config.json": _cfg(model_type=5)}, "config.json", "'model_type'"),
    ("hfq-exclude-5", {"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4", "exclude_modules": 5}}},
     "hf_quant_config.json", "'quantization.exclude_modules'"),
    ("hfq-group-size-string", {"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4", "group_size": "16"}}},
     "hf_quant_config.json", "'quantization.group_size'"),
    ("hfq-algo-list", {"hf_quant_config.json": {"quantization": {"quant_algo": ["NVFP4"]}}},
     "hf_quant_config.json", "'quantization.quant_algo'"),
    ("hfq-producer-string", {"hf_quant_config.json": {"producer": "modelopt", "quantization": {}}},
     "hf_quant_config.json", "'producer'"),
    ("hfq-list", {"hf_quant_config.json": [1]}, "hf_quant_config.json", "expected a JSON object"),
    ("gptq-bits-string", {"quantize_config.json": {"bits": "4", "group_size": 128}}, "quantize_config.json", "'bits'"),
    ("gptq-desc-act-string", {"quantize_config.json": {"bits": 4, "desc_act": "no"}}, "quantize_config.json", "'desc_act'"),
    ("total-size-2-70", {"model.safetensors.index.json": _index(metadata={"total_size": 2**70})},
     "model.safetensors.index.json", "'metadata.total_size'"),
    ("total-size-negative", {"model.safetensors.index.json": _index(metadata={"total_size": -1})},
     "model.safetensors.index.json", "'metadata.total_size'"),
    ("total-size-string", {"model.safetensors.index.json": _index(metadata={"total_size": "400GB"})},
     "model.safetensors.index.json", "'metadata.total_size'"),
    ("metadata-list", {"model.safetensors.index.json": _index(metadata=[1])}, "model.safetensors.index.json", "'metadata'"),
    ("weight-map-list", {"model.safetensors.index.json": _index(weight_map=["model.safetensors"])},
     "model.safetensors.index.json", "'weight_map'"),
    ("weight-map-null-entry", {"model.safetensors.index.json": _index(weight_map={"a.weight": None})},
     "model.safetensors.index.json", "'weight_map.'a.weight''"),
    ("weight-map-number-entry", {"model.safetensors.index.json": _index(weight_map={"a.weight": 3})},
     "model.safetensors.index.json", "'weight_map.'a.weight''"),
    ("weight-map-escapes-dir", {"model.safetensors.index.json": _index(weight_map={"a.weight": "../../etc/passwd"})},
     "model.safetensors.index.json", "outside the checkpoint"),
    ("weight-map-absolute", {"model.safetensors.index.json": _index(weight_map={"a.weight": "/dev/zero"})},
     "model.safetensors.index.json", "outside the checkpoint"),
    ("config-not-utf8", {"config.json": b'{"model_type": "llama\xff\xfe"}'}, "config.json", "not UTF-8 text (byte 0xff at offset 21)"),
    ("index-not-utf8", {"model.safetensors.index.json": b'{"weight_map": {"\xc3\x28": "x"}}'}, "model.safetensors.index.json",
     "not UTF-8"),
    ("config-deep", {"config.json": b"[" * 100000 + b"]" * 100000}, "config.json", "nested too deeply"),
    ("config-huge-int", {"config.json": b'{"num_hidden_layers": ' + b"9" * 5000 + b"}"}, "config.json", "config.json"),
]


@pytest.mark.parametrize("files, fname, field", [pytest.param(f, n, x, id=i) for i, f, n, x in CKPT_CASES])
def test_bad_checkpoint_file_is_one_input_error_naming_file_and_field(tmp_path, files, fname, field):
    d = _ck(tmp_path, **{k.replace(".", "__"): v for k, v in files.items()})
    with pytest.raises(InputError) as ei:
        checkpoint.load(d)
    msg = str(ei.value)
    _one_line(msg)
    assert fname in msg and field in msg, msg
    assert len(msg) < 400, msg


def test_huge_config_is_refused_without_reading_it(tmp_path):
    d = _ck(tmp_path)
    with open(d / "config.json", "r+b") as f:
        f.truncate(64 << 20)   # sparse: 64 MiB on paper
    with pytest.raises(InputError, match=r"config.json: 67,108,864 bytes is too large"):
        checkpoint.load(d)


def test_config_symlink_loop_is_named(tmp_path):
    d = _ck(tmp_path)
    (d / "config.json").unlink()
    os.symlink("config.json", d / "config.json")
    with pytest.raises(InputError, match="config.json: symbolic link loop"):
        checkpoint.load(d)


def test_optional_file_symlink_loop_and_fifo_are_named(tmp_path):
    d = _ck(tmp_path)
    os.symlink("a", d / "hf_quant_config.json.tmp")
    os.symlink("hf_quant_config.json.tmp", d / "a")
    os.rename(d / "hf_quant_config.json.tmp", d / "hf_quant_config.json")
    os.symlink("hf_quant_config.json", d / "a2")
    (d / "a").unlink()
    os.symlink("hf_quant_config.json", d / "a")   # hf_quant_config.json -> a -> hf_quant_config.json
    with pytest.raises(InputError, match="hf_quant_config.json: symbolic link loop"):
        checkpoint.load(d)
    d2 = make(tmp_path / "ck2", llama_config())
    os.mkfifo(d2 / "hf_quant_config.json")
    with pytest.raises(InputError, match="hf_quant_config.json: not a regular file"):
        checkpoint.load(d2)   # a FIFO would block a plain open() forever


def test_shard_symlink_loop_is_a_finding_not_a_traceback(tmp_path):
    d = make(tmp_path / "ck", llama_config(), [attn_layer(0, "bf16")])
    shard = next(d.glob("*.safetensors"))
    shard.unlink()
    os.symlink(shard.name, shard)
    ck = checkpoint.load(d)
    f = {x.id: x for x in ck.problems}
    assert "quant.ckpt.shard_header" in f and "symbolic links" in f["quant.ckpt.shard_header"].detail.lower()
    assert not ck.complete


def test_dir_symlink_loop_is_named(tmp_path):
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with pytest.raises(InputError, match="symbolic link loop"):
        checkpoint.load(tmp_path / "loop")


def test_header_nested_too_deeply_is_a_finding(tmp_path):
    d = make(tmp_path / "ck", llama_config(), [attn_layer(0, "bf16")])
    shard = next(d.glob("*.safetensors"))
    head = b"[" * 50000 + b"]" * 50000
    shard.write_bytes(len(head).to_bytes(8, "little") + head)
    ck = checkpoint.load(d)
    assert any(p.id == "quant.ckpt.shard_header" and "nested too deeply" in p.detail for p in ck.problems)


def test_real_checkpoints_still_load():
    """The checks refuse only what is wrong: every shipped config fixture loads."""
    models = DEFAULT_SPEC.parents[1] / "tests" / "fixtures" / "models"
    n = 0
    for d in sorted(models.iterdir()):
        if (d / "config.json").is_file():
            checkpoint.load(d)
            n += 1
        if (d / "hf_quant_config.json").is_file():
            p = d / "hf_quant_config.json"
            checkpoint.check_hf_quant_config(p, json.loads(p.read_text()))
    assert n >= 15


def test_cli_quant_on_a_bad_config_is_one_line_exit_2(tmp_path, cli):
    d = _ck(tmp_path, config__json=_cfg(num_hidden_layers="lots"))
    cp = cli("quant", d, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr[-2000:]
    lines = [x for x in cp.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "config.json" in lines[0] and "num_hidden_layers" in lines[0]


_JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80) |
                     st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=8)
_FIELDS = sorted(checkpoint._CONFIG_INTS) + list(checkpoint._CONFIG_OBJECTS) + list(checkpoint._CONFIG_STRS) + \
    list(checkpoint._CONFIG_STR_LISTS)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_FIELDS), _JSON, min_size=1, max_size=4), _JSON, st.sampled_from(["hfq", "index", "none"]))
def test_property_random_values_load_or_raise_one_input_error(changes, other, where):
    with tempfile.TemporaryDirectory() as t:
        d = make(Path(t) / "ck", _cfg(**changes))
        if where == "hfq":
            (d / "hf_quant_config.json").write_text(json.dumps({"quantization": other}))
        elif where == "index":
            (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": other},
                                                                          "weight_map": {"w": other}}))
        try:
            ck = checkpoint.load(d)
        except InputError as e:
            _one_line(str(e))
            assert str(d) in str(e)
            return
        for key in checkpoint._CONFIG_INTS:
            v = ck.config.get(key)
            assert v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= checkpoint._CONFIG_INTS[key])


# =============================================================================================
# 4. spec: absurd sizes and YAML 1.1 scalars anywhere
# =============================================================================================

def _spec_text() -> str:
    text = DEFAULT_SPEC.read_text()
    card = (DEFAULT_SPEC.parent / "../models/qwen3.5-397b-a17b-nvfp4").resolve()
    return re.sub(r"(?m)^(\s*card:) \S+", rf"\1 {card}", text)


def _load_variant(tmp: Path, old: str, new: str) -> spec.Deployment:
    text = _spec_text()
    assert old in text, old
    p = tmp / "dep.yaml"
    p.write_text(text.replace(old, new, 1))
    return spec.load(p)


# (id, old, new, field named, bound or hint named)
SIZE_CASES = [
    ("tp-2-70", "  tp: 8\n", f"  tp: {2**70}\n", "parallelism.tp", "1024"),
    ("pp-2-70", "  pp: 1\n", f"  pp: {2**70}\n", "parallelism.pp", "1024"),
    ("attn-dp-2-70", "  attn_dp: 1\n", f"  attn_dp: {2**70}\n", "parallelism.attn_dp", "1024"),
    ("gpu-count-1e9", "gpu_count: 8", f"gpu_count: {10**9}", "hardware.gpu_count", "1024"),
    ("gpu-memory-1e30", "gpu_memory_gib: 96", "gpu_memory_gib: 1e30", "hardware.gpu_memory_gib", "4096"),
    ("size-gib-1e30", "size_gib: 233", "size_gib: 1.0e+30", "model.size_gib", "1048576"),
    ("port-70000", "port: 30000", "port: 70000", "serving.port", "65536"),
    ("port-zero", "port: 30000", "port: 0", "serving.port", "0"),
    ("port-negative", "port: 30000", "port: -1", "serving.port", "0"),
    ("context-length-2-40", "context-length: 262144", f"context-length: {2**40}", "serving.flags.context-length", "2,147,483,647"),
    ("input-len-2-70", "input_len: 2048", f"input_len: {2**70}", "benchmark.input_len", "16777216"),
    ("requests-1e12", "requests_per_level: 64", "requests_per_level: 1000000000000", "benchmark.requests_per_level", "10000000"),
    ("concurrency-2-70", "concurrency: [1, 2,", f"concurrency: [{2**70}, 2,", "benchmark.concurrency", "16777216"),
    ("recall-length-2-70", "recall_lengths: [8192,", f"recall_lengths: [{2**70},", "accuracy.recall_lengths", "16777216"),
    ("timeout-start-1e12", "timeout_start_sec: 1800", "timeout_start_sec: 1000000000000", "systemd.timeout_start_sec", "604800"),
    ("slo-1e30", "ttft_ms_p99: 3000", "ttft_ms_p99: 1e30", "slo.ttft_ms_p99", "604800000"),
    ("tp-yes", "  tp: 8\n", "  tp: yes\n", "parallelism.tp", "true/false"),
    ("gpu-count-true-python", "gpu_count: 8", "gpu_count: !!bool true", "hardware.gpu_count", "true/false"),
]

# YAML 1.1 numbers that are not what the digits show, in number fields: refused.
YAML11_REFUSED = [
    ("port-sexagesimal", "port: 30000", "port: 30:00", "serving.port", "base 60"),
    ("port-octal", "port: 30000", "port: 030000", "serving.port", "octal"),
    ("dist-port-sexagesimal", "  attn_dp: 1\n", "  attn_dp: 1\n  dist_init_port: 50:00\n", "parallelism.dist_init_port", "base 60"),
    ("timeout-sexagesimal", "timeout_start_sec: 1800", "timeout_start_sec: 30:00", "systemd.timeout_start_sec", "base 60"),
    ("tp-octal", "  tp: 8\n", "  tp: 010\n", "parallelism.tp", "octal"),
    ("concurrency-sexagesimal", "concurrency: [1, 2,", "concurrency: [1:30, 2,", "benchmark.concurrency[0]", "base 60"),
    ("gpu-memory-sexagesimal-float", "gpu_memory_gib: 96", "gpu_memory_gib: 1:36.5", "hardware.gpu_memory_gib", "base 60"),
    ("typed-flag-octal", "context-length: 262144", "context-length: 0262144", "serving.flags.context-length", "octal"),
    ("typed-flag-sexagesimal", "chunked-prefill-size: 8192", "chunked-prefill-size: 2:16:32", "serving.flags.chunked-prefill-size",
     "base 60"),
    ("port-0o", "port: 30000", "port: 0o17", "serving.port", "integer"),
    ("served-name-yes", "served_name: qwen3.5-397b", "served_name: yes", "model.served_name", 'quote the value: served_name: "yes"'),
    ("user-on", "user: theuser", "user: on", "systemd.user", 'quote the value: user: "on"'),
    ("description-no", "description: Qwen3.5", "description: no\nx: Qwen3.5", "description", 'quote the value: description: "no"'),
    ("workload-off", "workload: code", "workload: off", "benchmark.workload", "quote the value"),
]

# In string fields (and flags SGLang gets as text) a number is kept as the text written.
YAML11_KEPT = [
    ("served-name-octal", "served_name: qwen3.5-397b", "served_name: 0755", lambda d: d.model.served_name, "0755"),
    ("served-name-sexagesimal", "served_name: qwen3.5-397b", "served_name: 30:00", lambda d: d.model.served_name, "30:00"),
    ("revision-number", "served_name: qwen3.5-397b", "served_name: x\n  revision: 1e3", lambda d: d.model.revision, "1e3"),
    ("compute-capability-float", 'compute_capability: "12.0"', "compute_capability: 12.0",
     lambda d: d.hardware.compute_capability, "12.0"),
    ("group-number", "group: theuser", "group: 1000", lambda d: d.systemd.group, "1000"),
    ("flag-sexagesimal", "reasoning-parser: qwen3", "reasoning-parser: qwen3\n    watchdog-timeout: 1:30",
     lambda d: d.serving.flags["watchdog-timeout"], "1:30"),
    ("flag-octal", "reasoning-parser: qwen3", "reasoning-parser: qwen3\n    some-mask: 0755", lambda d: d.serving.flags["some-mask"],
     "0755"),
    ("flag-0o", "reasoning-parser: qwen3", "reasoning-parser: qwen3\n    some-mask: 0o17", lambda d: d.serving.flags["some-mask"], "0o17"),
    ("flag-hex-is-a-number", "reasoning-parser: qwen3", "reasoning-parser: qwen3\n    seed: 0x1F", lambda d: d.serving.flags["seed"], 31),
    ("flag-yes-is-a-switch", "enable-metrics: true", "enable-metrics: yes", lambda d: d.serving.flags["enable-metrics"], True),
    ("int-hex", "warmup: 2", "warmup: 0x1F", lambda d: d.benchmark.warmup, 31),
    ("int-underscores", "port: 30000", "port: 30_000", lambda d: d.serving.port, 30000),
    ("bool-yes", "require_gpus: false", "require_gpus: yes", lambda d: d.hardware.require_gpus, True),
    ("env-still-as-written", 'NCCL_IB_DISABLE: "1"', "NCCL_IB_DISABLE: 01:30", lambda d: d.serving.env["NCCL_IB_DISABLE"], "01:30"),
    ("quoted-port", "port: 30000", 'port: "30000"', lambda d: d.serving.port, 30000),
]


@pytest.mark.parametrize("old, new, field, bound", [pytest.param(o, n, f, b, id=i) for i, o, n, f, b in SIZE_CASES + YAML11_REFUSED])
def test_absurd_or_yaml11_value_is_one_line_naming_field(tmp_path, old, new, field, bound):
    with pytest.raises(SpecError) as ei:
        _load_variant(tmp_path, old, new)
    msg = str(ei.value)
    _one_line(msg)
    assert "dep.yaml" in msg and field in msg and bound in msg, msg


@pytest.mark.parametrize("old, new, get, want", [pytest.param(o, n, g, w, id=i) for i, o, n, g, w in YAML11_KEPT])
def test_yaml11_scalar_in_a_text_field_is_kept_as_written(tmp_path, old, new, get, want):
    got = get(_load_variant(tmp_path, old, new))
    assert got == want and type(got) is type(want)


def test_cli_refuses_sexagesimal_port_in_one_line(tmp_path, cli):
    p = tmp_path / "dep.yaml"
    p.write_text(_spec_text().replace("port: 30000", "port: 30:00", 1))
    cp = cli("kv", "--deployment", p, timeout=60)
    lines = [x for x in cp.stderr.splitlines() if x.strip()]
    assert cp.returncode == 2 and len(lines) == 1 and "serving.port" in lines[0] and "1800" in lines[0], cp.stderr[-2000:]


def test_python_true_is_not_a_number():
    with pytest.raises(SpecError, match=r"parallelism.tp: must be a number, not true/false"):
        spec.from_dict(spec_data(**{"parallelism.tp": True}))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["parallelism.tp", "parallelism.pp", "parallelism.attn_dp", "hardware.gpu_count", "serving.port",
                        "hardware.gpu_memory_gib", "benchmark.input_len", "systemd.restart_sec"]),
       st.one_of(st.integers(min_value=-2**80, max_value=2**80), st.floats(allow_nan=True, allow_infinity=True),
                 st.booleans(), st.text(max_size=6)))
def test_property_sizes_load_bounded_or_one_line(field, value):
    try:
        d = spec.from_dict(spec_data(**{field: value}), "dep.yaml")
    except SpecError as e:
        _one_line(str(e))
        assert str(e).startswith("dep.yaml: ")
        return
    section, key = field.split(".")
    got = getattr(getattr(d, section), key)
    assert not isinstance(got, bool) and 0 <= got <= spec.MAX_TOKENS


# =============================================================================================
# 5. workload files: non-UTF-8, wrong lines
# =============================================================================================

@pytest.mark.parametrize("content, text", [
    (b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n', r"w.jsonl:2: not UTF-8 text \(byte 0xe9 at byte offset 32\)"),
    (b'\xff{"prompt": "x"}\n', r"w.jsonl:1: not UTF-8 text \(byte 0xff at byte offset 0\)"),
    (b'[1, 2]\n', r"w.jsonl:1: each line must be a JSON object"),
    (b'"just a string"\n', r"w.jsonl:1: each line must be a JSON object"),
    (b'{"prompt": "x", "max_tokens": "lots"}\n', r"w.jsonl:1: \"max_tokens\" must be a token count"),
    (b'{"prompt": "x", "max_tokens": -5}\n', r"w.jsonl:1: \"max_tokens\""),
    (b'{"prompt": "x", "max_tokens": 1e300}\n', r"w.jsonl:1: \"max_tokens\""),
    (b"[" * 100000 + b"\n", r"w.jsonl:1: not"),
], ids=["latin1-line-2", "first-byte", "list-line", "string-line", "max-tokens-word", "max-tokens-negative", "max-tokens-huge",
        "deep"])
def test_bad_workload_file_is_one_input_error(tmp_path, content, text):
    p = tmp_path / "w.jsonl"
    p.write_bytes(content)
    with pytest.raises(InputError, match=text) as ei:
        workloads.build(str(p), 4)
    _one_line(str(ei.value))


def test_good_workload_file_still_reads(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_bytes('\ufeff{"prompt": "caf\u00e9", "max_tokens": "12"}\n\n{"prompt": [1, 2, 3], "max_tokens": 8.0}\n'.encode())
    wl = workloads.build(str(p), 3)
    assert [r.max_tokens for r in wl.requests] == [12, 8, 12] and wl.requests[0].prompt == "caf\u00e9"


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_property_random_workload_bytes_never_a_traceback(data):
    with tempfile.TemporaryDirectory() as t:
        p = Path(t) / "w.jsonl"
        p.write_bytes(data)
        try:
            workloads.build(str(p), 2)
        except RunbookError as e:
            _one_line(str(e))
            assert "w.jsonl" in str(e)


if __name__ == "__main__":   # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_read_regular_is_bounded_even_when_the_file_grows_past_its_stat(tmp_path):
    """The shared reader behind the spec, checkpoint JSON and workload files never reads past cap + 1 bytes."""
    import os as _os

    from runbook.core.fsutil import FileRefused, read_regular
    p = tmp_path / "f.json"
    p.write_bytes(b"{}")
    st = p.stat()                       # stat says 2 bytes ...
    p.write_bytes(b"x" * 100)           # ... then the file grows
    with pytest.raises(FileRefused, match="larger than 10 bytes, too large for this file"):
        read_regular(p, 10, st)
    fifo = tmp_path / "fifo"
    _os.mkfifo(fifo)
    with pytest.raises(FileRefused, match="not a regular file"):
        read_regular(fifo, 10)
    with pytest.raises(FileRefused, match="is a directory"):
        read_regular(tmp_path, 10)
    assert read_regular(p, 100) == b"x" * 100
