"""The stage contract (issue 28): one registry, settings declared once, CLI = notebook.

- the registry lists exactly the notebooks in notebooks/ (that no notebook file name is written as a
  string outside its own stage's package is a layout rule: tests/test_layout.py);
- every notebook parameter maps onto its stage's options model and a CLI flag of its verb;
- for the same inputs the CLI and the notebook hand `evaluate` identical options (the `--duration`
  case included: both bound a level by time, not by the spec's request count);
- adding a stage is one package + one notebook: a stage planted in a temporary package shows up as a
  CLI verb with generated flags, in the runner's notebook list, in the run summary's figures and in the
  fleet index's trends, with no other file edited.
"""
from __future__ import annotations

import ast
import json
import sys

import pytest
from conftest import DEFAULT_SPEC, REPO

from runbook import cli
from runbook.core import registry
from runbook.runner import notebook
from runbook.runner import params as params_mod

LIB = REPO / "lib" / "runbook"
NOTEBOOKS = REPO / "notebooks"
STAGES = registry.stages()


def test_registry_lists_exactly_the_notebooks():
    assert sorted(f"{s.notebook}.ipynb" for s in STAGES) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    for key in ("number", "verb", "name"):
        values = [getattr(s, key) for s in STAGES]
        assert len(values) == len(set(values)), f"two stages share a {key}"
    for s in STAGES:
        pkg = __import__(f"runbook.{s.package}", fromlist=["STAGE"])
        assert (LIB / s.package / "stage.py").is_file() and pkg.STAGE is s and pkg.evaluate is s.evaluate


def test_a_second_stage_with_a_taken_number_or_verb_is_refused():
    kv = registry.get("kv")
    with pytest.raises(ValueError, match="already taken"):
        registry.register(registry.Stage(kv.number, "other", "other", "x", kv.options, kv.evaluate))
    with pytest.raises(ValueError, match="already taken"):
        registry.register(registry.Stage(99, "other", kv.verb, "x", kv.options, kv.evaluate))
    assert "other" not in {s.name for s in registry.stages()}


def _verb_parser(verb: str):
    import argparse

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def _cli_names(verb: str) -> set[str]:
    """Option strings and positional dests of a verb."""
    p = _verb_parser(verb)
    return {o for a in p._actions for o in a.option_strings} | {a.dest for a in p._actions if not a.option_strings}


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_notebook_parameter_maps_to_an_option_and_a_cli_flag(stage):
    from runbook.core.options import flag

    declared = params_mod.notebook_params(NOTEBOOKS / f"{stage.notebook}.ipynb")
    fields = stage.options.model_fields
    names = _cli_names(stage.verb)
    for name in declared:
        if name in params_mod.RESERVED and name not in fields:
            continue              # deployment, results_path, and display-only parameters the runner sets
        field = name              # a runner-set parameter too is its option's own name (artifact_dir, flag --out)
        assert field in fields, f"{stage.notebook}: parameter {name} is not a field of {stage.options.__name__}"
        assert flag(stage.options, field) in names or field in names, f"{stage.verb}: no CLI flag for {field}"


# (argv after the verb, notebook parameters): the same inputs as a user gives them to either side.
SAME_INPUTS = {
    "environment": ([], {}),
    "quant_config": (["models/qwen3.5-397b-a17b-nvfp4"], {"model_dir": "models/qwen3.5-397b-a17b-nvfp4"}),
    "kv_memory": (["--tp", "4", "--kv-dtype", "bf16", "--contexts", "8192,32768", "--mem-fraction-static", "0.8",
                   "--gpu-mem-gib", "95.6"],
                  {"tp": 4, "kv_dtype": "bf16", "contexts": [8192, 32768], "mem_fraction_static": 0.8, "gpu_mem_gib": 95.6}),
    "service": (["--arg", "kv-cache-dtype=bf16", "--arg", "cuda-graph-bs=1,2,4", "--installed", "/tmp/u.service",
                 "--url", "http://127.0.0.1:9"],
                {"args": ["kv-cache-dtype=bf16", "cuda-graph-bs=1,2,4"], "installed_unit": "/tmp/u.service",
                 "server_url": "http://127.0.0.1:9"}),
    "verify": (["--log", "/tmp/sglang.log", "--url", "http://127.0.0.1:9", "--since", "2026-01-05 10:00"],
               {"log_file": "/tmp/sglang.log", "server_url": "http://127.0.0.1:9", "since": "2026-01-05 10:00"}),
    "benchmark": (["--url", "http://127.0.0.1:9", "--duration", "60", "--concurrency", "1,2", "--workload", "agentic",
                   "--think-time", "0.5", "--turns", "3", "--chat", "--out", "/tmp/rec", "--archive", "/tmp/arch",
                   "--speculation", "--speculation-baseline-url", "http://127.0.0.1:10", "--speculation-contexts", "128,512"],
                  {"url": "http://127.0.0.1:9", "duration": 60.0, "concurrency": [1, 2], "workload": "agentic",
                   "think_time": 0.5, "turns": 3, "chat": True, "artifact_dir": "/tmp/rec", "archive_root": "/tmp/arch",
                   "interactive": False, "speculation": True, "speculation_baseline_url": "http://127.0.0.1:10",
                   "speculation_contexts": [128, 512]}),
    "accuracy": (["--url", "http://127.0.0.1:9", "--lengths", "256,512", "--depths", "0.5", "--seed", "3",
                  "--tool-choice", "required", "--toolcall-max-tokens", "64", "--out", "/tmp/acc"],
                 {"url": "http://127.0.0.1:9", "lengths": [256, 512], "depths": [0.5], "seed": 3, "tool_choice": "required",
                  "toolcall_max_tokens": 64, "artifact_dir": "/tmp/acc"}),
    "tune": (["--candidates", "mtp,fp8-kv", "--plan-only", "--yes", "--resume", "20260105T100000Z-x", "--budget-s", "600",
              "--archive", "/tmp/arch"],
             {"candidates": ["mtp", "fp8-kv"], "plan_only": True, "yes": True, "resume": "20260105T100000Z-x", "budget_s": 600.0,
              "archive_root": "/tmp/arch"}),
}


