"""The one settings base (core/settings.py): each field names where its spec value comes from and `resolve` is the one
merge for every stage; None is unset in every options model; a cross-field rule lives on the options, so a notebook and
the CLI refuse the same bad pair at the same moment, each naming the fields as its reader knows them."""
import re

import pytest
from conftest import DEFAULT_SPEC

from runbook import cli
from runbook.core import registry
from runbook.core import spec as spec_mod
from runbook.core.errors import InputError
from runbook.core.settings import Settings, read
from runbook.runner import notebook

# (stage, notebook parameters, CLI argv after the verb, the names the notebook's error gives, the flags the CLI's gives)
BAD_PAIRS = [
    ("benchmark", {"requests": 10, "duration": 5.0}, ["--requests", "10", "--duration", "5"],
     ("requests", "duration"), ("--requests", "--duration")),
    ("kv_memory", {"tp": 2, "attn_dp": 4}, ["--tp", "2", "--attn-dp", "4"], ("attn_dp", "tp"), ("--attn-dp", "--tp")),
    ("verify", {"log_file": "/tmp/x.log", "unit": "sglang"}, ["--log", "/tmp/x.log", "--unit", "sglang"],
     ("log_file", "unit"), ("--log", "--unit")),
    ("accuracy", {"url": "http://127.0.0.1:9", "floor_url": "http://127.0.0.1:9/"},
     ["--url", "http://127.0.0.1:9", "--floor-url", "http://127.0.0.1:9/"], ("floor_url", "url"), ("--floor-url", "--url")),
]


@pytest.mark.parametrize("stage, params, argv, names, flags", BAD_PAIRS, ids=[p[0] for p in BAD_PAIRS])
def test_a_bad_pair_is_refused_by_the_notebook_and_the_cli_alike(stage, params, argv, names, flags, capsys):
    with pytest.raises(InputError) as e:
        notebook.options(stage, **params)
    said = str(e.value)
    assert all(re.search(rf"(?<![-\w]){n}\b", said) for n in names) and "--" not in said, said
    verb = registry.get(stage).verb
    assert cli.main([verb, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"runbook {verb}: error: ") and err.count("\n") == 1, err
    assert all(f in err for f in flags), err


def _settings_models():
    from runbook.accuracy.settings import AccuracySettings
    from runbook.bench.settings import BenchSettings
    from runbook.env.stage import EnvSettings
    from runbook.kv.memory import Inputs
    from runbook.runner.run import RunSettings
    from runbook.tune.settings import TuneSettings

    return [AccuracySettings, BenchSettings, EnvSettings, Inputs, RunSettings, TuneSettings]


@pytest.mark.parametrize("model", _settings_models(), ids=lambda m: m.__name__)
def test_every_spec_path_is_a_place_in_the_spec(model):
    """A misspelt path would read None forever (the default, silently): each one names a field of the spec's models,
    down to a mapping (serving.flags, whose keys are SGLang's)."""
    dep = spec_mod.load(DEFAULT_SPEC)
    for name, f in model.model_fields.items():
        source = (f.json_schema_extra or {}).get("spec") if isinstance(f.json_schema_extra, dict) else None
        if not isinstance(source, str):
            continue
        obj = dep
        for part in source.split("."):
            if isinstance(obj, dict):
                break
            assert part in type(obj).model_fields, f"{model.__name__}.{name}: {source!r} is not in the spec"
            obj = getattr(obj, part)


def test_unset_takes_the_spec_value_a_set_option_wins_and_a_refused_spec_value_names_its_place(tmp_path):
    from runbook import bench, kv, tune
    from runbook.bench.settings import BenchSettings
    from runbook.tune.settings import TuneSettings

    dep = spec_mod.load(DEFAULT_SPEC)
    s = BenchSettings.resolve(dep, bench.BenchStageOptions())
    assert (s.concurrency, s.warmup, s.url) == (list(dep.benchmark.concurrency), dep.benchmark.warmup, dep.serving.local_url)
    assert BenchSettings.resolve(dep, notebook.options("benchmark", warmup=0)).warmup == 0     # 0 is a value
    t = TuneSettings.resolve(dep, tune.TuneOptions())
    assert (t.budget_s, t.plan_only, t.yes) == (dep.tune.budget_s, False, False)
    assert TuneSettings.resolve(dep, tune.TuneOptions(budget_s=60)).budget_s == 60
    inp = kv.assess(dep).inputs
    assert (inp.tp, inp.mem_fraction_static) == (dep.parallelism.tp, float(dep.serving.flags["mem-fraction-static"]))
    bad = dep.model_copy(update={"serving": dep.serving.model_copy(update={"flags": {**dep.serving.flags, "page-size": "big"}})})
    with pytest.raises(InputError, match=r"serving\.flags --page-size must be an integer \(got 'big'\)"):
        kv.assess(bad)


def test_no_options_model_has_a_default_but_none():
    """None is unset in every options model (the runner's too): the default lives in the settings or the spec, and
    --help shows it."""
    from runbook.runner.run import RunOptions

    for model in [s.options for s in registry.stages()] + [RunOptions]:
        for name, f in model.model_fields.items():
            assert f.get_default(call_default_factory=True) is None, f"{model.__name__}.{name}"
    run_help = cli.build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "(default: 1800)" in " ".join(run_help.split())


def test_a_settings_model_without_a_spec_takes_its_own_defaults():
    class Demo(Settings):
        n: int = 3

    assert Demo.resolve(None).n == 3 and Demo.resolve(None, None, n=None).n == 3 and Demo.resolve(None, n=5).n == 5
    assert read({"a": {"b": 1}}, "a.b") == 1 and read({"a": None}, "a.b") is None
