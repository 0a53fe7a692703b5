"""Notebook parameters: the names users have are kept (tests/fixtures/notebook-params.json, recorded from the notebooks
before their parameters cells were generated), each parameters cell is what `make notebook-params` generates from its
stage's options model, and the notebook's one call hands every stage parameter to `evaluate`."""
import ast
import json
from pathlib import Path
from typing import Literal

import pytest
from conftest import REPO
from pydantic import Field

from runbook.core import registry
from runbook.core.options import Options, PosInt, Url
from runbook.runner import paramcell, params

NOTEBOOKS = REPO / "notebooks"
KEPT = json.loads((REPO / "tests" / "fixtures" / "notebook-params.json").read_text())
STAGES = registry.stages()


def test_the_parameter_names_users_have_are_kept():
    assert set(KEPT) == {s.notebook for s in STAGES}
    for stem, names in KEPT.items():
        have = set(params.notebook_params(NOTEBOOKS / f"{stem}.ipynb"))
        assert set(names) <= have, f"{stem}.ipynb lost the parameters {sorted(set(names) - have)} (users set them)"


def test_every_parameters_cell_is_generated_from_its_options_model():
    stale = paramcell.stale(NOTEBOOKS)
    assert not stale, f"stale parameters cells in {stale}: run make notebook-params"


def test_the_staleness_check_can_fail(tmp_path):
    for p in NOTEBOOKS.glob("*.ipynb"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    nb = tmp_path / "20_kv_memory.ipynb"
    doc = json.loads(nb.read_text())
    cell = next(c for c in doc["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = "".join(cell["source"]).replace("tensor parallel size", "TP")
    nb.write_text(json.dumps(doc))
    assert paramcell.stale(tmp_path) == ["20_kv_memory"]
    assert paramcell.write(tmp_path) == ["20_kv_memory"] and paramcell.stale(tmp_path) == []


def _evaluate_keywords(stem: str) -> list[str]:
    cells = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    call = next(n for n in ast.walk(ast.parse("".join(code[1]["source"])))
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "evaluate")
    for k in call.keywords:
        assert isinstance(k.value, ast.Name) and k.value.id == k.arg, f"{stem}: {k.arg}= is not passed as itself"
    return [k.arg for k in call.keywords if k.arg]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_the_notebook_hands_every_stage_parameter_to_evaluate(stage):
    declared = params.notebook_params(NOTEBOOKS / f"{stage.notebook}.ipynb")
    taken = set(stage.options.model_fields)
    wanted = [n for n in declared if n not in ("deployment", "results_path") and (n not in params.RESERVED or n in taken)]
    assert _evaluate_keywords(stage.notebook) == wanted


class _Merged(Options):
    """A stage whose options carry runner-set names themselves (bench after `out` became `artifact_dir`)."""
    action: Literal["report", "other"] | None = Field(None, description="report (default): what the notebook shows",
                                                      json_schema_extra={"positional": "ACTION"})
    artifact_dir: str | None = Field(None, description="write the records here (default: not written)")
    interactive: bool | None = Field(None, description="progress bars on stderr (default: off)")
    levels: list[PosInt] | None = Field(None, description="load levels, e.g. 1,2 (default: the spec's); see --url")
    url: Url | None = Field(None, description="the server (default: the spec's)")
    plan_only: bool = Field(False, description="plan only")
    yes: bool | None = Field(None, description="other: really do it (default: dry run)", json_schema_extra={"notebook": False})


def _stage(options: type[Options]) -> registry.Stage:
    kv = registry.get("kv")
    return registry.Stage(99, "merged", "merged", "x", options, kv.evaluate, action_field="action")


def test_a_runner_parameter_that_is_also_a_field_is_declared_once():
    src = paramcell.source(_stage(_Merged), {"cells": []})
    assert src.splitlines() == [
        'deployment: str = "../deployments/qwen3.5-397b-a17b-nvfp4.yaml"  # deployment spec (YAML)',
        'results_path: str = ""  # results JSON written here; set by the runner',
        "artifact_dir: str | None = None  # raw records written here; set by the runner (None: not written)",
        "interactive: bool = True  # a person is at the notebook (False under the runner): 20's what-if panel, 40's progress bars",
        "levels: list[int] | None = None  # load levels, e.g. 1,2 (None: the spec's); see url",
        "url: str | None = None  # the server (None: the spec's)",
        "plan_only: bool = False  # plan only",
    ]


def test_a_runner_parameter_the_notebook_reads_is_declared_and_one_it_does_not_is_not():
    reads = {"cells": [{"cell_type": "code", "metadata": {}, "source": "kv.what_if(p, spec, model_dir, interactive)"}]}
    kv = registry.get("kv")
    assert "interactive: bool = True" in paramcell.source(kv, reads)
    assert "interactive" not in paramcell.source(kv, {"cells": []})


def test_a_none_default_must_say_what_none_takes():
    class Silent(Options):
        tp: PosInt | None = Field(None, description="tensor parallel size")

    with pytest.raises(ValueError, match=r"merged option tp: .*\(default: X\)"):
        paramcell.source(_stage(Silent), {"cells": []})


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_declared_type_reads_back_through_the_runner(stage):
    """What the generator writes is what `--param` types values by (params.coerce), so `--param tp=8` is an int."""
    for name, d in params.notebook_params(NOTEBOOKS / f"{stage.notebook}.ipynb").items():
        assert params._type(d["inferred_type_name"]) is not None, (stage.notebook, name, d["inferred_type_name"])


def test_type_names():
    from runbook.core.options import FiniteFloat

    assert paramcell.type_name(list[PosInt] | None) == "list[int]"
    assert paramcell.type_name(Literal["fixed", "exp"] | None) == "str"
    assert paramcell.type_name(Path | None) == "str"
    assert paramcell.type_name(FiniteFloat) == "float"
    with pytest.raises(ValueError):
        paramcell.type_name(int | str)