def _notebook_defaults(stage: registry.Stage) -> dict:
    """The parameters cell's own values (None: unset), as papermill would leave them."""
    declared = params_mod.notebook_params(NOTEBOOKS / f"{stage.notebook}.ipynb")
    out = {}
    for name, d in declared.items():
        if name in ("deployment", "results_path") or (name in params_mod.RESERVED and name not in stage.options.model_fields):
            continue
        out[name] = ast.literal_eval(d["default"])
    if "interactive" in out:
        out["interactive"] = False        # what the runner sets, as stderr under cron is no terminal
    return out


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_cli_and_notebook_hand_evaluate_identical_options(stage, monkeypatch):
    assert stage.name in SAME_INPUTS, f"add the stage {stage.name} to SAME_INPUTS"
    argv, params = SAME_INPUTS[stage.name]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)        # as under cron: no progress bars
    from_cli = cli._options(stage.verb, cli.build_parser().parse_args([stage.verb, *argv]))
    from_nb = notebook.options(stage.name, **{**_notebook_defaults(stage), **params})
    assert from_cli == from_nb
    # and with nothing given, both are the model's defaults (the notebook's sentinels mean "the spec's")
    bare = [a for a in argv[:1] if a in ("report",)]
    assert cli._options(stage.verb, cli.build_parser().parse_args([stage.verb, *bare])) == \
        notebook.options(stage.name, **_notebook_defaults(stage))


def test_duration_bounds_the_level_from_the_cli_and_the_notebook(monkeypatch):
    """Issue 28's bug: `bench --duration 60` ran for 60 s; notebook 40 with duration = 60 stopped after the
    spec's request count. Both now pass through the stage's one merge (BenchSettings.resolve)."""
    from runbook import bench
    from runbook.bench.settings import BenchSettings
    from runbook.core import spec

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    dep = spec.load(DEFAULT_SPEC)
    stage = bench.STAGE
    a = BenchSettings.resolve(dep, cli._options("bench", cli.build_parser().parse_args(["bench", "--duration", "60"])))
    b = BenchSettings.resolve(dep, notebook.options(stage.name, **{**_notebook_defaults(stage), "duration": 60.0}))
    assert a == b
    assert a.duration == 60 and a.requests is None      # bounded by time, not by the spec's request count
    c = BenchSettings.resolve(dep, notebook.options(stage.name, **_notebook_defaults(stage)))
    assert c.duration is None and c.requests == dep.benchmark.requests_per_level


@pytest.mark.parametrize("value", [True, 8.0, "8.0", 8.5])
def test_a_whole_number_parameter_takes_only_whole_numbers(value):
    """pydantic's lax mode reads True as 1 and 8.0 as 8; a tensor-parallel size of True is a mistake, named."""
    from runbook.core.errors import InputError

    with pytest.raises(InputError, match=r"^tp must be an integer"):
        notebook.options("kv_memory", tp=value)
    assert notebook.options("kv_memory", tp=8).tp == notebook.options("kv_memory", tp="8").tp == 8


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_a_bad_notebook_parameter_is_one_line_naming_it(stage):
    from runbook.core.errors import InputError

    field, bad = next(((k, "x" * 3) for k, f in stage.options.model_fields.items()
                       if f.annotation in (int, float) or "int" in str(f.annotation) or "float" in str(f.annotation)),
                      ("no_such_parameter", 1))
    with pytest.raises(InputError) as e:
        notebook.options(stage.name, **{field: bad})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(field), msg


