"""tune over the gateway's policies with the real gateway (smg from `make gateway-env`).

Production safety: the production gateway is smg started by the stand-in systemctl (tests/tune/fake_systemd.py) from
its rendered unit's ExecStart, the replicas are units of their own; tune stops only the gateway's unit, and only with
--yes, launches each candidate gateway on a free port (never production's), and restores the gateway's unit — after a
normal end and after SIGTERM — without one call to the replicas' units. Live: a tune over two policies on
`gateway_fleet` (two SGLang CPU replicas), the candidates measured through the gateway with the agentic workload
(throughput, TTFT and cache hits per turn from SGLang's cached_tokens), the routing guard and the noise rule applied."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from runbook import cli
from runbook.core import ports
from runbook.core import spec as spec_mod
from runbook.tune import report
from runbook.tune import stage as tune_stage
from tune.procs import http_server, pid_gone, sigint_default


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _eventually(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _state(fake, unit: str) -> str:
    return subprocess.run([*fake.systemctl, "is-active", unit], capture_output=True, text=True).stdout.strip()


def _write(dep: spec_mod.Deployment, tune: dict, path: Path) -> Path:
    data = dep.model_dump(mode="json", exclude_none=True)
    data["tune"] = tune
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _production_gateway(fake, dep: spec_mod.Deployment, log: Path) -> tuple[str, str]:
    """The gateway's unit declared from its rendered ExecStart and started: (unit, its /health URL)."""
    from runbook import service

    unit = service.gateway_unit_name(dep)
    (fake.state / f"{unit}.cmd.json").write_text(json.dumps({"argv": service.render_gateway(dep).argv, "log": str(log)}))
    assert subprocess.run([*fake.systemctl, "start", unit]).returncode == 0
    url = dep.topology.gateway.url + "/health"
    assert _eventually(lambda: _ready(url), 30), log.read_text()[-2000:]
    return unit, url


@pytest.fixture
def fleet_units(tmp_path, fake_systemd):
    """Replicas as units (stand-in HTTP servers answering /health) and the production gateway, real smg, as a unit."""
    from runbook.demo import topology

    dep = topology.deployment(2)
    for r in dep.topology.replicas:
        fake_systemd.declare(f"{dep.systemd.unit_name}-{r.name}", http_server(tmp_path / r.name, r.port), tmp_path / f"{r.name}.log")
        assert subprocess.run([*fake_systemd.systemctl, "start", f"{dep.systemd.unit_name}-{r.name}"]).returncode == 0
    unit, url = _production_gateway(fake_systemd, dep, tmp_path / "gateway.log")
    tune = {"gateway_policies": ["round_robin"], "ready_timeout_s": 6, "reference_runs": 1, "slo_search": False}
    path = _write(dep, tune, tmp_path / "fleet.yaml")
    replicas = {f"{dep.systemd.unit_name}-{r.name}": fake_systemd.main_pid(f"{dep.systemd.unit_name}-{r.name}")
                for r in dep.topology.replicas}
    yield fake_systemd, spec_mod.load(path), path, unit, url, replicas
    for u in [unit, *replicas]:
        subprocess.run([*fake_systemd.systemctl, "stop", u], timeout=60)


@pytest.mark.server
def test_without_yes_the_active_gateway_unit_is_a_safety_stop(fleet_units, tmp_path, capsys):
    fake, dep, path, unit, url, replicas = fleet_units
    code = cli.main(["tune", "--deployment", str(path), "--archive", str(tmp_path / "arch")])
    err = capsys.readouterr().err
    assert code == cli.EXIT_SAFETY_STOP == 77
    assert err.startswith(f"runbook tune: safety stop: production unit {unit} is active") and "--yes" in err
    assert not (tmp_path / "arch").exists() and _ready(url)
    calls = [c[1:] for c in fake.calls() if c[0] == "systemctl" and c[1] != "start"]
    assert calls == [["is-active", unit]]          # the gateway's unit asked, nothing stopped, no replica touched


@pytest.mark.server
def test_yes_stops_only_the_gateway_unit_and_restores_it(fleet_units, tmp_path):
    fake, dep, path, unit, url, replicas = fleet_units
    before = fake.main_pid(unit)
    settings = tune_stage.TuneSettings.resolve(dep, tune_stage.TuneOptions(yes=True, archive=str(tmp_path / "arch")))
    rep = tune_stage.assess(dep, settings, systemctl=fake.systemctl)
    ids = {f.id: f for f in rep.findings}
    assert unit in ids["tune.production.stopped"].title and ids["tune.production.restored"].status == "pass"
    assert pid_gone(before) and _state(fake, unit) == "active" and fake.main_pid(unit) != before and _ready(url)
    # the candidates ran on ports of their own, on loopback; the replicas' units were never stopped or restarted
    rows = {r["name"]: r for r in rep.rows}
    assert set(rows) == {"reference", "policy=round_robin"}
    for r in rows.values():
        argv = r["argv"]
        assert argv[argv.index("--port") + 1] != str(dep.topology.gateway.port) and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--policy") + 1] == r["policy"]
        assert r["status"] == "failed" and r["failure_kind"] == "timeout"     # stand-in replicas serve no model
    touched = [c for c in fake.calls() if c[0] == "systemctl" and any(u in c for u in replicas) and c[1] != "start"]
    assert touched == [] and all(fake.main_pid(u) == pid for u, pid in replicas.items())
    verbs = [c[1:] for c in fake.calls() if c[0] == "systemctl" and unit in c]
    assert ["stop", unit] in verbs and verbs[-1][0] in ("start", "is-active")


