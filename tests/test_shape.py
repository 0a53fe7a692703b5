"""The one shape every stage has (docs/contributing.md, "The one shape"), checked in one place: `departures` lists how a
stage differs from it, every registered stage has none, and each planted departure is named. The finer rules each have
their own test (test_settings: cross-field rules; test_notebook_params: the generated cell; test_cli_flags: flags)."""
import ast
import importlib
import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from pydantic import Field

from runbook.core import registry
from runbook.core.options import Options, marks
from runbook.core.settings import settings_of
from runbook.runner import paramcell

NOTEBOOKS = REPO / "notebooks"
STAGES = registry.stages()


def _notebook(stage: registry.Stage, notebooks: Path = NOTEBOOKS) -> dict[str, Any]:
    return json.loads((notebooks / f"{stage.notebook}.ipynb").read_text())


def _code(nb: dict[str, Any]) -> list[tuple[bool, str]]:
    """(is the parameters cell, source) of each code cell."""
    return [("parameters" in c.get("metadata", {}).get("tags", []), "".join(c["source"]))
            for c in nb["cells"] if c["cell_type"] == "code"]


def departures(stage: registry.Stage, nb: dict[str, Any], package: Any) -> list[str]:
    """How `stage` (its notebook's JSON `nb`, its package module) departs from the one shape; [] when it has it."""
    out = []
    exported = set(getattr(package, "__all__", ()))
    for name in ("STAGE", "evaluate", "assess", stage.options.__name__):
        if name not in exported:
            out.append(f"the package does not export {name}")
    if list(inspect.signature(stage.evaluate).parameters)[:2] != ["spec", "options"] or \
            len(inspect.signature(stage.evaluate).parameters) != 2:
        out.append("evaluate is not evaluate(spec, options)")
    if settings_of(stage.options) is None and not all(marks(f).get("spec_less") for f in stage.options.model_fields.values()):
        out.append("the options are not a view of a settings model (options_view): no one merge with the spec")
    for name, f in stage.options.model_fields.items():
        if f.get_default(call_default_factory=True) is not None:
            out.append(f"option {name} has a default other than None (unset; the real default lives in the settings)")
    cells = _code(nb)
    params = [i for i, (p, _) in enumerate(cells) if p]
    if len(params) != 1:
        return [*out, "the notebook has no one parameters cell"]
    if cells[params[0]][1] != paramcell.source(stage, nb):
        out.append("the parameters cell is not what make notebook-params generates")
    after = cells[params[0] + 1][1] if params[0] + 1 < len(cells) else ""
    calls = [n for n in ast.walk(ast.parse(after)) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "evaluate"
             and getattr(n.func.value, "id", "") == "notebook"]
    if len(calls) != 1 or not calls[0].args or getattr(calls[0].args[0], "value", None) != stage.name:
        out.append(f'the cell after the parameters is not one notebook.evaluate("{stage.name}", ...) call')
    # the name the report is bound to, and no later cell that tests it (an input error is an empty report)
    bound = {t.id for n in ast.walk(ast.parse(after)) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for _, src in cells[params[0] + 2:]:
        for n in ast.walk(ast.parse(src)):
            test = getattr(n, "test", None) if isinstance(n, (ast.If, ast.IfExp)) else None
            if test is not None and {x.id for x in ast.walk(test) if isinstance(x, ast.Name)} & bound:
                out.append(f"a cell guards on the report: {ast.unparse(test)!r} (an input error is an empty report)")
    return out


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_stage_has_the_one_shape(stage):
    assert departures(stage, _notebook(stage), importlib.import_module(f"runbook.{stage.package}")) == []


class _Hand(Options):
    tp: int | None = Field(None, description="tensor parallel size (default: the spec's)")


class _WithDefault(Options):
    tp: int = Field(1, description="tensor parallel size")


def _three(spec, options, extra):
    return None


def _guarded(nb: dict[str, Any]) -> dict[str, Any]:
    """A later cell that tests the name the report is bound to (kv's notebook binds `p`)."""
    nb = json.loads(json.dumps(nb))
    nb["cells"].append({"cell_type": "code", "metadata": {}, "source": "kv.text_table(p) if p else None"})
    return nb


def _stale(nb: dict[str, Any]) -> dict[str, Any]:
    nb = json.loads(json.dumps(nb))
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    cell["source"] = "".join(cell["source"]) + "\nextra = 1"
    return nb


class _Bare:
    __all__ = ["STAGE", "evaluate"]


@pytest.mark.parametrize("plant, nb_change, package, expected", [
    ({"options": _WithDefault}, None, None, "option tp has a default other than None"),
    ({"evaluate": _three}, None, None, "evaluate is not evaluate(spec, options)"),
    ({}, _guarded, None, "a cell guards on the report: 'p'"),
    ({}, _stale, None, "the parameters cell is not what make notebook-params generates"),
    ({}, None, _Bare, "the package does not export assess"),
    ({"options": _Hand}, None, None, "the options are not a view of a settings model"),
], ids=["non-None default", "evaluate signature", "guard", "stale cell", "no assess", "options by hand"])
def test_each_departure_is_named(plant, nb_change, package, expected):
    kv = registry.get("kv_memory")
    stage = replace(kv, **plant)
    nb = _notebook(kv)
    if plant.get("options"):    # its generated cell follows the planted options, so only the default departs
        nb = _code_cell_replaced(nb, paramcell.source(stage, nb))
    found = departures(stage, nb_change(nb) if nb_change else nb, package or importlib.import_module("runbook.kv"))
    assert any(d.startswith(expected) for d in found), found


def _code_cell_replaced(nb: dict[str, Any], source: str) -> dict[str, Any]:
    nb = json.loads(json.dumps(nb))
    next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))["source"] = source
    return nb
