"""Committed notebooks: no outputs, a runner-compatible parameters cell, the project's kernel."""
import ast
import json

import pytest
from conftest import REPO

from runbook.core import registry
from runbook.runner import notebook, params

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["00_environment.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert not c.get("outputs") and c.get("execution_count") is None, path.name
    assert "papermill" not in nb["metadata"]
    assert nb["metadata"]["kernelspec"]["name"] == "runbook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_cell_declares_runner_parameters(path):
    declared = params.notebook_params(path)
    assert declared["deployment"]["inferred_type_name"] == "str"
    assert declared["results_path"]["inferred_type_name"] == "str"
    assert declared["results_path"]["default"] in ('""', "''")
    nb = json.loads(path.read_text())
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "parameters" in first_code["metadata"].get("tags", [])
    assert nb["cells"][0]["cell_type"] == "markdown" and "".join(nb["cells"][0]["source"]).startswith("# ")


# Set by the runner, not stage settings: what they take when a notebook runs by hand is their own.
_NOT_STAGE = ("deployment", "results_path", "interactive")


@pytest.mark.parametrize("stage", registry.stages(), ids=lambda s: s.name)
def test_stage_parameters_default_to_none(stage):
    """A stage parameter is `T | None = None` with a comment saying what None takes (the spec's value, the stage's
    default), or holds the option's own default (seed 0, plan_only False); the cell as it stands gives exactly the
    options model's defaults: None is unset, as an absent flag."""
    declared = params.notebook_params(REPO / "notebooks" / f"{stage.notebook}.ipynb")
    fields = stage.options.model_fields
    values = {}
    for name, d in declared.items():
        if name in _NOT_STAGE:
            continue
        f = fields[name]
        values[name] = ast.literal_eval(d["default"])
        if values[name] is None:
            assert d["inferred_type_name"].endswith(" | None"), (name, d)
            assert "None" in d["help"] or "set by the runner" in d["help"], (name, d["help"])
        else:
            assert f.default is not None and values[name] == f.get_default(call_default_factory=True), (name, d)
    assert notebook.options(stage.name, **values) == stage.options()


def test_none_parameters_need_no_sentinel():
    """What papermill injects for a None parameter is Python's None, and the CLI's absent flag is the same None."""
    from papermill.translators import PythonTranslator

    assert PythonTranslator.codify({"tp": None, "require_gpus": False}).splitlines()[1:] == ["tp = None", "require_gpus = False"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_after_an_input_error_no_cell_shows_anything(path, monkeypatch, capsys):
    """Every cell after the notebook's one `evaluate` call, run on the empty report an input error gives (no guard in
    any cell): nothing printed, no cell raising. The notebook runs through `runbook run` in tests/test_stage_input.py."""
    from runbook.core.findings import Finding

    empty = registry.Empty([Finding("x.input", "fail", "could not run the x checks")])
    monkeypatch.setattr(notebook, "evaluate", lambda *a, **k: empty)
    monkeypatch.chdir(path.parent)
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    ns: dict = {}
    for src in cells:
        exec(compile(src, path.name, "exec"), ns)  # the committed notebook's own cells
        if "notebook.evaluate(" in src:
            capsys.readouterr()                     # what the parameters and the evaluate cell showed is theirs
    assert capsys.readouterr().out == ""
    assert "if report" not in "".join(cells) and " else None" not in "".join(cells)
