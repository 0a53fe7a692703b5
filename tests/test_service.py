import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml
from conftest import DEFAULT_SPEC, spec_data
from httpfake import serve

from runbook import service
from runbook.core import spec
from runbook.core.errors import SpecError
from runbook.service import unitfile

SERVING_PY = os.environ.get("RUNBOOK_SERVING_PYTHON")
needs_parser = pytest.mark.skipif(not (SERVING_PY and os.path.exists(SERVING_PY)),
                                  reason="SGLang parser env missing: `make serving-env` (make test builds it)")


def dep(tmp_path=None, **changes):
    data = spec_data(**changes)
    if tmp_path is None:
        return spec.from_dict(data, str(DEFAULT_SPEC))
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(data))
    return spec.load(p)


def exec_start(text):
    return unitfile.values(unitfile.parse(text), "Service", "ExecStart")[0]


def ids(findings):
    return {f.id: f for f in findings}


def test_render_default_unit():
    r = service.render(dep())[0]
    t = r.text
    for line in ["User=theuser", "Restart=on-failure", "RestartSec=30", "TimeoutStartSec=1800", "LimitMEMLOCK=infinity",
                 "KillMode=control-group", "EnvironmentFile=/etc/sglang/qwen.env", "Environment=NCCL_P2P_LEVEL=PHB",
                 "WantedBy=multi-user.target"]:
        assert line in t.splitlines(), line
    assert r.argv[:3] == ["/home/theuser/ml-env/bin/python", "-m", "sglang.launch_server"]
    assert "--kv-cache-dtype" in r.argv and r.argv[r.argv.index("--kv-cache-dtype") + 1] == "bf16"
    assert r.argv[-2:] == ["--api-key", "${SGLANG_API_KEY}"]  # expanded by systemd from the EnvironmentFile
    assert "/ready" in unitfile.values(unitfile.parse(t), "Service", "ExecStartPost")[0]
    assert unitfile.split_words(exec_start(t)) == r.argv


@pytest.mark.parametrize("value", ["qwen 3.5", 'say "hi"', "100%", "$HOME/x", "a\\b", "tab\there", "it's", ";", ""])
def test_quoting_round_trips(value):
    d = dep(**{"serving.flags": {"chat-template": value, "kv-cache-dtype": "bf16"}})
    r = service.render(d)[0]
    assert unitfile.split_words(exec_start(r.text)) == r.argv
    assert r.argv[r.argv.index("--chat-template") + 1] == value


def test_environment_values_round_trip():
    env = {"A": "has space", "B": 'quote"d', "C": "50%", "D": "back\\slash", "E": "$NOT_EXPANDED"}
    d = dep(**{"serving.env": env})
    assert unitfile.environment(unitfile.parse(service.render(d)[0].text)) == env


def test_newline_is_rejected_naming_the_flag():
    with pytest.raises(SpecError, match=r"--chat-template: contains a newline") as e:
        service.render(dep(**{"serving.flags": {"chat-template": "a\nb"}}))
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match="environment variable X: contains a newline"):
        service.render(dep(**{"serving.env": {"X": "a\nb"}}))


def test_arg_parsing():
    assert service.parse_args(["kv-cache-dtype=bf16", "--enable-metrics", "disable-radix-cache=false"]) == {
        "kv-cache-dtype": "bf16", "enable-metrics": True, "disable-radix-cache": False}
    with pytest.raises(SpecError, match="expected NAME=VALUE"):
        service.parse_args(["Bad Flag=1"])
    with pytest.raises(SpecError, match="secrets belong in serving.env_file"):
        service.parse_args(["api-key=abc"])