@pytest.mark.server
def test_sigterm_during_a_candidate_restores_the_gateway_unit(fleet_units, tmp_path):
    fake, dep, path, unit, url, replicas = fleet_units
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"), TMPDIR=str(tmp_path))
    tune = subprocess.Popen([sys.executable, "-m", "runbook", "tune", "--deployment", str(path), "--yes", "--archive",
                             str(tmp_path / "arch")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    try:
        # the candidate gateway is up (its log exists) and production's is stopped: the signal lands mid-run
        assert _eventually(lambda: any((tmp_path / "arch").glob("tune/*/logs/*.log")) and _state(fake, unit) != "active", 90)
        tune.send_signal(signal.SIGTERM)
        assert tune.wait(90) == 128 + signal.SIGTERM
        assert _state(fake, unit) == "active" and _ready(url)
        err = tune.stderr.read()
        assert "restored" in err and "--resume" in err
    finally:
        tune.kill()
    assert all(fake.main_pid(u) == pid for u, pid in replicas.items())


def test_live_tune_over_two_policies_through_the_gateway(gateway_fleet, tmp_path, fake_systemd):
    """cache_aware (the fleet's) against round_robin, two replicas of the tiny model; a production gateway unit (a
    second smg in front of the same replicas) stopped and restored around the run."""

    g = gateway_fleet.spec.topology.gateway
    prod = gateway_fleet.spec.model_copy(update={"topology": gateway_fleet.spec.topology.model_copy(
        update={"gateway": g.model_copy(update={"port": ports.free_port(), "prometheus_port": ports.free_port()})})})
    unit, url = _production_gateway(fake_systemd, prod, tmp_path / "prod-gateway.log")
    tune = {"gateway_policies": ["round_robin"], "concurrency": [2], "requests_per_level": 4, "turns": 3, "input_len": 128,
            "output_len": 16, "slo_search": False, "reference_runs": 2, "ready_timeout_s": 60,
            "guard": {"identity_prompts": 2, "identity_max_tokens": 16, "min_identical_tokens": 8, "toolcall": False,
                      "kld_windows": 0}}
    dep = spec_mod.load(_write(prod, tune, tmp_path / "fleet.yaml"))
    try:
        settings = tune_stage.TuneSettings.resolve(dep, tune_stage.TuneOptions(yes=True, archive=str(tmp_path / "arch")))
        rep = tune_stage.assess(dep, settings,
                                  systemctl=fake_systemd.systemctl)
        ids = {f.id: f for f in rep.findings}
        assert ids["tune.production.restored"].status == "pass" and _state(fake_systemd, unit) == "active" and _ready(url)
        rows = {r["name"]: r for r in rep.rows}
        for name, policy in (("reference", "cache_aware"), ("policy=round_robin", "round_robin")):
            r = rows[name]
            assert r["status"] == "done", (name, r.get("reason"), r.get("log_tail"))
            assert r["server_info"]["policy"] == policy and r["server_info"]["healthy"] == 2
            assert {w["url"] for w in r["server_info"]["workers"]} == {x.url for x in dep.topology.replicas}
            assert r["prepared"]["cache_flushed"] == "ok"
            b = r["bench"]
            assert b["output_tok_s"] > 0 and b["failed_requests"] == 0
            assert [t["turn"] for t in b["turns"]] == [1, 2, 3] and all(t["cache_hit_rate"] is not None for t in b["turns"])
        # the guard: delivery and provenance, no numerics probe
        assert [c["probe"] for c in rows["reference"]["guard"]["checks"]] == ["workers", "answers"]
        checks = {c["probe"]: c for c in rows["policy=round_robin"]["guard"]["checks"]}
        assert set(checks) == {"workers", "answers", "identity"} and checks["workers"]["status"] == "pass"
        assert checks["answers"]["status"] == "pass", checks["answers"]
        assert rows["policy=round_robin"]["guard"]["tested"].startswith("gateway policy cache_aware vs round_robin")
        # the noise rule: the reference launched again, the candidate's gain judged against both bounds
        assert rows["reference"]["repeats"][0]["status"] == "done" and rows["reference"]["noise"]["runs"] == 2
        assert rows["policy=round_robin"]["gain"]["reference_runs"] == 2
        hits = {n: report.cache_hits(rows[n]["bench"]["turns"]) for n in rows}
        print("\n" + report.text_table(rep) + f"\ncache hit per turn: {hits}")
        # cache_aware keeps a session on the replica that holds its prefix: its later turns hit at least as often
        ca = [t["cache_hit_rate"] for t in rows["reference"]["bench"]["turns"][1:]]
        rr = [t["cache_hit_rate"] for t in rows["policy=round_robin"]["bench"]["turns"][1:]]
        assert sum(ca) / len(ca) >= sum(rr) / len(rr), hits
    finally:
        subprocess.run([*fake_systemd.systemctl, "stop", unit], timeout=60)
