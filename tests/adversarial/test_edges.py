"""Bad input and faults at the edges (issue 29): output paths that are directories, files or read-only;
inputs that were silently ignored (a missing tokenizer or workload, a missing env_file); a SIGKILLed
run's in-progress files; what counts as a server; the deployment lock for `push`; the readiness probe;
what `service check` redacts.

Read-only directories do not stop root, so those cases run the real CLI without the privilege to write
there (tests/unprivileged.py: as root, uid 0 without capabilities in a directory `nobody` owns), wherever the
checkout lives: the error path is the one a real operator meets.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import unprivileged
from conftest import DEFAULT_SPEC, REPO, RUNNER_PARAMS, make_notebook, spec_data
from httpfake import serve

from runbook import service
from runbook.core import spec
from runbook.core.errors import LockHeld
from runbook.endpoint import reach
from runbook.runner.run import DeploymentLock, PushOptions, push

DEAD_URL = "http://127.0.0.1:9"


def _one_line(cp: subprocess.CompletedProcess, names: str, code: int = 2) -> str:
    err = cp.stderr
    assert "Traceback" not in err, err[-2000:]
    lines = [x for x in err.splitlines() if x.strip()]
    assert cp.returncode == code, (cp.returncode, err[-2000:])
    assert len(lines) == 1, err[-2000:]
    assert names in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the unprivileged CLI can read, not write."""
    with unprivileged.readonly_dir("rb-edges-") as d:
        yield d


def as_unprivileged(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return unprivileged.run([sys.executable, "-m", "runbook", *args], timeout=timeout)


# ---- tracebacks: output paths ------------------------------------------------------------------

def test_service_render_out_at_an_existing_directory(cli, tmp_path):
    d = tmp_path / "units"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    line = _one_line(cli("service", "render", "--out", d), str(d))
    assert "directory" in line and "--out" in line
    assert sorted(p.name for p in d.iterdir()) == ["keep.txt"] and (d / "keep.txt").read_text() == "mine"


def test_service_render_out_into_a_read_only_directory(shared_dir):
    target = shared_dir / "sglang.service"
    line = _one_line(as_unprivileged("service", "render", "--deployment", DEFAULT_SPEC, "--out", target), str(target))
    assert "--out" in line and "permission denied" in line.lower()
    assert list(shared_dir.iterdir()) == []


@pytest.mark.notebook   # `runbook run` (refused before any notebook starts)
def test_run_out_at_a_regular_file(cli, tmp_path):
    f = tmp_path / "archive"
    f.write_text("not a folder")
    line = _one_line(cli("run", "--out", f, "--only", "environment", timeout=120), str(f))
    assert "--out" in line and "not a directory" in line.lower()
    assert f.read_text() == "not a folder"


def test_run_out_in_a_read_only_directory(shared_dir):
    line = _one_line(as_unprivileged("run", "--deployment", DEFAULT_SPEC, "--out", shared_dir, "--only", "environment"),
                     str(shared_dir))
    assert "--out" in line and "permission denied" in line.lower()
    assert list(shared_dir.iterdir()) == []


def test_bench_tokenizer_json_that_is_garbage(cli, tmp_path):
    (tmp_path / "tokenizer.json").write_text("{ this is not a tokenizer")
    line = _one_line(cli("bench", "--url", DEAD_URL, "--archive", "", "--tokenizer", tmp_path, timeout=120),
                     str(tmp_path / "tokenizer.json"))
    assert "--tokenizer" in line


# ---- silently wrong ----------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["/nonexistent/tok", "{tmp}"])   # nothing there; a directory without tokenizer.json
def test_bench_tokenizer_that_is_not_there_is_refused(cli, tmp_path, where):
    path = where.replace("{tmp}", str(tmp_path))
    line = _one_line(cli("bench", "--url", DEAD_URL, "--archive", "", "--tokenizer", path, timeout=120), path)
    assert "--tokenizer" in line and "tokenizer.json" in line


@pytest.mark.parametrize("probe", [["recall"], ["identity", "--compare-url", DEAD_URL]])
def test_accuracy_tokenizer_that_is_not_there_is_refused(cli, probe):
    line = _one_line(cli("accuracy", probe[0], "--url", DEAD_URL, *probe[1:], "--tokenizer", "/nonexistent/tok", timeout=120),
                     "/nonexistent/tok")
    assert "--tokenizer" in line


@pytest.mark.parametrize("workload", ["{tmp}/missing.jsonl", "trace:{tmp}/missing.jsonl"])
def test_bench_workload_file_is_checked_before_the_server_probe(cli, tmp_path, workload):
    w = workload.replace("{tmp}", str(tmp_path))
    line = _one_line(cli("bench", "--url", DEAD_URL, "--archive", "", "--workload", w, timeout=120), "--workload")
    assert str(tmp_path / "missing.jsonl") in line


def test_env_value_0755_reaches_the_unit_as_written(tmp_path):
    """YAML 1.1 reads 0755 as 493: serving.env keeps the text as written (the scalar pass in core/spec.py)."""
    text = DEFAULT_SPEC.read_text().replace("  env:\n", "  env:\n    UMASK: 0755\n", 1)
    p = tmp_path / "dep.yaml"
    p.write_text(text)
    unit = service.render(spec.load(p))[0].text
    assert "Environment=UMASK=0755\n" in unit and "493" not in unit


def _dep_with_env_file(tmp_path: Path, env_file: str, python: str = sys.executable) -> spec.Deployment:
    return spec.from_dict(spec_data(**{"serving.env_file": env_file, "serving.python": python}), str(tmp_path / "dep.yaml"))


@pytest.mark.parametrize("python, status", [(sys.executable, "fail"), ("/nonexistent/bin/python", "warn")])
def test_service_check_reports_a_missing_env_file_relative_to_the_spec(tmp_path, monkeypatch, python, status):
    """A fail on the serving host (its interpreter is here); elsewhere a warn: the file may live only there."""
    monkeypatch.chdir(REPO)
    d = _dep_with_env_file(tmp_path, "secrets.env", python)
    r = service.render(d)[0]
    f = {x.id: x for x in service.cross_checks(d, r)}["service.env_file"]
    assert f.status == status and str(tmp_path / "secrets.env") in f.title and "EnvironmentFile" in f.detail


def test_service_check_reads_the_env_file_mode_relative_to_the_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "secrets.env").write_text("SGLANG_API_KEY=sk-123456789\n")
    os.chmod(tmp_path / "secrets.env", 0o644)
    d = _dep_with_env_file(tmp_path, "secrets.env")
    f = {x.id: x for x in service.cross_checks(d, service.render(d)[0])}["service.env_file"]
    assert f.status == "fail" and "0644" in f.title and f.remedy == f"chmod 600 {tmp_path / 'secrets.env'}"


