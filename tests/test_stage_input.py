"""An input a stage cannot use (a missing file, a bad value) is the same finding for every stage, `<verb>.input`
(`Stage.input_finding`): the notebook records it and completes, and `runbook run` exits 1 (a failed check) for
every stage alike, never 2 (a broken notebook) for some. `notebook.evaluate` then returns an empty report
(`registry.Empty`), for which every display cell shows nothing, with no guard in any cell."""
import json

import pytest
from conftest import DEFAULT_SPEC, REPO

from runbook.core import registry
from runbook.core.errors import InputError
from runbook.runner import notebook
from runbook.runner import params as params_mod

STAGES = registry.stages()

# One bad value per stage, as `runbook run --param` takes it: a missing file where the stage reads one, else a value
# its options refuse. The stages left out have no parameter a user sets.
BAD_PARAM = {"quant_config": "model_dir=/nonexistent", "kv_memory": "model_dir=/nonexistent",
             "service": "server_url=not-a-url", "verify": "server_url=not-a-url", "benchmark": "url=not-a-url",
             "accuracy": "url=not-a-url", "tune": "budget_s=-1"}
# Stages whose every user parameter the runner itself types before the notebook runs (a bool takes only
# true/false/none), so no bad value reaches the stage; `--param require_gpus=maybe` is the runner's exit 2.
NO_BAD_VALUE = {"environment"}


def _expected(stage: registry.Stage) -> dict:
    return {"id": f"{stage.verb}.input", "status": "fail", "title": f"could not run the {stage.verb} checks",
            "remedy": "Fix the file or field named above and run the notebook again."}


def _user_params(stage: registry.Stage) -> set[str]:
    return set(params_mod.notebook_params(REPO / "notebooks" / f"{stage.notebook}.ipynb")) - set(params_mod.RESERVED)


def test_the_bad_values_cover_every_stage_with_a_parameter():
    assert set(BAD_PARAM) | NO_BAD_VALUE == {s.name for s in STAGES if _user_params(s)}
    assert not set(BAD_PARAM) & NO_BAD_VALUE


def test_the_input_finding_names_the_stage_and_carries_the_error_on_one_line():
    kv = registry.get("kv")
    f = kv.input_finding(InputError("/x: no such\n   directory"))
    assert (f.id, f.status, f.detail) == ("kv.input", "fail", "/x: no such directory")


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_stage_records_an_unusable_input_as_its_input_finding(stage, tmp_path):
    """The library path every notebook takes (`notebook.evaluate`), with a setting no stage has."""
    spec = notebook.load_spec(str(DEFAULT_SPEC))
    results = tmp_path / "r.json"
    empty = notebook.evaluate(stage.name, spec, str(results), no_such_setting=1)
    assert isinstance(empty, registry.Empty) and empty.data() == {} and [f.id for f in empty.findings] == [f"{stage.verb}.input"]
    doc = json.loads(results.read_text())
    [f] = doc["findings"]
    assert {k: f[k] for k in _expected(stage)} == _expected(stage)
    assert f["detail"] == "no_such_setting: not a setting of this stage"
    assert doc["notebook"] == stage.notebook and doc["deployment"] == spec.name


@pytest.mark.notebook
@pytest.mark.parametrize("stage", [s for s in STAGES if s.name in BAD_PARAM], ids=lambda s: s.name)
def test_runbook_run_turns_a_bad_parameter_into_the_same_finding_and_exit_1(stage, cli, tmp_path):
    out = tmp_path / "out"
    cp = cli("run", "--only", stage.name, "--param", BAD_PARAM[stage.name], "--out", out)
    summary = json.loads((out / "latest" / "summary.json").read_text())
    [nb] = summary["notebooks"]
    assert cp.returncode == 1 == summary["exit_code"], cp.stderr
    assert nb["status"] == "ok" and nb["error"] is None, nb
    [f] = json.loads((out / "latest" / nb["results"]).read_text())["findings"]
    assert {k: f[k] for k in _expected(stage)} == _expected(stage)
    name, _, value = BAD_PARAM[stage.name].partition("=")
    assert name in f["detail"] or value in f["detail"], f["detail"]
    _only_the_verdict_shows(out / "latest" / nb["ipynb"])


def _only_the_verdict_shows(executed):
    """No cell errs, and no cell after the notebook's one `evaluate` call shows anything: the input finding is all."""
    cells = [c for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code"]
    first = next(i for i, c in enumerate(cells) if "notebook.evaluate(" in "".join(c["source"]))
    for c in cells:
        assert not [o for o in c.get("outputs", []) if o["output_type"] == "error"], "".join(c["source"])
    verdict = cells[first].get("outputs", [])
    assert verdict and "could not run the" in json.dumps(verdict), verdict
    shown = {"".join(c["source"]): c["outputs"] for c in cells[first + 1:] if c.get("outputs")}
    assert not shown, f"{executed.name}: cells show output after an input error: {shown}"


@pytest.mark.notebook
def test_the_environment_notebook_shows_only_its_input_finding(tmp_path):
    """00_environment's one parameter is a bool the runner types before the notebook runs, so papermill gives it
    the bad value here, as a notebook run by hand would."""
    import papermill

    from runbook.runner.execute import kernel_for

    src, out = REPO / "notebooks" / "00_environment.ipynb", tmp_path / "00_environment.ipynb"
    papermill.execute_notebook(str(src), str(out), cwd=str(src.parent), kernel_name=kernel_for(src, None, print),
                               parameters={"require_gpus": "maybe", "results_path": str(tmp_path / "r.json")},
                               progress_bar=False)
    [f] = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert f["id"] == "env.input" and "require_gpus" in f["detail"], f
    _only_the_verdict_shows(out)
