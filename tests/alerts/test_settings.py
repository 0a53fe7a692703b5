"""Bad input for the alerts settings: the spec's alerts section and --textfile-dir. One line naming the field or the
flag and the fix; exit 2; nothing written (no run folder, no textfile)."""
import pytest
from conftest import spec_data

from runbook import cli
from runbook.core import spec as spec_mod
from runbook.core.errors import SpecError

from .conftest import SECRET


@pytest.mark.parametrize("alerts, words", [
    ({"textfile_dir": "relative/dir"}, "alerts.textfile_dir: .*absolute directory"),
    ({"textfile_dir": "/var/lib/x\ny"}, "alerts.textfile_dir: .*absolute directory"),
    ({"interval_s": 0}, "alerts.interval_s: .*greater than 0"),
    ({"interval_s": 10**9}, "alerts.interval_s: .*less than or equal"),
    ({"link_base": "ftp://x.example.com"}, "alerts.link_base: .*http"),
    ({"link_base": f"https://user:{SECRET}@x.example.com/fleet"}, "alerts.link_base: must not carry credentials"),
    ({"link_base": f"https://x.example.com/fleet?token={SECRET}"}, "alerts.link_base: must not carry credentials"),
    ({"link_base": "https://x.example.com/a b"}, "alerts.link_base: .*without spaces"),
    ({"textfile": "/x"}, "alerts.textfile: .*"),
])
def test_a_bad_alerts_section_is_one_line_naming_the_field(alerts, words):
    with pytest.raises(SpecError, match=words) as e:
        spec_mod.from_dict(spec_data(alerts=alerts), "spec.yaml")
    assert "\n" not in str(e.value) and SECRET not in str(e.value)


def test_an_archive_url_with_credentials_is_not_echoed_either():
    with pytest.raises(SpecError, match="archive.url: must not carry credentials") as e:
        spec_mod.from_dict(spec_data(archive={"url": f"s3://AKIA:{SECRET}@bucket/prefix"}), "spec.yaml")
    assert SECRET not in str(e.value)


def test_the_link_base_loses_its_trailing_slash():
    assert spec_mod.from_dict(spec_data(alerts={"link_base": "https://x.example.com/fleet/"}), "s").alerts.link_base == \
        "https://x.example.com/fleet"


@pytest.mark.parametrize("where", ["flag", "env", "spec"])
def test_a_missing_textfile_dir_stops_the_run_before_anything_is_written(tmp_path, monkeypatch, where):
    """run() refuses it before the lock, the archive or a notebook (the CLI prints the line and exits 2)."""
    import io

    import yaml

    from runbook.runner.run import Log, RunOptions, run

    missing = tmp_path / "no-such-dir"
    given: dict = {}
    monkeypatch.delenv("RUNBOOK_TEXTFILE_DIR", raising=False)
    if where == "flag":
        given["textfile_dir"] = str(missing)
    elif where == "env":
        monkeypatch.setenv("RUNBOOK_TEXTFILE_DIR", str(missing))
    else:
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_data(alerts={"textfile_dir": str(missing)})))
        given["deployment"] = str(tmp_path / "spec.yaml")
    opts = RunOptions(only=["environment"], out=tmp_path / "out", **given)
    with pytest.raises(SpecError, match="not a directory; create it") as e:
        run(opts, Log(io.StringIO()))
    assert "\n" not in str(e.value)
    assert {"flag": "--textfile-dir", "env": "RUNBOOK_TEXTFILE_DIR=", "spec": "alerts.textfile_dir"}[where] in str(e.value)
    assert not (tmp_path / "out").exists() and not missing.exists()


def test_the_cli_takes_the_flag():
    a = cli.build_parser().parse_args(["run", "--textfile-dir", "/var/lib/prometheus/node-exporter"])
    assert a.textfile_dir == "/var/lib/prometheus/node-exporter"


def test_a_stage_verb_writes_its_report(tmp_path, capsys, monkeypatch):
    """`runbook kv --textfile-dir DIR`: the plan's figures and findings in runbook_<deployment>.kv_memory.prom;
    --json's stdout stays the JSON document (the textfile's line goes to stderr)."""
    import json

    monkeypatch.delenv("RUNBOOK_TEXTFILE_DIR", raising=False)
    assert cli.main(["kv", "--json", "--textfile-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["findings"] and "metrics written to" in out.err
    text = (tmp_path / "runbook_qwen3.5-397b-a17b-nvfp4.kv_memory.prom").read_text()
    assert 'runbook_kv_tokens_planned{deployment="qwen3.5-397b-a17b-nvfp4",source="verb"}' in text


@pytest.mark.parametrize("args, code, words", [
    (["kv", "--textfile-dir", "MISSING"], 2, "--textfile-dir .*: not a directory"),
    (["kv", "models/qwen3.5-397b-a17b-nvfp4", "--textfile-dir", "TMP"], 2, "metrics are per deployment; give --deployment"),
])
def test_a_stage_verb_refuses_before_it_runs(tmp_path, capsys, monkeypatch, args, code, words):
    import re

    from conftest import REPO
    monkeypatch.chdir(REPO)
    args = [str(tmp_path / "missing") if x == "MISSING" else str(tmp_path) if x == "TMP" else x for x in args]
    assert cli.main(args) == code
    err = capsys.readouterr().err.strip()
    assert re.search(words, err) and err.count("\n") == 0
    assert not list(tmp_path.iterdir())


def test_without_a_deployment_the_environments_directory_is_left_alone(tmp_path, capsys, monkeypatch):
    """RUNBOOK_TEXTFILE_DIR set for the host's runs; `runbook kv MODEL_DIR` has no deployment: nothing written, no error."""
    from conftest import REPO
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RUNBOOK_TEXTFILE_DIR", str(tmp_path))
    assert cli.main(["kv", "models/qwen3.5-397b-a17b-nvfp4"]) == 0
    assert not list(tmp_path.iterdir())


def test_an_action_refuses_the_flag_rather_than_write_nothing(tmp_path, capsys, monkeypatch):
    """`runbook accuracy kld --textfile-dir DIR` published nothing (kld is an action, not the stage's checks): now a
    one-line error, exit 2, before anything runs; nothing written."""
    monkeypatch.delenv("RUNBOOK_TEXTFILE_DIR", raising=False)
    assert cli.main(["accuracy", "kld", "--textfile-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--textfile-dir publishes `runbook accuracy`'s own checks" in err and "\n" not in err
    assert not list(tmp_path.iterdir())
