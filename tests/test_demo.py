"""`make demo`'s own inputs: what it hands `runbook run` must be what every notebook of the run accepts (a
--param reaches every notebook declaring that name, with that notebook's type)."""
from pathlib import Path

from conftest import REPO

from runbook.core import registry
from runbook.demo.runbook import run_params
from runbook.runner import params


def test_the_demo_run_params_fit_every_notebook_of_the_run():
    notebooks = [REPO / "notebooks" / f"{s.notebook}.ipynb" for s in registry.stages() if s.in_default_run]
    pairs = run_params("http://127.0.0.1:30000", Path("/tmp/demo-sglang-server.log"), "/models/tiny",
                       "http://127.0.0.1:30001")[1::2]
    typed = params.resolve(pairs, notebooks)    # raises on a value a declaring notebook's type refuses
    by_name = {nb.stem: v for nb, v in typed.items()}
    assert by_name["50_accuracy"]["lengths"] == [512, 1024]
    assert by_name["40_benchmark"]["url"] == by_name["50_accuracy"]["compare_url"] == "http://127.0.0.1:30000"
    assert "concurrency" not in by_name["40_benchmark"]   # the spec's levels, not a --param accuracy reads too
    assert by_name["50_accuracy"]["url"] == "http://127.0.0.1:30001"     # 50 judges the FP8-KV candidate against it
    assert "compare_url" not in by_name["40_benchmark"]


def test_a_plain_concurrency_param_reaches_the_benchmark_only():
    """The cron line `runbook run --param concurrency=1,2` sets the benchmark's levels; accuracy's batch is its own
    name (batch_size), so no notebook of the run refuses the value."""
    notebooks = [REPO / "notebooks" / f"{s.notebook}.ipynb" for s in registry.stages() if s.in_default_run]
    typed = {nb.stem: v for nb, v in params.resolve(["concurrency=1,2"], notebooks).items()}
    assert typed["40_benchmark"]["concurrency"] == [1, 2]
    assert all("concurrency" not in v for name, v in typed.items() if name != "40_benchmark")


def test_the_one_box_flow_changes_the_unit_and_names_the_record(tmp_path, capsys):
    """`make demo`'s one-box flow (demo/onebox.py) on the real model's deployment: production's spec names the
    record, the candidate's differs from it in the KV dtype alone, and changing the unit shows that one flag and
    leaves the candidate's ExecStart in place; the rollback puts the reference's back."""
    from runbook.cli import main as cli
    from runbook.core.spec import load
    from runbook.demo import onebox, realmodel
    from runbook.demo.tune import write_sglang_spec

    spec = write_sglang_spec(tmp_path / "demo.yaml", 31001, source=realmodel.spec_path())
    rec = tmp_path / "reference.kld"
    ref, cand = onebox.production(spec, rec, tmp_path / "p.yaml"), onebox.production(spec, rec, tmp_path / "c.yaml",
                                                                                      {"kv-cache-dtype": "fp8_e4m3"})
    a, b = load(ref), load(cand)
    assert a.accuracy.record == b.accuracy.record == str(rec.resolve())
    assert {k: v for k, v in b.serving.flags.items() if a.serving.flags.get(k) != v} == {"kv-cache-dtype": "fp8_e4m3"}
    assert a.serving.port == b.serving.port == 31001             # one box, one port
    unit = tmp_path / "units" / "demo.service"
    unit.parent.mkdir()
    cli(["service", "render", "--deployment", str(ref), "--out", str(unit)])
    capsys.readouterr()
    onebox.change_unit(cand, unit)
    shown = capsys.readouterr().out
    assert "+    --kv-cache-dtype fp8_e4m3" in shown and shown.count("\n-    --") == 1     # the flag added, one line moved
    assert "--kv-cache-dtype fp8_e4m3" in unit.read_text()
    onebox.change_unit(ref, unit)
    assert "--kv-cache-dtype" not in unit.read_text()


def test_the_one_box_table_puts_each_compare_beside_the_two_server_probe():
    from runbook.demo import onebox

    steps = [onebox.Step("candidate", 1, "r2", {"kld_verdict": "warn", "kld_excess": 0.0074, "kld_top1_drop_pts": 3.7}, "fired"),
             onebox.Step("rollback", 0, "r3", {"kld_verdict": "pass", "kld_excess": 0.0, "kld_top1_drop_pts": 0.0}, "resolved")]
    rows = onebox.table({"kld_verdict": "warn", "kld_excess": 0.0071, "kld_top1_drop_pts": 3.9}, steps).splitlines()
    assert [r.split()[-1] for r in rows[2:]] == ["fired", "resolved"]
    assert "0.00710" in rows[1] and "0.00740" in rows[2] and "pass" in rows[3]
