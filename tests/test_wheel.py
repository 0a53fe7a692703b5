"""The package as users get it: a built wheel, installed in a fresh venv, outside the checkout.

The frozen corpus, the templates, the notebooks and the default deployment are package data; an
editable install would hide their absence."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import DEFAULT_SPEC, REPO


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    cp = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", REPO],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    (whl,) = (tmp / "dist").glob("runbook-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cp = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--force-reinstall", "-q", str(whl)],
                        capture_output=True, text=True, timeout=300, env=clean)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert (env_dir / "bin" / "runbook").is_file(), cp.stdout + cp.stderr
    site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True,
                                        env=clean).strip())
    # The runbook's dependencies come from this venv (a path entry, so its editable runbook finder is not loaded);
    # the runbook itself only from the wheel. Written after the install, so pip never sees the editable runbook.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # nbconvert's HTML templates are data files its install puts under the venv's share/jupyter; link them
    # alone (not the whole share/jupyter: that holds this venv's "runbook" kernel, which runs the checkout).
    (env_dir / "share" / "jupyter").mkdir(parents=True)
    (env_dir / "share" / "jupyter" / "nbconvert").symlink_to(Path(sys.prefix) / "share" / "jupyter" / "nbconvert")
    return env_dir, tmp


def _tree(root: Path, tools: bool = False) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime: what a run must leave as it was. tools=False leaves out the
    checkout's venvs, tool caches and __pycache__: tests on the other xdist worker write there (bytecode, mypy)
    while this one runs, and the wheel's runbook imports nothing from the checkout that could put files there."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if tools or not (d.startswith(".") or d == "__pycache__")]
        for f in filenames:
            st = os.lstat(os.path.join(dirpath, f))
            out[os.path.join(dirpath, f)] = (st.st_size, st.st_mtime_ns)
    return out


def _changed(before: dict, after: dict) -> list[str]:
    """The paths added, removed or rewritten, the first ten: the trees hold thousands of files."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))[:10]


def _site(env_dir: Path) -> Path:
    (site,) = (env_dir / "lib").glob("python*/site-packages")
    return site


