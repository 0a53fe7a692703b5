"""Stage 30 against the real SGLang server on CPU: the rendered unit's ExecStart, as systemd parses it back, is the
command that runs the live server; its ExecStartPost readiness probe fails while SGLang is starting and passes once
it serves; `service drift` against the live /server_info names exactly the flags that differ from the spec."""
import subprocess
import urllib.request

import pytest
from adversarial.test_unit_injection import SYSTEMD, systemd_view

from runbook import service
from runbook.core import ports
from runbook.demo import sglang

pytestmark = [pytest.mark.sglang]


def _unit(dep):
    assert SYSTEMD is not None, "systemd (for `systemd --test`) is not installed: .ci/run installs it"
    r = service.render(dep)[0]
    return r, systemd_view(r)


def test_the_units_exec_start_is_what_runs_the_live_server(sglang_server):
    r, view = _unit(sglang_server.spec)
    assert view["ExecStart"] == [r.argv] == [sglang_server.argv]       # systemd's reading = the running command line
    assert r.argv[:3] == [sglang_server.spec.serving.python, "-m", "sglang.launch_server"]
    info = sglang_server.server_info()
    assert (info["model_path"], info["port"], info["device"]) == (sglang_server.spec.model.path, sglang_server.port, "cpu")


def test_readiness_probe_fails_while_sglang_starts_and_passes_once_it_serves(tmp_path):
    dep = sglang.deployment(ports.free_port())
    _, view = _unit(dep)
    [probe] = view["ExecStartPost"]
    assert probe[-2] == f"{dep.serving.local_url}/health"
    srv = sglang.launch(dep, log_path=tmp_path / "server.log")
    try:
        once = subprocess.run(probe[:-1] + ["1"], capture_output=True, timeout=30)     # its tries cut to one
        assert once.returncode == 1 and srv.proc.poll() is None       # refused, and the server is still starting
        full = subprocess.run(probe, capture_output=True, timeout=dep.systemd.timeout_start_sec + 30)
        assert full.returncode == 0, full.stderr[-500:]
        with urllib.request.urlopen(srv.url + "/health", timeout=10) as resp:
            assert resp.status == 200
        assert "The server is fired up" in srv.log.read_text()
    finally:
        srv.stop()


def test_drift_names_nothing_when_the_spec_is_what_runs(sglang_server):
    rows, findings, info = service.drift(sglang_server.spec)
    assert rows == [] and [f.status for f in findings] == ["pass"], [f.title for f in findings]
    assert info["version"] == "0.5.23" and info["served_models"] == [sglang.SERVED_NAME]


def test_drift_names_exactly_the_flags_that_differ(sglang_server):
    spec = sglang_server.spec
    changed = {**spec.serving.flags, "mem-fraction-static": 0.03, "schedule-policy": "lpm", "chunked-prefill-size": 2048,
               "schedule-conservativeness": 1.0}       # the last is what SGLang runs by default: no drift
    other = spec.model_copy(update={"serving": spec.serving.model_copy(update={"flags": changed})})
    rows, findings, _ = service.drift(other)
    by_flag = {r["flag"]: (r["spec"], r["server"]) for r in rows}
    assert by_flag == {"mem-fraction-static": ("0.03", "0.05"), "schedule-policy": ("lpm", "fcfs"),
                       "chunked-prefill-size": ("2048", "4096")}, rows
    assert sorted(f.id for f in findings) == sorted(f"service.drift.{k}" for k in by_flag)
