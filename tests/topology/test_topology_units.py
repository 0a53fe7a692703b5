"""Stage 30 over every unit of a topology: each replica's, each node rank's and the gateway's, checked by systemd
itself and by each program's own parser (SGLang's for servers, the pinned gateway wheel's for the gateway)."""
import json
import shutil

import pytest
from conftest import DEFAULT_SPEC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook import service
from runbook.core.errors import SpecError
from runbook.service import gateway, unitfile
from runbook.service.check import gpus_finding

from .specs import needs_gateway, nodes_dep, topo

needs_systemd = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed (.ci/run installs it)")

def exec_start(text):
    return unitfile.values(unitfile.parse(text), "Service", "ExecStart")[0]


def test_gpus_count_every_replica_sharing_the_unit_s_host():
    """gpu-01 holds r0 and r1 (TP 4 each): its 8 GPUs are all at work; gpu-02's one TP 4 replica leaves 4 idle."""
    d = topo()
    got = {u.replica: gpus_finding(d, u) for u in service.stage.all_units(d) if u.replica}
    assert (got["r0"].status, got["r0"].title) == ("pass", "2 replicas × TP 4 × PP 1 = 8 GPUs of 8 on gpu-01")
    assert got["r1"].title == got["r0"].title
    assert (got["r2"].status, got["r2"].title) == ("warn", "TP 4 × PP 1 = 4 GPUs of 8 on gpu-02")
    assert "add a replica" in got["r2"].remedy


def test_every_unit_is_rendered_with_its_host_and_role():
    units = service.stage.all_units(topo())
    assert [(u.unit_name, u.host, u.role) for u in units] == [
        ("sglang-qwen-r0", "gpu-01", "server"), ("sglang-qwen-r1", "gpu-01", "server"),
        ("sglang-qwen-r2", "gpu-02", "server"), ("sglang-qwen-gateway", "gw-01", "gateway")]
    g = units[-1]
    assert g.argv[g.argv.index("--worker-urls") + 1:g.argv.index("--policy")] == [
        "http://gpu-01:30000", "http://gpu-01:30001", "http://gpu-02:30000"]
    assert unitfile.split_words(exec_start(g.text)) == g.argv
    assert g.argv[-2:] == ["--api-key", "${GATEWAY_API_KEY}"]   # expanded by systemd, never inlined


def test_render_out_writes_every_unit(cli, tmp_path):
    d = topo()
    f = tmp_path / "d.yaml"
    import yaml

    data = d.model_dump(mode="json")
    data["model"]["card"] = str((DEFAULT_SPEC.parent / data["model"]["card"]).resolve())
    f.write_text(yaml.safe_dump(data))
    out = tmp_path / "units"
    cp = cli("service", "render", "--deployment", f, "--out", out, "--json")
    assert cp.returncode == 0, cp.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["sglang-qwen-gateway.service", "sglang-qwen-r0.service", "sglang-qwen-r1.service", "sglang-qwen-r2.service"]
    j = json.loads(cp.stdout)["units"]
    assert [(u["role"], u["host"], u["replica"]) for u in j] == [
        ("server", "gpu-01", "r0"), ("server", "gpu-01", "r1"), ("server", "gpu-02", "r2"), ("gateway", "gw-01", None)]
    assert (out / "sglang-qwen-gateway.service").read_text() == j[-1]["text"]


@needs_systemd
def test_systemd_analyze_verifies_every_replica_rank_and_gateway_unit():
    units = service.stage.all_units(topo()) + service.render(nodes_dep())
    for u in units:
        bad = [f for f in service.verify_unit(u) if f.status in ("warn", "fail")]
        assert bad == [], (u.unit_name, bad)
    g = units[3]
    broken = service.Rendered(g.text.replace("Restart=on-failure", "Restart=sometimes"), g.argv, g.flags, g.unit_name)
    assert any("sometimes" in f.title for f in service.verify_unit(broken) if f.status == "warn")


@needs_gateway
def test_the_gateway_parser_accepts_the_rendered_flags():
    d = topo()
    f = gateway.check_gateway(d, gateway.render_unit(d))
    assert [x.status for x in f if x.id == "service.gateway.parser"] == ["pass"], f
    assert "smg 1.13.0" in f[-1].title


@needs_gateway
@pytest.mark.parametrize("flags, fid, field", [
    ({"health-check-interval-secs": "soon"}, "service.gateway.flag.health-check-interval-secs",
     "topology.gateway.flags.health-check-interval-secs"),
    ({"health-check-intervall-secs": 5}, "service.gateway.flag.health-check-intervall-secs",
     "topology.gateway.flags.health-check-intervall-secs"),
])
def test_the_gateway_parser_refuses_a_bad_flag_naming_its_field(flags, fid, field):
    d = topo(flags)
    f = {x.id: x for x in gateway.check_gateway(d, gateway.render_unit(d))}
    assert f[fid].status == "fail" and f[fid].title.startswith(field), f
    assert "service.gateway.parser" not in f
    if "intervall" in fid:
        assert "--health-check-interval-secs" in f[fid].remedy


def test_no_gateway_interpreter_is_a_skip(monkeypatch, tmp_path):
    monkeypatch.delenv("RUNBOOK_GATEWAY_PYTHON", raising=False)
    monkeypatch.setattr(gateway.paths, "repo_root", lambda: tmp_path)
    d = topo(gateway_python="/nonexistent/python")
    f = gateway.check_gateway(d, gateway.render_unit(d))
    assert [(x.id, x.status) for x in f] == [("service.gateway.parser", "skip")] and "make gateway-env" in f[0].remedy


# Values the gateway must get exactly (or be refused with one line naming the field): systemd quoting of `$`, `%`,
# quotes and spaces, checked against the project's systemd word splitter here and the real parser below.
_HOSTILE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=0, max_size=30)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_HOSTILE)
def test_gateway_flag_values_reach_the_gateway_exactly_or_are_refused(value):
    try:
        u = gateway.render_unit(topo({"log-dir": value}))
    except SpecError as e:
        msg = str(e)
        assert "topology.gateway.flags.log-dir: " in msg and "\n" not in msg   # one line naming the field
        return
    assert unitfile.split_words(exec_start(u.text)) == u.argv
    assert u.argv[u.argv.index("--log-dir") + 1] == value


@needs_gateway
def test_hostile_values_parse_as_exactly_that_word_in_the_real_gateway():
    values = ["with space", 'say "hi"', "it's", "100%", "$HOME/x", "${NOT_EXPANDED}", "a\\b", "tab\there", ";", "--x"]
    d = topo({"log-dir": "x"})
    py, _ = gateway.gateway_python(d)
    argvs = []
    for v in values:
        u = gateway.render_unit(topo({"log-dir": v}))
        argvs.append(gateway.probe_argv(gateway.router_args_of(d, unitfile.split_words(exec_start(u.text)))))
    res = gateway.run_parser(d, argvs, py)
    got = [r["parsed"].get("log_dir") if r["ok"] else r.get("error") for r in res]
    assert got[:-1] == values[:-1]
    # argparse takes a value starting with -- as a flag: refused, and named
    assert res[-1]["ok"] is False and "--log-dir" in res[-1]["error"]
    with pytest.raises(SpecError, match=r"^topology.gateway.flags.log-dir: contains a newline"):
        gateway.render_unit(topo({"log-dir": "a\nb"}))