def _run(env_dir, tmp, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RUNBOOK_OUTPUTS")}
    return subprocess.run([*args], capture_output=True, text=True, timeout=900, cwd=tmp, env=env)


def test_wheel_installs_the_cli_and_its_package_data(wheel_venv):
    env_dir, tmp = wheel_venv
    cp = _run(env_dir, tmp, env_dir / "bin" / "runbook", "bench", "--help")
    assert cp.returncode == 0 and "--workload" in cp.stdout, cp.stderr
    code = ("import json, runbook, runbook.corpus as c\n"
            "from runbook.bench import workloads\n"
            "w = workloads.build('code', 3)\n"
            "lc = workloads.build('longctx', 1, input_len=2048)\n"
            "print(json.dumps({'file': runbook.__file__, 'bad': c.verify(), 'version': w.corpus_version,"
            " 'prompts': [r.prompt for r in w.requests], 'longctx': len(lc.requests[0].prompt)}))")
    cp = _run(env_dir, tmp, env_dir / "bin" / "python", "-c", code)
    assert cp.returncode == 0, cp.stderr
    j = json.loads(cp.stdout)
    assert str(env_dir) in j["file"], "runbook was imported from the checkout, not the wheel"
    assert j["bad"] == [] and j["version"]
    from runbook.bench import workloads

    assert j["prompts"] == [r.prompt for r in workloads.build("code", 3).requests]   # byte-identical to the checkout's
    assert j["longctx"] == 2048 * 4


def test_wheel_renders_a_unit_from_its_own_template(wheel_venv):
    env_dir, tmp = wheel_venv
    cp = _run(env_dir, tmp, env_dir / "bin" / "runbook", "service", "render", "--deployment", DEFAULT_SPEC)
    assert cp.returncode == 0, cp.stderr
    assert "[Service]" in cp.stdout and "sglang.launch_server" in cp.stdout


def test_wheel_declares_its_runtime_dependencies(wheel_venv):
    _env_dir, tmp = wheel_venv
    (whl,) = (tmp / "dist").glob("runbook-*.whl")
    with zipfile.ZipFile(whl) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(meta).decode().splitlines()
        names = z.namelist()
    requires = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    runtime = {r.split(">")[0].split("=")[0].split(";")[0].strip().lower() for r in requires if "extra ==" not in r}
    # what lib/runbook imports at run time: the runner, the notebooks' kernel, stage code, archive upload
    assert {"papermill", "nbconvert", "ipykernel", "pandas", "matplotlib", "pydantic", "pyyaml", "jinja2", "aiohttp",
            "numpy", "tokenizers", "fsspec", "s3fs", "huggingface-hub"} <= runtime, runtime
    assert "gguf" in runtime                           # 60_tune's llama-server engine reads GGUF headers with it
    assert not [r for r in requires if "extra ==" in r], requires   # no extra: the demo needs only cmake and a compiler
    assert {"runbook/_data/notebooks/00_environment.ipynb", "runbook/_data/deployments/qwen3.5-397b-a17b-nvfp4.yaml",
            "runbook/_data/models/qwen3.5-397b-a17b-nvfp4/config.json"} <= set(names)


def _summary(out: Path) -> dict:
    (summary,) = [p for p in out.glob("*/summary.json") if not p.parent.is_symlink()]   # not latest/
    return json.loads(summary.read_text())


@pytest.mark.notebook
def test_wheel_runs_notebooks_on_a_spec_outside_the_checkout(wheel_venv, tmp_path):
    """`runbook run` from an installed wheel: packaged notebooks, a spec anywhere, the archive where --out says."""
    env_dir, _ = wheel_venv
    spec_dir = tmp_path / "deployments"
    spec_dir.mkdir()
    spec = spec_dir / DEFAULT_SPEC.name
    shutil.copy(DEFAULT_SPEC, spec)
    shutil.copytree(REPO / "models", tmp_path / "models")       # the spec's model.card is ../models/<name>
    work, out = tmp_path / "work", tmp_path / "outputs"
    work.mkdir()
    before_repo, before_site = _tree(REPO), _tree(_site(env_dir), tools=True)
    cp = _run(env_dir, work, env_dir / "bin" / "runbook", "run", "--only", "environment,kv_memory",
              "--deployment", spec, "--out", out, "--timeout", "600")
    assert cp.returncode in (0, 1), cp.stderr[-3000:]        # 1: a check failed, which is a result
    s = _summary(out)
    assert [n["name"] for n in s["notebooks"]] == ["00_environment", "20_kv_memory"]
    assert all(n["status"] == "ok" and n["html"] for n in s["notebooks"]), s["notebooks"]
    assert s["deployment_file"] == str(spec.resolve()) and s["git_commit"] is None
    assert list(work.iterdir()) == []                        # --out given: nothing in the current directory
    assert _changed(before_repo, _tree(REPO)) == [], "the run wrote inside the checkout"
    assert _changed(before_site, _tree(_site(env_dir), tools=True)) == [], "the run wrote inside site-packages"


@pytest.mark.notebook
def test_wheel_run_defaults_to_the_packaged_deployment_and_outputs_here(wheel_venv, tmp_path):
    env_dir, _ = wheel_venv
    env_site = _site(env_dir).resolve()
    cp = _run(env_dir, tmp_path, env_dir / "bin" / "runbook", "run", "--only", "kv_memory", "--timeout", "600")
    assert cp.returncode in (0, 1), cp.stderr[-3000:]
    s = _summary(tmp_path / "outputs")                       # no --out, no $RUNBOOK_OUTPUTS: ./outputs
    assert Path(s["deployment_file"]).is_relative_to(env_site / "runbook" / "_data" / "deployments"), s["deployment_file"]
    assert s["notebooks"][0]["status"] == "ok", s["notebooks"]


def test_wheel_caches_the_demo_outside_site_packages(wheel_venv, tmp_path):
    """The demo's llama-server and tiny model: $RUNBOOK_CACHE, else $XDG_CACHE_HOME/runbook; gguf only when it builds."""
    env_dir, _ = wheel_venv
    code = "import sys; from runbook.demo import llama; print(llama.CACHE); print('gguf' in sys.modules)"
    py = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RUNBOOK_CACHE")}
    cp = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=dict(env, XDG_CACHE_HOME=str(tmp_path / "xdg")))
    assert cp.returncode == 0 and cp.stdout.split() == [str(tmp_path / "xdg" / "runbook"), "False"], cp.stderr
    cp = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=dict(env, RUNBOOK_CACHE=str(tmp_path / "c")))
    assert cp.returncode == 0 and cp.stdout.split()[0] == str(tmp_path / "c"), cp.stderr


def _declared() -> set[str]:
    """Distribution names pyproject declares (normalised): all runtime, the demo's included."""
    import re

    tomllib = pytest.importorskip("tomllib")           # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda r: re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-")   # noqa: E731
    assert "optional-dependencies" not in project, "an extra: say here which imports it may serve"
    return {name(r) for r in project["dependencies"]}


def test_every_third_party_import_of_the_library_is_a_declared_dependency():
    """An import the wheel does not declare works in the checkout's venv (which holds the dev tools' dependencies
    too) and fails for a user who installs the wheel: pydantic-settings was such a case."""
    import ast
    import importlib.metadata as md

    runtime = _declared() | {"pydantic-core"}                       # pydantic's own core, pinned by pydantic itself
    dists = md.packages_distributions()
    serving_side = {"sglang_probe.py", "kvjob.py"}     # run by the serving interpreter, which has sglang and torch
    stdlib = set(sys.stdlib_module_names)
    missing = []
    for p in (REPO / "lib" / "runbook").rglob("*.py"):
        if "data" in p.relative_to(REPO / "lib" / "runbook").parts or p.name in serving_side:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for m in mods:
                top = m.split(".")[0]
                if top in stdlib or top == "runbook" or top == "__future__":
                    continue
                names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not names & runtime:
                    missing.append(f"{p.relative_to(REPO)}: {m} ({', '.join(sorted(names))})")
    assert not missing, "\n".join(sorted(set(missing)))