# ---- a SIGKILLed run's in-progress files ---------------------------------------------------------

@pytest.mark.notebook
def test_sigkilled_run_leaves_only_owner_readable_files(tmp_path):
    d = tmp_path / "nbs"
    started = tmp_path / "started"
    make_notebook(d / "00_leak.ipynb", RUNNER_PARAMS,
                  "import os, pathlib, time\nprint('token sk-raw-secret-123456')\n"
                  "raw = pathlib.Path(results_path).parent / 'leak-raw'\nraw.mkdir()\n(raw / 'out.txt').write_text('x')\n"
                  f"open({str(started)!r}, 'w').write('1')\ntime.sleep(300)")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "runbook", "run", "--out", str(out), "--notebooks", str(d)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, umask=0)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the notebook never started"
            time.sleep(0.2)
        time.sleep(1.0)    # papermill saves the executed cell's output
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    [stale] = out.glob(".inprogress-*")
    entries = [stale, *stale.rglob("*")]
    assert any(p.suffix == ".ipynb" for p in entries) and any(p.name == "out.txt" for p in entries)
    assert any(b"sk-raw-secret-123456" in p.read_bytes() for p in entries if p.is_file())   # unscrubbed, as the issue says
    loose = {str(p.relative_to(out)): oct(p.stat().st_mode & 0o777) for p in entries if p.stat().st_mode & 0o077}
    assert not loose, loose


def test_finished_run_files_get_the_ordinary_mode(tmp_path):
    from runbook.runner.run import publish_modes

    (tmp_path / "sub").mkdir(mode=0o700)
    (tmp_path / "sub" / "a.json").write_text("{}")
    os.chmod(tmp_path / "sub" / "a.json", 0o600)
    old = os.umask(0o022)
    try:
        publish_modes(tmp_path)
    finally:
        os.umask(old)
    assert oct(tmp_path.stat().st_mode & 0o777) == "0o755"
    assert oct((tmp_path / "sub").stat().st_mode & 0o777) == "0o755"
    assert oct((tmp_path / "sub" / "a.json").stat().st_mode & 0o777) == "0o644"


# ---- what counts as a server ----------------------------------------------------------------------

MODELS = {"object": "list", "data": [{"id": "m", "object": "model"}]}