# ---- adding a stage: one package + one notebook -----------------------------------------------

_PLANTED_INIT = '''"""Stage 70: a planted stage (tests/test_registry.py)."""
from runbook.sample.stage import STAGE, SampleOptions, evaluate

__all__ = ["STAGE", "SampleOptions", "evaluate"]
'''
_PLANTED_STAGE = '''from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from runbook.core.findings import Finding
from runbook.core.options import Options, PosInt
from runbook.core.registry import Outcome, Stage, register


class SampleOptions(Options):
    action: Literal["report", "list"] = Field("report", description="report: the value; list: the items",
                                              json_schema_extra={"positional": "ACTION"})   # marked on the field
    threshold: PosInt = Field(3, description="how many")
    label: str = Field("x", description="what to call it")


@dataclass
class SampleReport:
    value: int
    findings: list = field(default_factory=list)

    def data(self):
        return {"value": self.value}


def evaluate(spec, options):
    return SampleReport(options.threshold * 14, [Finding("sample.ok", "pass", f"sample {options.label}")])


def figures(data, slo=None):
    return {"sample_value": data["value"]} if "value" in data else {}


def text(rep):
    return f"value {rep.value}"


def _list(spec, options):
    return Outcome([Finding("sample.listed", "info", "two items")], {"items": ["a", "b"]}, shown="a\\nb\\n")


STAGE = register(Stage(70, "sample", "sample", "a planted stage", SampleOptions, evaluate, figures=figures,
                       trends=("sample_value",), text=text, actions={"list": _list}, action_field="action"))
'''


@pytest.fixture
def planted_stage(tmp_path, monkeypatch):
    import runbook

    root = tmp_path / "pkgroot"
    (root / "sample").mkdir(parents=True)
    (root / "sample" / "__init__.py").write_text(_PLANTED_INIT)
    (root / "sample" / "stage.py").write_text(_PLANTED_STAGE)
    monkeypatch.setattr(runbook, "__path__", [*runbook.__path__, str(root)])
    yield root
    registry._STAGES.pop("sample", None)
    cli._VERBS.pop("sample", None)
    for m in [m for m in sys.modules if m.startswith("runbook.sample")]:
        del sys.modules[m]


def test_a_planted_stage_joins_the_cli_runner_figures_and_fleet(planted_stage, tmp_path, capsys, monkeypatch):
    from runbook.fleet import index
    from runbook.runner import figures, run

    assert [s.name for s in registry.stages()][-1] == "sample"
    # the CLI: a verb, flags generated from the options model, the stage's own entry point, one JSON shape
    assert cli.main(["sample", "--threshold", "2", "--label", "y", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["value"] == 28 and [(f["id"], f["status"], f["title"]) for f in doc["findings"]] == [("sample.ok", "pass", "sample y")]
    assert cli.main(["sample", "--threshold", "0"]) == 2
    assert "--threshold" in capsys.readouterr().err
    # its text above the findings, and its other action: what it prints, its JSON
    assert cli.main(["sample", "--threshold", "2"]) == 0
    assert capsys.readouterr().out.startswith("value 28\n[PASS] sample.ok: sample x")
    assert cli.main(["sample", "list"]) == 0 and capsys.readouterr().out == "a\nb\n"
    assert cli.main(["sample", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"items": ["a", "b"], "findings": [
        {"id": "sample.listed", "status": "info", "title": "two items", "detail": "", "evidence": "", "remedy": ""}]}
    # the runner: its notebook joins the run's list, in number order
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    for p in NOTEBOOKS.glob("*.ipynb"):
        (nbs / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(run, "NOTEBOOKS", nbs)
    with pytest.raises(Exception, match="70_sample.ipynb"):
        run.discover(nbs, [])                       # registered but missing: an error, not a shorter run
    (nbs / "70_sample.ipynb").write_bytes((NOTEBOOKS / "00_environment.ipynb").read_bytes())
    assert [p.name for p in run.discover(nbs, [])][-1] == "70_sample.ipynb"
    assert [p.name for p in run.discover(nbs, ["sample"])] == ["70_sample.ipynb"]
    # the run summary's figures and the fleet index's trends
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "70_sample.results.json").write_text(json.dumps({"data": {"value": 42}}))
    assert figures.figures(rd) == {"sample_value": 42}
    assert "sample_value" in registry.trend_keys()
    point = index._point({"_run": "r1", "_host": "h", "_html": [], "started": "2026-12-04T00:00:00Z",
                          "metrics": {"sample_value": 42}}, lambda p: p)
    assert point["sample_value"] == 42
