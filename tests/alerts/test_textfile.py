"""Where the textfile goes (flag > env > spec) and how it is written: atomically, 0644, the old file whole on failure."""
import os
import stat
import sys

import pytest
import unprivileged
from prometheus_client import CollectorRegistry, Gauge

from runbook.alerts import publish, textfile
from runbook.core import fsutil
from runbook.core import spec as spec_mod
from runbook.core.errors import SpecError

from .conftest import SECRET, write_run


def test_precedence_flag_env_spec(tmp_path):
    env = {textfile.ENV: "/from/env"}
    assert textfile.resolve_dir("/from/flag", "/from/spec", env) == (tmp_path.joinpath("/from/flag"), "--textfile-dir /from/flag")
    assert textfile.resolve_dir(None, "/from/spec", env)[0].as_posix() == "/from/env"
    assert textfile.resolve_dir(None, "/from/spec", {})[0].as_posix() == "/from/spec"
    assert textfile.resolve_dir(None, None, {}) == (None, "")
    assert textfile.resolve_dir("", None, {textfile.ENV: ""}) == (None, "")


@pytest.mark.parametrize("make, words", [
    (lambda p: p / "missing", "not a directory; create it"),
    (lambda p: (p / "f").write_text("x") and p / "f", "not a directory"),
    (lambda p: p / "bad\x01name", "control characters"),
])
def test_a_directory_it_cannot_write_is_refused_before_the_run(tmp_path, make, words):
    with pytest.raises(SpecError, match=words) as e:
        textfile.check_dir(make(tmp_path), "--textfile-dir X")
    assert "\n" not in str(e.value)


def test_an_unwritable_directory_is_refused():
    """Root writes anywhere: ask without the privilege to write (tests/unprivileged.py), wherever the checkout is."""
    probe = ("import pathlib, sys\nfrom runbook.alerts import textfile\ntry:\n"
             "    textfile.check_dir(pathlib.Path(sys.argv[1]), '--textfile-dir X')\n"
             "except Exception as e:\n    print(type(e).__name__, e)")
    with unprivileged.readonly_dir("rb-textfile-") as d:
        cp = unprivileged.run([sys.executable, "-c", probe, d], timeout=60)
        assert cp.stdout.startswith("SpecError") and "not writable" in cp.stdout, (cp.stdout, cp.stderr)
        assert list(d.iterdir()) == []


def _registry(value: float) -> CollectorRegistry:
    reg = CollectorRegistry()
    Gauge("runbook_test", "t", ("deployment",), registry=reg).labels(deployment="d1").set(value)
    return reg


def test_written_atomically_with_mode_0644_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        path = textfile.write(tmp_path, "d1", _registry(1))
    finally:
        os.umask(old)
    assert path.name == "runbook_d1.prom" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert 'runbook_test{deployment="d1"} 1.0' in path.read_text()


def test_a_write_that_fails_half_way_leaves_the_previous_file(tmp_path, monkeypatch):
    path = textfile.write(tmp_path, "d1", _registry(1))
    before = path.read_bytes()

    def crash(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fsutil.os, "fsync", crash)
    with pytest.raises(OSError):
        textfile.write(tmp_path, "d1", _registry(2))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runbook_d1.prom"]     # no temp file left behind


def test_the_textfile_masks_a_secret_as_a_last_guard(tmp_path):
    reg = CollectorRegistry()
    Gauge("runbook_test", "t", ("id",), registry=reg).labels(id=f"x{SECRET}").set(1)
    assert SECRET not in textfile.write(tmp_path, "d1", reg, [SECRET]).read_text()


def test_publish_logs_a_failure_and_keeps_going(tmp_path):
    run = write_run(tmp_path / "out")
    spec = spec_mod.load(None)
    lines: list[str] = []
    assert publish(tmp_path / "gone", {"deployment": spec.name, "notebooks": []}, run, spec, [], lines.append) is None
    assert "textfile not written" in lines[0]
    ok = publish(tmp_path, {"deployment": spec.name, "notebooks": [], "run_id": "r", "host": "h"}, run, spec, [], lines.append)
    assert ok and ok.name == f"runbook_{spec.name}.prom" and "metrics written" in lines[1]


def test_a_run_supersedes_the_stage_verbs_files_of_the_stages_it_ran(tmp_path):
    spec = spec_mod.load(None)
    ran = {"deployment": spec.name, "run_id": "r", "host": "h", "notebooks": [{"name": "35_verify", "status": "ok"}]}
    for stage in ("verify", "benchmark"):
        textfile.write(tmp_path, spec.name, _registry(1), stage=stage)
    publish(tmp_path, ran, write_run(tmp_path / "out"), spec, [], [].append)
    assert sorted(p.name for p in tmp_path.glob("*.prom")) == [f"runbook_{spec.name}.benchmark.prom", f"runbook_{spec.name}.prom"]


def test_a_stage_verbs_file_holds_no_secret_of_the_spec(tmp_path, monkeypatch):
    """The spec's env_file values and its API key variable's value (core/secrets.of_spec) are scrubbed from the verb's
    labels: a finding id holding one is counted, never a label."""
    from types import SimpleNamespace

    from conftest import spec_data

    from runbook.alerts import publish_stage
    from runbook.core.findings import Finding

    (tmp_path / "secrets.env").write_text(f"HF_HUB_X={SECRET}\n")
    monkeypatch.setenv("RUNBOOK_TEST_KEY", SECRET + "-key")
    spec = spec_mod.from_dict(spec_data(**{"serving.env_file": "secrets.env", "serving.api_key_env": "RUNBOOK_TEST_KEY"}),
                              str(tmp_path / "spec.yaml"))
    report = SimpleNamespace(findings=[Finding(f"verify.{SECRET}", "fail", "t"), Finding(f"verify.{SECRET}-key", "fail", "t"),
                                       Finding("verify.kv_dtype", "fail", "t")], data=lambda: {})
    path = publish_stage(tmp_path, spec, "verify", report, [].append)
    text = path.read_text()
    assert path.name == f"runbook_{spec.name}.verify.prom" and SECRET not in text
    assert 'id="verify.kv_dtype"' in text and 'source="verb",stage="verify",status="fail"} 3.0' in text