@pytest.mark.parametrize("routes, reachable", [
    ({}, False),                                             # 404 for /v1/models: some other web server
    ({"/v1/models": (200, {"hello": "world"})}, False),      # JSON, but not a model list
    ({"/v1/models": (200, ["a"])}, False),
    ({"/v1/models": (200, MODELS)}, True),
    ({"/v1/models": (401, {"error": "unauthorized"})}, True),  # an OpenAI-compatible server that wants the key
])
def test_probe_counts_only_an_openai_compatible_answer(routes, reachable):
    import asyncio

    with serve(routes) as (url, _):
        why = asyncio.run(reach.probe(url))
    assert (why is None) == reachable, why
    if not reachable:
        assert "/v1/models" in why


def test_bench_against_a_404_server_is_no_server(cli):
    with serve({}) as (url, _):
        cp = cli("bench", "--url", url, "--archive", "", "--json", timeout=120)
    doc = json.loads(cp.stdout)
    [f] = doc["findings"]
    assert f["id"] == "bench.server" and f["status"] == "skip" and "404" in f["evidence"], f


# ---- push takes the deployment lock ------------------------------------------------------------

def test_push_refuses_while_a_run_of_the_deployment_holds_the_lock(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    d = spec.load(DEFAULT_SPEC)
    with DeploymentLock(out, d.name), pytest.raises(LockHeld, match=d.name):
        push(PushOptions(out=out, archive_url="s3://bucket/prefix", deployment=str(DEFAULT_SPEC)))


def test_push_cli_exits_75_while_the_lock_is_held(cli, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with DeploymentLock(out, spec.load(DEFAULT_SPEC).name):
        cp = cli("push", "--out", out, "--archive-url", "s3://bucket/prefix", "--deployment", DEFAULT_SPEC, timeout=120)
    _one_line(cp, "another run of this deployment", code=75)


# ---- readiness probe without curl ≥ 7.71 -------------------------------------------------------

def _ready_argv(d: spec.Deployment) -> list[str]:
    from runbook.service import unitfile

    r = service.render(d)[0]
    return unitfile.split_words(unitfile.values(unitfile.parse(r.text), "Service", "ExecStartPost")[0])


def test_readiness_probe_needs_no_curl():
    d = spec.load(DEFAULT_SPEC)
    argv = _ready_argv(d)
    assert argv[0] == d.serving.python and "curl" not in " ".join(argv) and "/bin/sh" not in argv


def _with_tries(d: spec.Deployment, url: str, timeout_start_sec: int) -> list[str]:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    d = spec.from_dict(spec_data(**{"serving.host": u.hostname, "serving.port": u.port, "serving.python": sys.executable,
                                    "systemd.timeout_start_sec": timeout_start_sec}), str(DEFAULT_SPEC))
    return _ready_argv(d)


def test_readiness_probe_waits_for_the_server_and_gives_up():
    """Connection refused, then 503 (what curl needed --retry-connrefused and --retry-all-errors for), then 200:
    ready on the third try, 5 s apart; a 404 with no tries left is not ready."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: list[int] = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(503 if not seen else 200)
            self.send_response(seen[-1])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    d = spec.load(DEFAULT_SPEC)
    probe = subprocess.Popen(_with_tries(d, f"http://127.0.0.1:{port}", 20), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2)                       # the first try found nothing listening
    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert probe.wait(timeout=60) == 0, probe.communicate()
    finally:
        srv.shutdown()
        srv.server_close()
    assert seen == [503, 200]
    with serve({}) as (url, got):        # /ready is 404: not ready; one try (TimeoutStartSec 5 s)
        cp = subprocess.run(_with_tries(d, url, 5), capture_output=True, text=True, timeout=60)
        assert cp.returncode != 0 and [p for p, _ in got] == ["/ready"]


# ---- service check: only the renderer's own ${VAR} is redacted ----------------------------------

def test_check_flags_redacts_only_the_api_key_reference():
    d = spec.load(DEFAULT_SPEC)
    r = service.render(d, service.parse_args(["chat-template=${HOME}"]))[0]
    sent: list[list[str]] = []

    def fake(cmd, **kw):
        sent.append(json.loads(cmd[-1]))
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"ok": True, "version": "x", "known_flags": []}), "")

    service.check_flags(r, sys.executable, fake)
    [argv] = sent
    assert argv[argv.index("--chat-template") + 1] == "${HOME}"
    assert argv[argv.index("--api-key") + 1] == "REDACTED"


# ---- control characters in --arg values: refused (docs/service.md says why) ---------------------

@pytest.mark.parametrize("value", ["a\x01b", "a\x1bb", "a\x7fb", "a\x85b", "a\rb"])
def test_control_character_in_arg_is_refused_naming_the_flag(cli, value):
    line = _one_line(cli("service", "render", "--arg", f"chat-template={value}"), "--chat-template")
    assert "control character" in line or "carriage return" in line

