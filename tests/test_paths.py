"""runbook.core.paths in a checkout: every folder is the checkout's own, as before the wheel could run alone.

The installed-wheel side (packaged notebooks and deployment, ./outputs, the XDG cache) runs for real in
tests/test_wheel.py."""
from conftest import DEFAULT_SPEC, REPO

from runbook.core import paths
from runbook.core import spec as spec_mod
from runbook.runner import run


def test_a_checkout_uses_its_own_folders(monkeypatch):
    monkeypatch.delenv("RUNBOOK_CACHE", raising=False)
    monkeypatch.setenv("RUNBOOK_OUTPUTS", "/elsewhere")      # only an installed wheel reads it
    assert paths.repo_root() == REPO
    assert paths.notebooks_dir() == REPO / "notebooks" == run.NOTEBOOKS
    assert paths.default_deployment() == DEFAULT_SPEC == spec_mod.DEFAULT_SPEC
    assert paths.outputs_dir() == REPO / "outputs" == run.OUTPUTS
    assert paths.cache_dir() == REPO / ".cache"              # the Makefile's LLAMA_SERVER lives here


def test_runbook_cache_overrides_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNBOOK_CACHE", str(tmp_path))
    assert paths.cache_dir() == tmp_path


def test_git_commit_names_the_checkout():
    commit = run.git_commit()
    assert commit and commit.split("-")[0] == __import__("subprocess").check_output(
        ["git", "rev-parse", "HEAD"], cwd=REPO, text=True).strip()
