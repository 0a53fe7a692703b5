"""Errors located by field: a rule names each field as its reader knows it, the CLI's flag or the notebook's
parameter, and a bad pair is refused when the options are made, by the notebook and the CLI alike."""
import pytest

from runbook.core.errors import InputError
from runbook.runner import notebook


def test_verify_two_sources_names_the_notebook_parameters():
    with pytest.raises(InputError) as e:
        notebook.options("verify", log_file="/tmp/server.log", unit="sglang")
    assert str(e.value) == "log_file and unit are two sources: give one"


def test_verify_two_sources_names_the_flags_on_the_command_line(cli):
    cp = cli("verify", "--log", "/tmp/server.log", "--unit", "sglang")
    assert cp.returncode == 2
    assert "--log and --unit are two sources: give one" in cp.stderr and "log_file" not in cp.stderr


@pytest.mark.parametrize("params, words", [
    ({"requests": 4, "duration": 10}, "requests and duration both bound a level"),
    ({"speculation_baseline_url": "http://127.0.0.1:1"}, "speculation_baseline_url is the study's baseline: add speculation"),
    ({"workers": 2, "rates": [1.0]}, "workers N splits fixed-concurrency levels of requests over N processes"),
])
def test_bench_pairs_are_refused_by_the_notebook_options_with_parameter_names(params, words):
    with pytest.raises(InputError, match=words):
        notebook.options("benchmark", **params)


def test_bench_pairs_name_flags_on_the_command_line(cli):
    cp = cli("bench", "--url", "http://127.0.0.1:9", "--requests", "4", "--duration", "10")
    assert cp.returncode == 2 and "--requests and --duration both bound a level" in cp.stderr


def test_unset_values_pass_the_rules():
    assert notebook.options("benchmark", workers=None, rates=None).workers is None


def test_an_error_the_stage_raises_names_the_parameter_in_the_notebook_and_the_flag_on_the_command_line(tmp_path):
    """Not a pair the options refuse but one the spec decides (replicas each have their own log): raised while the
    stage runs, named as `{field}` and located by Stage.input_finding for its reader."""
    from topology.specs import topo

    from runbook.core import registry

    rep = notebook.evaluate("verify", topo(), "", log_file=str(tmp_path / "x.log"))
    (f,) = rep.findings
    assert f.id == "verify.input" and "give log_dir (replica-NAME.log" in f.detail and "--" not in f.detail
    err = InputError("{log_dir}: the spec declares no topology.replicas; give {log_file}")
    assert registry.get("verify").input_finding(err, cli=True).detail == (
        "--log-dir: the spec declares no topology.replicas; give --log")
    assert registry.get("verify").input_finding(err).detail == "log_dir: the spec declares no topology.replicas; give log_file"
    # read as text by a library caller: the Python names it passes; a unit's ${var} is no field
    assert str(err) == "log_dir: the spec declares no topology.replicas; give log_file"
    assert str(InputError("ExecStart=${args} in {unit}")) == "ExecStart=${args} in unit"
