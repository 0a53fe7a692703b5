"""The runner end to end: real papermill, real kernels, a temp archive root."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import DEFAULT_SPEC, REPO, RUNNER_PARAMS, make_notebook, record

from runbook.core import registry
from runbook.runner.run import DeploymentLock

TOKEN = "hf_PLANTEDsecretVALUE0123456789"
pytestmark = pytest.mark.notebook


def _summary(out: Path) -> dict:
    return json.loads((out / "latest" / "summary.json").read_text())


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One `python -m runbook run` on the default deployment, with a token in the environment."""
    out = tmp_path_factory.mktemp("out")
    env = dict(os.environ, HF_TOKEN=TOKEN)
    cp = subprocess.run([sys.executable, "-m", "runbook", "run", "--out", str(out)], capture_output=True, text=True,
                        env=env, cwd=REPO, timeout=600)
    return cp, out


def test_default_run_archives_everything(default_run):
    cp, out = default_run
    s = _summary(out)
    # exit 1 exactly when a finding failed (on a machine without the serving interpreter, serving.python does)
    assert cp.returncode == (1 if s["findings"]["fail"] else 0) and s["exit_code"] == cp.returncode, cp.stderr
    run_dir = out / s["run_id"]
    assert (out / "latest").resolve() == run_dir.resolve()
    assert re.fullmatch(r"\d{8}T\d{6}Z-qwen3\.5-397b-a17b-nvfp4", s["run_id"])
    assert s["deployment"] == "qwen3.5-397b-a17b-nvfp4" and s["deployment_file"] == str(DEFAULT_SPEC)
    assert s["exit_code"] == cp.returncode
    names = [n["name"] for n in s["notebooks"]]
    # every notebook but those a plain run leaves out (60_tune takes the server down: `--only tune`)
    assert names == sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb") if p.stem != registry.notebook("tune"))
    for n in s["notebooks"]:
        assert n["status"] == "ok", n
        assert n["papermill_exit"] == 0 and n["error"] is None and n["duration_s"] > 0
        assert set(n["findings"]) == {"pass", "warn", "fail", "skip", "info"} and sum(n["findings"].values()) > 0
        nb = nbformat.read(str(run_dir / n["ipynb"]), as_version=4)
        assert nb.metadata["runbook"]["status"] == "ok"
        assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
        html = (run_dir / n["html"]).read_text()
        assert "rb-toggle" in html and "<table" in html
        assert ".inprogress-" not in html  # the injected-parameters cell is removed from the HTML
        res = json.loads((run_dir / n["results"]).read_text())
        assert res["notebook"] == n["name"] and res["findings"]
    env = s["notebooks"][0]
    assert env["name"] == "00_environment" and env["findings"]["skip"] >= 1  # no GPU here: skip, not error
    md = (run_dir / "summary.md").read_text()
    assert md.startswith(f"# Runbook run {s['run_id']}") and "| 00_environment" in md.replace("[", "| ").replace("| | ", "| ")
    index = (out / "index.html").read_text()
    assert s["run_id"] in index and f'href="{s["run_id"]}/00_environment.html"' in index
    assert "Archive:" in cp.stdout and "Index:" in cp.stdout
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ runbook: ", cp.stderr, re.M)
    assert "\033[" not in cp.stdout + cp.stderr  # not a terminal: no colours
    assert not list(out.glob(".inprogress-*"))


def test_planted_token_appears_nowhere(default_run):
    _, out = default_run
    for p in out.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


@pytest.fixture
def nbdir(tmp_path):
    d = tmp_path / "nbs"
    make_notebook(d / "00_first.ipynb", RUNNER_PARAMS,
                  record('[Finding("first.ok", "pass", "fine")]'))
    make_notebook(d / "10_raises.ipynb", RUNNER_PARAMS, "raise ValueError('boom from the notebook')")
    make_notebook(d / "20_last.ipynb",
                  RUNNER_PARAMS + "n: int = 1\nratio: float = 0.5\nflag: bool = False\nname: str = 'x'\nlevels: list = [1]\n",
                  record('[Finding("last.typed", "fail" if n == 7 else "pass", "typed")]',
                         '{"n": n, "ratio": ratio, "flag": flag, "name": name, "levels": levels, "types": [type(v).__name__ for v in '
                         '(n, ratio, flag, name)]}'))
    return d


def test_notebook_error_gives_exit_2_and_others_still_run(cli, nbdir, tmp_path):
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--notebooks", nbdir)
    assert cp.returncode == 2, cp.stderr
    s = _summary(out)
    st = {n["name"]: n for n in s["notebooks"]}
    assert [st[k]["status"] for k in ("00_first", "10_raises", "20_last")] == ["ok", "failed", "ok"]
    assert "ValueError: boom from the notebook" in st["10_raises"]["error"]
    assert st["10_raises"]["papermill_exit"] == 1
    md = (out / "latest" / "summary.md").read_text()
    assert md.index("## Errors") < md.index("## Notebooks") and "boom from the notebook" in md
    assert "did not complete" in (out / "latest" / "10_raises.html").read_text()
    nb = json.loads((out / "latest" / "10_raises.ipynb").read_text())
    assert nb["metadata"]["runbook"]["status"] == "failed"


def test_params_are_typed_by_the_parameters_cell(cli, nbdir, tmp_path):
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--notebooks", nbdir, "--only", "first,20_last", "--param", "n=7",
             "--param", "ratio=12.10", "--param", "flag=true", "--param", "name=12.10", "--param", "levels=1,2,4")
    assert cp.returncode == 1, cp.stderr  # the typed finding fails when n == 7
    data = json.loads((out / "latest" / "20_last.results.json").read_text())["data"]
    assert data["n"] == 7 and data["ratio"] == 12.1 and data["flag"] is True and data["name"] == "12.10"
    assert data["types"] == ["int", "float", "bool", "str"] and data["levels"] == ["1", "2", "4"]
    assert [n["name"] for n in _summary(out)["notebooks"]] == ["00_first", "20_last"]


