"""The package as users get it: a built wheel, installed in a fresh venv, outside the checkout.

The frozen corpus and the templates are package data; an editable install would hide their absence."""
import json
import os
import subprocess
import sys
import sysconfig
import venv
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
    site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True, env=clean).strip())
    # The runbook's dependencies come from this venv (a path entry, so its editable runbook finder is not loaded);
    # the runbook itself only from the wheel. Written after the install, so pip never sees the editable runbook.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir, tmp


def _run(env_dir, tmp, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    return subprocess.run([*args], capture_output=True, text=True, timeout=300, cwd=tmp, env=env)


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
