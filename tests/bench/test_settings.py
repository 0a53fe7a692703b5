"""Stage 40's settings are one model (bench/settings.py): the options are its view, None is unset everywhere, and the
rules are declared on the model."""
import sys

import pytest
from conftest import DEFAULT_SPEC

from runbook import cli
from runbook.bench.settings import BenchSettings
from runbook.core import spec
from runbook.core.errors import InputError
from runbook.runner import notebook


def _flushing():
    dep = spec.load(DEFAULT_SPEC)
    return dep.model_copy(update={"benchmark": dep.benchmark.model_copy(update={"flush_cache": True})})


def _cli(*argv):
    return cli._options("bench", cli.build_parser().parse_args(["bench", *argv]))


def test_a_specs_flush_cache_is_switched_off_from_the_cli_and_the_notebook(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    dep = _flushing()
    assert BenchSettings.resolve(dep, _cli()).flush_cache is True                      # unset: the spec's
    assert BenchSettings.resolve(dep, notebook.options("benchmark")).flush_cache is True
    assert BenchSettings.resolve(dep, _cli("--no-flush-cache")).flush_cache is False
    assert BenchSettings.resolve(dep, notebook.options("benchmark", flush_cache=False)).flush_cache is False
    off = spec.load(DEFAULT_SPEC)
    assert BenchSettings.resolve(off, _cli("--flush-cache")).flush_cache is True
    assert BenchSettings.resolve(off, _cli("--no-chat")).chat is False and BenchSettings.resolve(off, _cli("--chat")).chat


def test_internal_settings_are_no_flags():
    cli.build_parser()
    fields = set(cli._VERBS["bench"].options.model_fields)
    assert not fields & {"nvml", "telemetry", "telemetry_interval_s", "find_max_levels", "api_key_env", "range_ratio"}
    assert fields < set(BenchSettings.model_fields)
    with pytest.raises(SystemExit):
        _cli("--find-max-levels", "3")


@pytest.mark.parametrize("values, says", [
    ({"workers": 65}, "{workers} must be at most 64"),
    ({"workers": 2, "rates": [1.0]}, "{workers} N splits"),
    ({"requests": 5, "duration": 3.0}, "{requests} and {duration} both bound a level"),
    ({"find_max": "slo", "rates": [1.0], "concurrency": [2]}, "searches concurrency or rate, not both"),
    ({"find_max_levels": 1}, "{find_max_levels} must be at least 2"),
    ({"transport": "h2"}, "{transport} must be one of h1, aiohttp"),
    ({"find_max": "warm", "workload": "code"}, "{find_max} warm runs agent sessions: give {workload} agentic"),
    ({"find_max": "warm", "workload": "agentic", "turns": 1}, "give {turns} 2 or more"),
    ({"find_max": "warm", "workload": "agentic", "duration": 5.0}, "drop {duration}"),
])
def test_rules_are_the_models(values, says):
    """Resolved while a stage runs, an error names each setting as `{field}` for Stage.input_finding to locate; read
    as text (a library caller), by its Python name."""
    with pytest.raises(InputError) as e:
        BenchSettings.resolve(None, **values)
    assert says in e.value.template and says.replace("{", "").replace("}", "") in str(e.value)


def test_resolve_merges_the_spec_once():
    dep = spec.load(DEFAULT_SPEC)
    s = BenchSettings.resolve(dep, rates=[2.0])
    assert s.concurrency == [] and s.requests == dep.benchmark.requests_per_level and s.url == dep.serving.local_url
    assert BenchSettings.resolve(dep, duration=5.0).requests is None
    assert BenchSettings.resolve(dep, find_max="slo", find_max_levels=4).find_max_levels == 4
    with pytest.raises(Exception, match="frozen"):
        s.workers = 2  # type: ignore[misc]