@pytest.mark.parametrize("args, message", [
    (["--param", "n=seven"], "--param n=seven: 20_last.ipynb declares n: int"),
    (["--param", "nope=1"], "no selected notebook has a parameter 'nope'"),
    (["--param", "api_key=abc"], "refusing to pass a secret"),
    (["--param", "deployment=x"], "set by the runner"),
    (["--only", "missing"], "--only missing: no such notebook"),
    (["--deployment", "/nonexistent.yaml"], "deployment spec not found"),
])
def test_bad_run_input_is_one_line_exit_2(cli, nbdir, tmp_path, args, message):
    cp = cli("run", "--out", tmp_path / "out", "--notebooks", nbdir, *args)
    assert cp.returncode == 2 and message in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "latest").exists()


def test_second_concurrent_run_exits_75(cli, nbdir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with DeploymentLock(out, "qwen3.5-397b-a17b-nvfp4"):
        cp = cli("run", "--out", out, "--notebooks", nbdir, "--only", "first")
    assert cp.returncode == 75 and "another run of this deployment is in progress" in cp.stderr
    assert f"held by pid {os.getpid()}" in cp.stderr
    assert not (out / "latest").exists()


def test_concurrent_cli_runs_one_wins(nbdir, tmp_path):
    out = tmp_path / "out"
    slow = nbdir.parent / "slow"
    make_notebook(slow / "00_sleep.ipynb", RUNNER_PARAMS, "import time; time.sleep(6)", record())
    cmd = [sys.executable, "-m", "runbook", "run", "--out", str(out), "--notebooks", str(slow)]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = out / ".locks" / "qwen3.5-397b-a17b-nvfp4.lock"
    for _ in range(100):
        if lock.exists() and lock.read_text().strip():
            break
        time.sleep(0.1)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 75
    assert first.wait(timeout=120) == 0


def test_timeout_kills_notebook_and_run_continues(cli, nbdir, tmp_path):
    slow = nbdir.parent / "slow"
    make_notebook(slow / "00_hang.ipynb", RUNNER_PARAMS, "import time; time.sleep(120)")
    make_notebook(slow / "10_after.ipynb", RUNNER_PARAMS, record('[Finding("after", "pass", "ran")]'))
    out = tmp_path / "out"
    t0 = time.monotonic()
    cp = cli("run", "--out", out, "--notebooks", slow, "--timeout", "4")
    assert time.monotonic() - t0 < 90
    assert cp.returncode == 2
    st = {n["name"]: n for n in _summary(out)["notebooks"]}
    assert st["00_hang"]["status"] == "failed" and "timed out" in st["00_hang"]["error"]
    assert st["10_after"]["status"] == "ok"


def test_whole_run_bound_skips_the_rest(cli, nbdir, tmp_path):
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--notebooks", nbdir, "--only", "first,last", "--run-timeout", "0.5")
    st = {n["name"]: n for n in _summary(out)["notebooks"]}
    assert all(n["status"] == "skipped" for n in st.values()) and "whole-run bound" in st["00_first"]["error"]
    assert cp.returncode == 0


def test_retention_keeps_n_newest_and_index_lists_them(cli, nbdir, tmp_path):
    out = tmp_path / "out"
    for _ in range(3):
        assert cli("run", "--out", out, "--notebooks", nbdir, "--only", "first", "--keep", "2").returncode == 0
    runs = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".") and not p.is_symlink())
    assert len(runs) == 2
    index = (out / "index.html").read_text()
    assert all(r in index for r in runs)
    assert (out / "latest").resolve().name == runs[-1]


def test_stale_inprogress_dir_is_not_listed_and_is_cleaned(cli, nbdir, tmp_path):
    out = tmp_path / "out"
    stale = out / ".inprogress-20200101T000000Z-qwen3.5-397b-a17b-nvfp4"
    stale.mkdir(parents=True)
    (stale / "summary.json").write_text("{}")
    assert cli("run", "--out", out, "--notebooks", nbdir, "--only", "first").returncode == 0
    assert not stale.exists()
    assert "20200101" not in (out / "index.html").read_text()


def test_strict_turns_skip_into_exit_1(cli, tmp_path):
    d = tmp_path / "nbs"
    make_notebook(d / "00_skip.ipynb", RUNNER_PARAMS, record('[Finding("gpu", "skip", "no GPU")]'))
    assert cli("run", "--out", tmp_path / "a", "--notebooks", d).returncode == 0
    assert cli("run", "--out", tmp_path / "b", "--notebooks", d, "--strict").returncode == 1


def test_a_notebook_whose_kernel_is_not_installed_runs_on_this_interpreter(cli, tmp_path):
    """A pip-installed runbook has no "runbook" kernel registered: the runner uses ipykernel's python3 here."""
    d = tmp_path / "nbs"
    nb_path = make_notebook(d / "00_k.ipynb", RUNNER_PARAMS, "import sys\nprint('PY=' + sys.executable)", record())
    nb = nbformat.read(str(nb_path), as_version=4)
    nb.metadata["kernelspec"]["name"] = "no-such-kernel-here"
    nbformat.write(nb, str(nb_path))
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--notebooks", d)
    assert cp.returncode == 0, cp.stderr
    assert "kernel 'no-such-kernel-here' is not installed" in cp.stderr
    ran = nbformat.read(str(out / "latest" / "00_k.ipynb"), as_version=4)
    printed = "".join(o.get("text", "") for c in ran.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"PY={sys.executable}" in printed