def test_what_if_arg_overrides_and_removes():
    r = service.render(dep(), service.parse_args(["kv-cache-dtype=fp8_e4m3", "enable-metrics=false"]))[0]
    assert r.argv[r.argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3" and "--enable-metrics" not in r.argv


def test_apply_recommended_fills_unset_flags():
    flags = {k: v for k, v in dep().serving.flags.items() if k != "kv-cache-dtype"}
    d = dep(**{"serving.flags": flags, "serving.apply_recommended": True})
    rec, _ = service.recommended_flags(d)
    assert rec["kv-cache-dtype"] == "bf16"
    r = service.render(d, None, rec)[0]
    assert r.argv[r.argv.index("--kv-cache-dtype") + 1] == "bf16"
    off = service.render(dep(**{"serving.flags": flags}), None, rec)[0]
    assert "--kv-cache-dtype" not in off.argv


def test_multi_node_units():
    d = dep(**{"parallelism.tp": 16, "parallelism.nodes": [{"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2"}]})
    units = service.render(d)
    assert [u.unit_name for u in units] == ["sglang-qwen-a", "sglang-qwen-b"]
    for rank, u in enumerate(units):
        f = unitfile.flags_of(u.argv[3:])
        assert (f["nnodes"], f["node-rank"], f["dist-init-addr"], f["tp-size"]) == ("2", str(rank), "10.0.0.1:50000", "16")
        assert f"node {u.node} rank {rank} of 2" in u.text


def test_systemd_analyze_verify_real():
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (.ci/run installs it)")
    r = service.render(dep())[0]
    f = service.verify_unit(r)
    assert [x.id for x in f if x.status in ("warn", "fail")] == [], f
    assert any(x.id == "service.systemd.binary" and x.status == "info" for x in f)
    bad = service.Rendered(r.text.replace("Restart=on-failure", "Restart=on-failure\nFooBar=1\nType=simpel"), r.argv, r.flags, "bad")
    msgs = [x.title for x in service.verify_unit(bad) if x.status == "warn"]
    assert any("Unknown key" in m and "FooBar" in m for m in msgs) and any("simpel" in m for m in msgs)


@pytest.mark.serving
@needs_parser
def test_real_sglang_parser_accepts_the_default_unit():
    f = service.check_flags(service.render(dep())[0], SERVING_PY)
    assert [(x.id, x.status) for x in f] == [("service.parser", "pass")] and "SGLang 0.5.23" in f[0].title


@needs_parser
@pytest.mark.parametrize("arg, fid, title, remedy", [
    ("kv-cahce-dtype=bf16", "service.flag.kv-cahce-dtype", "--kv-cahce-dtype: not a flag of SGLang 0.5.23",
     "Did you mean --kv-cache-dtype?"),
    ("kv-cache-dtype=fp7", "service.flag.kv-cache-dtype", "--kv-cache-dtype: rejected by SGLang 0.5.23's parser", "Fix the value"),
    ("mem-fraction-static=lots", "service.flag.mem-fraction-static", "--mem-fraction-static: rejected", "Fix the value"),
])
@pytest.mark.serving
def test_real_sglang_parser_names_the_bad_flag(arg, fid, title, remedy):
    f = ids(service.check_flags(service.render(dep(), service.parse_args([arg]))[0], SERVING_PY))
    assert fid in f and f[fid].status == "fail" and f[fid].title.startswith(title) and remedy in f[fid].remedy


@pytest.mark.serving
@needs_parser
def test_real_sglang_parser_checks_many_units_in_one_run(monkeypatch):
    """tune's candidates: one run of the interpreter for all of them, each unit's findings as check_flags gives."""
    import subprocess
    runs = []

    def counted(cmd, **kw):
        runs.append(cmd)
        return subprocess.run(cmd, **kw)

    units = [service.render(dep(), service.parse_args(a))[0] for a in ([], ["kv-cahce-dtype=bf16"], ["kv-cache-dtype=fp7"])]
    got = service.check_flags_many(units, SERVING_PY, counted)
    assert len(runs) == 1
    assert [[(x.id, x.status, x.title) for x in f] for f in got] == \
        [[(x.id, x.status, x.title) for x in service.check_flags(u, SERVING_PY)] for u in units]
    assert [f[0].status for f in got] == ["pass", "fail", "fail"]


def test_many_units_are_checked_one_by_one_when_the_one_run_does_not_answer_for_all():
    import subprocess
    runs = []

    def fake(cmd, **kw):
        job = json.loads(cmd[-1])
        runs.append(job)
        one = {"ok": True, "version": "x", "known_flags": []}
        out = [one] if isinstance(job[0], list) else one        # the batch answers for one unit of two
        return subprocess.CompletedProcess(cmd, 0, json.dumps(out), "")

    got = service.check_flags_many([service.render(dep())[0]] * 2, "/py", fake)
    assert [len(runs), [f[0].status for f in got]] == [3, ["pass", "pass"]]


def test_a_batch_cut_short_by_a_signal_is_not_run_again_unit_by_unit():
    import signal
    import subprocess

    from runbook.core import oscalls
    runs = []

    def fake(cmd, **kw):
        runs.append(cmd)
        oscalls.current().record(signal.SIGINT)      # Ctrl-C reached the parser's process group too: it died
        return subprocess.CompletedProcess(cmd, -2, "", "KeyboardInterrupt")

    with oscalls.on_signals(), pytest.raises(oscalls.Interrupted):
        service.check_flags_many([service.render(dep())[0]] * 2, "/py", fake)
    assert len(runs) == 1


def test_cross_checks(tmp_path):
    envf = tmp_path / "qwen.env"
    envf.write_text("SGLANG_API_KEY=sk-abcdef123456\n")
    envf.chmod(0o644)
    d = dep(**{"serving.env_file": str(envf)})
    rec, q = service.recommended_flags(d)
    r = service.render(d, service.parse_args(["kv-cache-dtype=auto", "context-length=9000000", "mem-fraction-static=0.8",
                                              "max-running-requests=1000"]), rec)[0]
    f = ids(service.cross_checks(d, r, q))
    assert f["service.kv_dtype"].status == "fail" and "bf16" in f["service.kv_dtype"].remedy
    assert f["service.context_length"].status == "fail"
    assert f["service.mem_fraction"].status == "warn"
    assert f["service.max_running_requests"].status == "warn" and "capped at" in f["service.max_running_requests"].title
    assert f["service.env_file"].status == "fail" and "chmod 600" in f["service.env_file"].remedy
    assert f["service.gpus"].status == "pass"
    envf.chmod(0o600)
    f = ids(service.cross_checks(d, service.render(d)[0], q))
    assert f["service.env_file"].status == "pass" and f["service.kv_dtype"].status == "pass"
    assert f["service.context_length"].status == "pass" and "service.mem_fraction" not in f


def test_diff_flag_table(tmp_path):
    d = dep()
    installed = tmp_path / "sglang-qwen.service"
    old = service.render(d, service.parse_args(["kv-cache-dtype=auto", "disable-cuda-graph"]))[0].text
    old = old.replace("Environment=NCCL_DEBUG=WARN\n", "").replace("RestartSec=30", "RestartSec=5")
    installed.write_text(old)
    text, rows, f = service.diff(service.render(d)[0], installed)
    assert text.startswith("--- ") and "+    --kv-cache-dtype bf16 \\" in text
    got = {(r["kind"], r["name"], r["change"]) for r in rows}
    assert got == {("flag", "kv-cache-dtype", "changed"), ("flag", "disable-cuda-graph", "removed"),
                   ("env", "NCCL_DEBUG", "added"), ("setting", "RestartSec", "changed")}
    assert f[0].status == "warn"
    installed.write_text(service.render(d)[0].text)
    assert service.diff(service.render(d)[0], installed)[2][0].status == "pass"


@pytest.fixture
def recorder(tmp_path):
    log = tmp_path / "systemctl.log"
    exe = tmp_path / "systemctl"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, log


def _installed(root, d):
    return root / d.systemd.installed_path.lstrip("/")


def test_install_dry_run_changes_nothing(tmp_path, recorder):
    d = dep()
    res = service.install(d, service.render(d)[0], dry_run=True, root=tmp_path / "root", systemctl=[str(recorder[0])])
    assert not (tmp_path / "root").exists() and not recorder[1].exists()
    assert [s["status"] for s in res.steps] == ["planned"] * 4 and res.findings[0].status == "info"
    assert res.steps[1]["command"].endswith("daemon-reload")


def _install_over_old_unit(tmp_path, recorder, ready_status, ready_timeout):
    """A real install into a temp root holding an old unit, with /ready answering `ready_status`."""
    d = dep()
    root = tmp_path / "root"
    unit = _installed(root, d)
    unit.parent.mkdir(parents=True)
    unit.write_text("old unit\n")
    with serve({"/ready": (ready_status, {"ok": ready_status == 200})}) as (url, _):
        res = service.install(d, service.render(d)[0], dry_run=False, root=root, systemctl=[str(recorder[0])],
                              ready_url=url + "/ready", ready_timeout=ready_timeout, interval=0.1)
    return d, unit, res


def test_install_with_backup_and_readiness(tmp_path, recorder):
    d, unit, res = _install_over_old_unit(tmp_path, recorder, 200, 5)
    assert res.findings[0].status == "pass" and not res.rolled_back
    assert unit.read_text() == service.render(d)[0].text and oct(unit.stat().st_mode & 0o777) == "0o644"
    assert Path(res.backup).read_text() == "old unit\n"
    assert recorder[1].read_text().splitlines() == ["daemon-reload", "restart sglang-qwen.service"]
    assert [s["step"] for s in res.steps] == ["back up", "write unit", "reload", "restart", "wait for readiness"]


def test_install_rolls_back_when_not_ready(tmp_path, recorder):
    _, unit, res = _install_over_old_unit(tmp_path, recorder, 503, 0.5)
    assert res.rolled_back and res.findings[0].status == "fail" and "HTTP 503" in res.findings[0].detail
    assert unit.read_text() == "old unit\n"
    # The rollback asks systemd what is running instead of assuming it (issue 13): the last call is is-active.
    assert recorder[1].read_text().splitlines() == ["daemon-reload", "restart sglang-qwen.service",
                                                    "daemon-reload", "restart sglang-qwen.service",
                                                    "is-active sglang-qwen.service"]
    assert "previous unit restored; service sglang-qwen.service is active" in res.findings[0].title


def test_install_without_previous_unit_removes_it_on_failure(tmp_path, recorder):
    d = dep()
    root = tmp_path / "root"
    res = service.install(d, service.render(d)[0], dry_run=False, root=root, systemctl=[str(recorder[0])],
                          ready_url="http://127.0.0.1:9/ready", ready_timeout=0.3, interval=0.1)
    assert res.rolled_back and not _installed(root, d).exists() and res.backup is None


SERVER_INFO = {"model_path": "nvidia/Qwen3.5-397B-A17B-NVFP4", "tp_size": 8, "kv_cache_dtype": "fp8_e4m3",
               "mem_fraction_static": 0.88, "context_length": 262144, "quantization": "modelopt_fp4", "port": 30000,
               "host": "127.0.0.1", "enable_metrics": True, "api_key": "sk-live-SECRET-123456",
               "launch_command": "--model-path x --api-key sk-live-SECRET-123456 --tp-size 8", "version": "0.5.23"}


def test_drift_finds_the_changed_flag_and_never_leaks_the_key(monkeypatch):
    monkeypatch.setenv("SGLANG_API_KEY", "sk-live-SECRET-123456")
    routes = {"/server_info": (200, SERVER_INFO), "/v1/models": (200, {"data": [{"id": "qwen3.5-397b"}]})}
    with serve(routes, require_bearer="sk-live-SECRET-123456") as (url, seen):
        rows, f, info = service.drift(dep(), url)
    assert rows == [{"flag": "kv-cache-dtype", "spec": "bf16", "server": "fp8_e4m3"}]
    assert f[0].status == "fail" and "--kv-cache-dtype fp8_e4m3" in f[0].title
    assert "SECRET" not in json.dumps(info) and info["kv_cache_dtype"] == "fp8_e4m3" and info["served_models"] == ["qwen3.5-397b"]
    assert all(a == "Bearer sk-live-SECRET-123456" for _, a in seen)


def test_drift_matching_server_and_fallback_path():
    same = dict(SERVER_INFO, kv_cache_dtype="bfloat16")
    with serve({"/get_server_info": (200, same)}) as (url, seen):
        rows, f, _ = service.drift(dep(), url)
    assert rows == [] and f[0].status == "pass" and "bfloat16" in f[0].detail
    assert [p for p, _ in seen][:2] == ["/server_info", "/get_server_info"]


def test_drift_without_server_is_skip():
    rows, f, _ = service.drift(dep(), "http://127.0.0.1:9")
    assert f[0].status == "skip"


def test_cli_drift_json_has_no_secret(cli, monkeypatch):
    with serve({"/server_info": (200, SERVER_INFO)}) as (url, _):
        cp = cli("service", "drift", "--url", url, "--json")
    assert cp.returncode == 1 and "SECRET" not in cp.stdout + cp.stderr
    assert json.loads(cp.stdout)["differences"][0]["flag"] == "kv-cache-dtype"


@pytest.mark.serving
@needs_parser
def test_cli_render_out_and_check_json(cli, tmp_path):
    out = tmp_path / "u.service"
    assert cli("service", "render", "--out", out).returncode == 0
    assert out.read_text() == service.render(dep())[0].text
    cp = cli("service", "check", "--json", "--arg", "kv-cahce-dtype=bf16")
    j = json.loads(cp.stdout)
    assert cp.returncode == 1 and any(f["id"] == "service.flag.kv-cahce-dtype" for f in j["findings"])
    cp = cli("service", "check", "--arg", "bad name")
    assert cp.returncode == 2 and "expected NAME=VALUE" in cp.stderr


def _recommending_spec():
    """apply_recommended on, kv-cache-dtype unset: the built unit gets 10_quant_config's bf16."""
    flags = {k: v for k, v in dep().serving.flags.items() if k != "kv-cache-dtype"}
    return flags, dep(**{"serving.flags": flags, "serving.apply_recommended": True})


def test_drift_compares_with_the_unit_install_writes():
    """install writes --kv-cache-dtype bf16 (a recommendation); a server on fp8_e4m3 must fail drift."""
    flags, d = _recommending_spec()
    assert "--kv-cache-dtype bf16" in service.build(d).unit.text.replace(" \\\n    ", " ")
    with serve({"/server_info": (200, SERVER_INFO)}) as (url, _):
        rows, f, _ = service.drift(d, url)
    assert rows == [{"flag": "kv-cache-dtype", "spec": "bf16", "server": "fp8_e4m3"}]
    assert ids(f)["service.drift.kv-cache-dtype"].status == "fail"
    # Without recommendations the unit leaves the dtype to SGLang, and the same server passes.
    with serve({"/server_info": (200, SERVER_INFO)}) as (url, _):
        rows, f, _ = service.drift(dep(**{"serving.flags": flags}), url)
    assert rows == [] and f[0].status == "pass"


@pytest.mark.slow  # the whole service CLI, one process a verb
def test_render_diff_install_and_drift_see_one_unit(tmp_path, cli):
    spec_file = tmp_path / "d.yaml"
    doc = yaml.safe_load(DEFAULT_SPEC.read_text())
    doc["serving"]["flags"].pop("kv-cache-dtype")
    doc["serving"]["apply_recommended"] = True
    doc["model"]["card"] = str((DEFAULT_SPEC.parent / doc["model"]["card"]).resolve())
    spec_file.write_text(yaml.safe_dump(doc))
    unit = tmp_path / "u.service"
    assert cli("service", "render", "--deployment", spec_file, "--out", unit).returncode == 0
    built = service.build(spec.load(spec_file)).unit
    assert unit.read_text() == built.text and "bf16" in built.flags["kv-cache-dtype"]
    cp = cli("service", "diff", "--deployment", spec_file, "--installed", unit, "--json")
    assert json.loads(cp.stdout)["changes"] == []
    root = tmp_path / "root"
    cp = cli("service", "install", "--deployment", spec_file, "--root", root, "--systemctl", "true", "--json")
    assert cp.returncode == 0 and json.loads(cp.stdout)["steps"]


def test_evaluate_reads_the_checkpoint_once(monkeypatch):
    from runbook.model import checkpoint

    calls = []
    real = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    rep = service.assess(dep(), installed="/nonexistent/unit.service", url="http://127.0.0.1:9")
    assert len(calls) == 1, calls
    got = {f.id for f in rep.findings}
    assert {"service.kv_dtype", "service.drift"} <= got
    assert any(i.startswith("service.systemd") for i in got)
    assert rep.data()["units"][0]["argv"] == rep.units[0].argv and rep.install_plan


def test_cli_service_report_matches_the_library(cli, tmp_path):
    cp = cli("service", "report", "--url", "http://127.0.0.1:9", "--installed", tmp_path / "none.service", "--json")
    j = json.loads(cp.stdout)
    rep = service.assess(dep(), installed=tmp_path / "none.service", url="http://127.0.0.1:9")
    assert [f["id"] for f in j["findings"]] == [f.id for f in rep.findings]
    assert j["units"] == json.loads(json.dumps(rep.data()["units"])) and j["install_plan"] == rep.install_plan
    assert cp.returncode == (1 if any(f.status == "fail" for f in rep.findings) else 0)


def test_cross_checks_read_the_checkpoint_once(monkeypatch):
    """quant.assess hands its checkpoint on (QuantReport.loaded): the capacity cross-check plans KV
    from it instead of locating and loading the checkpoint again. Both go through checkpoint.for_spec."""
    from runbook.model import checkpoint

    calls = []
    real = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    d = dep()
    rec, q = service.recommended_flags(d)
    assert q is not None and q.loaded is not None and len(calls) == 1
    f = ids(service.cross_checks(d, service.render(d, None, rec)[0], q))
    assert "service.capacity" not in f or f["service.capacity"].status != "skip"
    assert any(k.startswith("service.") and k != "service.gpus" for k in f) and len(calls) == 1, calls
