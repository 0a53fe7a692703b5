"""The runner under faults and careless input (issue 13): folder isolation between deployments,
private in-progress folders, no notebook process outliving a killed runner, bounded options, and
the service notebook's `args` list through --param. Real papermill, real kernels, temp archives."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import DEFAULT_SPEC, REPO, RUNNER_PARAMS, make_notebook, record, spec_data
from pydantic import ValidationError

from runbook.core.errors import InputError, SpecError
from runbook.core.options import validate
from runbook.runner import archive, params
from runbook.runner.run import DeploymentLock, RunOptions, RunSettings

pytestmark = pytest.mark.notebook


def spec_named(tmp: Path, name: str) -> Path:
    """The default spec under another deployment name."""
    text = DEFAULT_SPEC.read_text()
    text, n = re.subn(r"^name: .*$", f"name: {name}", text, count=1, flags=re.M)
    assert n == 1
    p = tmp / f"{name}.yaml"
    p.write_text(text)
    return p


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "runbook", "run", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


@pytest.fixture
def quick(tmp_path):
    d = tmp_path / "nbs"
    make_notebook(d / "00_quick.ipynb", RUNNER_PARAMS, record('[Finding("quick.ok", "pass", "fine")]'))
    return d


# 1. Deployments whose names are suffixes of each other share --out without touching each other.

def test_start_up_cleanup_and_retention_touch_only_exact_deployment(quick, tmp_path):
    out = tmp_path / "out"
    other_live = out / ".inprogress-20200101T000000Z-x-rtq"          # x-rtq running now
    other_live.mkdir(parents=True)
    (other_live / "partial.ipynb").write_text("{}")
    other_numbered = out / ".inprogress-20200101T000000Z-2-x-rtq"
    other_numbered.mkdir()
    ambiguous = out / ".inprogress-20200101T000000Z-2-rtq"           # a run of deployment "2-rtq" (marker says so)
    ambiguous.mkdir()
    (ambiguous / ".runbook-deployment").write_text("2-rtq\n")
    mine = out / ".inprogress-20200101T000000Z-3-rtq"                 # rtq's own stale run
    mine.mkdir()
    finished_other = out / "20200101T000000Z-x-rtq"
    finished_other.mkdir()
    (finished_other / "summary.json").write_text(json.dumps({"deployment": "x-rtq", "started": "2020-01-01T00:00:00+00:00"}))
    spec = spec_named(tmp_path, "rtq")
    with DeploymentLock(out, "x-rtq"):                                # x-rtq's lock does not block rtq
        for _ in range(2):
            cp = _run("--deployment", spec, "--out", out, "--notebooks", quick, "--keep", "1")
            assert cp.returncode == 0, cp.stderr
    assert other_live.is_dir() and (other_live / "partial.ipynb").exists()
    assert other_numbered.is_dir() and ambiguous.is_dir() and finished_other.is_dir()
    assert not mine.exists()
    runs = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".") and not p.is_symlink())
    assert len([r for r in runs if r.endswith("Z-rtq") or re.search(r"Z-\d+-rtq$", r)]) == 1 and finished_other.name in runs


def test_run_id_pattern_is_exact():
    pat = archive.run_id_pattern("rtq")
    assert pat.fullmatch("20200101T000000Z-rtq") and pat.fullmatch("20200101T000000Z-12-rtq")
    assert not pat.fullmatch("20200101T000000Z-x-rtq") and not pat.fullmatch("20200101T000000Z-rtq-x")
    assert not archive.run_id_pattern("a.b").fullmatch("20200101T000000Z-aXb")


# 2. In-progress folders are private; the finished run gets the ordinary mode.

def test_inprogress_folder_is_0700_and_final_folder_ordinary(tmp_path):
    d = tmp_path / "nbs"
    make_notebook(d / "00_mode.ipynb", RUNNER_PARAMS,
                  "import os, pathlib\nhere = pathlib.Path(results_path).parent\n"
                  "mode = os.stat(here).st_mode & 0o777\nname = here.name",
                  record("[]", '{"mode": mode, "name": name}'))
    out = tmp_path / "out"
    cp = _run("--out", out, "--notebooks", d)
    assert cp.returncode == 0, cp.stderr
    data = json.loads((out / "latest" / "00_mode.results.json").read_text())["data"]
    assert data["name"].startswith(".inprogress-") and data["mode"] == 0o700
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "latest").resolve().stat().st_mode & 0o777 == 0o777 & ~umask
    assert not list((out / "latest").resolve().glob(".runbook-deployment"))


# 3. Killing the runner ends the notebook's papermill and kernel.

def _start_sleeper(tmp_path):
    d = tmp_path / "nbs"
    pidfile = tmp_path / "kernel.pid"
    make_notebook(d / "00_sleep.ipynb", RUNNER_PARAMS,
                  f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "runbook", "run", "--out", str(out), "--notebooks", str(d)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the notebook never started"
        time.sleep(0.2)
    procs = psutil.Process(proc.pid).children(recursive=True)
    kernel = psutil.Process(int(pidfile.read_text()))
    assert kernel.pid in {p.pid for p in procs} or kernel.is_running()
    return proc, procs + [kernel], out


def _survivors(procs, tmp_path, wait=20.0):
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for p in psutil.process_iter(["cmdline"]):   # anything else still naming this test's folder
            try:
                if str(tmp_path) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.3)


def _reap(procs):
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_killed_runner_leaves_no_notebook_process(tmp_path, sig):
    proc, procs, out = _start_sleeper(tmp_path)
    try:
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        left = _survivors(procs, tmp_path)
        assert not left, [(p.pid, p.cmdline()) for p in left]
        assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), proc.stderr.read() if proc.stderr else ""
        stale = list(out.glob(".inprogress-*"))
        assert all(d.stat().st_mode & 0o777 == 0o700 for d in stale)
        assert not (out / "latest").exists()
    finally:
        _reap(procs)
        proc.kill()
        proc.communicate()


# 4. Option values that would do something surprising are refused before anything is written.

@pytest.mark.parametrize("args, option", [
    (["--run-timeout", "0"], "--run-timeout"), (["--run-timeout", "-1"], "--run-timeout"),
    (["--timeout", "0"], "--timeout"), (["--timeout", "-5"], "--timeout"),
    (["--keep", "0"], "--keep"), (["--keep", "-1"], "--keep"),
    (["--only", ""], "--only"), (["--only", " , ,"], "--only"),
])
def test_bad_run_options_are_one_line_exit_2(quick, tmp_path, args, option):
    out = tmp_path / "out"
    cp = _run("--out", out, "--notebooks", quick, *args, timeout=120)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"runbook( run)?: error: ", lines[0]) and option in lines[0], cp.stderr
    assert "Traceback" not in cp.stderr and not out.exists()


@pytest.mark.parametrize("change, option", [
    ({"timeout": 0}, "--timeout"), ({"timeout": -5.0}, "--timeout"), ({"timeout": float("nan")}, "--timeout"),
    ({"run_timeout": 0}, "--run-timeout"), ({"run_timeout": float("inf")}, "--run-timeout"),
    ({"keep": 0}, "--keep"), ({"keep": -1}, "--keep"), ({"keep": 1.5}, "--keep"),
    ({"only": [""]}, "--only"), ({"only": [",", " "]}, "--only"),
    ({"archive_url": "s3://key:SECRETvalue@bucket/x"}, "--archive-url"),
])
def test_run_options_are_checked_by_their_model(change, option):
    """A caller of run() cannot pass what the flag refuses: the bounds are RunOptions' own, and a bad value is
    one line naming the flag (never the credentials of an archive URL)."""
    with pytest.raises(ValidationError):
        RunOptions(**change)
    with pytest.raises(InputError, match=re.escape(option)) as e:
        validate(RunOptions, change, cli=True)
    assert "\n" not in str(e.value) and "SECRET" not in str(e.value)


def test_good_options_pass_validation():
    opts = RunOptions(only=["quick, first", "x"], timeout=0.5, run_timeout=1, keep=1)
    assert opts.only == ["quick", "first", "x"] and (opts.timeout, opts.run_timeout, opts.keep) == (0.5, 1.0, 1)
    # None is unset in the options; the defaults are the settings' own, where `run` resolves them
    assert RunOptions().model_dump(include={"timeout", "run_timeout", "keep", "only"}) == \
        {"timeout": None, "run_timeout": None, "keep": None, "only": None}
    assert RunSettings.resolve(None, RunOptions()).model_dump(include={"timeout", "run_timeout", "keep", "only"}) == \
        {"timeout": 1800.0, "run_timeout": 7200.0, "keep": None, "only": []}


def test_the_run_flags_are_the_model_s():
    """`runbook run`'s parser is built from RunOptions: an absent flag is the model's default, a given one its value."""
    from runbook import cli

    def opts(*argv: str) -> RunOptions:
        a = cli.build_parser().parse_args(["run", *argv])
        return validate(RunOptions, {name: getattr(a, name) for name in RunOptions.model_fields}, cli=True)

    assert opts() == RunOptions()
    assert opts("--only", "environment,kv_memory", "--only", "tune", "--param", "tp=4", "--timeout", "60", "--keep", "3",
                "--strict", "--notebooks", "/nb", "--archive-url", "s3://b/p") == \
        RunOptions(only=["environment", "kv_memory", "tune"], params=["tp=4"], timeout=60, keep=3, strict=True,
                   notebooks_dir=Path("/nb"), archive_url="s3://b/p")


# 5. The service notebook's documented `args: list[str]` parameter through --param.

def test_service_args_parameter_is_declared_and_typed():
    decl = params.notebook_params(REPO / "notebooks" / "30_service.ipynb")
    assert decl["args"]["inferred_type_name"] == "list[str] | None" and decl["args"]["default"] == "None"
    typ = decl["args"]["inferred_type_name"]
    assert params.coerce("args", "kv-cache-dtype=bf16", typ, "30_service.ipynb") == ["kv-cache-dtype=bf16"]
    assert params.coerce("args", '["a=1","b=2"]', typ, "30_service.ipynb") == ["a=1", "b=2"]
    assert params.parse_pairs(["args=kv-cache-dtype=bf16"]) == {"args": "kv-cache-dtype=bf16"}


def test_service_notebook_takes_args_through_param(tmp_path):
    out = tmp_path / "out"
    cp = _run("--only", "service", "--param", "args=kv-cache-dtype=bf16", "--out", out)
    assert cp.returncode in (0, 1), cp.stderr
    doc = json.loads((out / "latest" / "30_service.results.json").read_text())
    argv = doc["data"]["units"][0]["argv"]
    i = argv.index("--kv-cache-dtype")
    assert argv[i + 1] == "bf16"


# 6. None means unset: a `T | None` parameter through --param, and a spec's true turned off for one run.

def test_optional_parameters_are_typed_and_none_is_unset():
    kv = params.notebook_params(REPO / "notebooks" / "20_kv_memory.ipynb")
    assert (kv["tp"]["inferred_type_name"], kv["tp"]["default"]) == ("int | None", "None")
    assert params.coerce("tp", "4", "int | None", "20_kv_memory.ipynb") == 4
    assert params.coerce("contexts", "8192,32768", "list[int] | None", "20_kv_memory.ipynb") == [8192, 32768]
    assert params.coerce("require_gpus", "false", "bool | None", "00_environment.ipynb") is False
    for raw in ("none", "None", "null", " NULL "):
        assert params.coerce("tp", raw, "int | None", "20_kv_memory.ipynb") is None
        assert params.coerce("since", raw, "str | None", "35_verify.ipynb") is None
    assert params.coerce("name", "none", "str", "x.ipynb") == "none"       # not optional: the text as written
    with pytest.raises(SpecError, match=re.escape("declares tp: int | None")):
        params.coerce("tp", "four", "int | None", "20_kv_memory.ipynb")


@pytest.mark.parametrize("value, status", [("false", "skip"), ("none", "fail")])
def test_a_spec_s_true_is_turned_off_through_param(tmp_path, value, status):
    """hardware.require_gpus: true in the spec; `--param require_gpus=false` checks it for one run as if it were
    false (no driver here: skip, not fail), `=none` leaves the spec's true."""
    import yaml

    dep = tmp_path / "strict.yaml"
    dep.write_text(yaml.safe_dump(spec_data(**{"hardware.require_gpus": True})))
    out = tmp_path / "out"
    cp = _run("--deployment", dep, "--only", "environment", "--param", f"require_gpus={value}", "--out", out)
    assert cp.returncode in (0, 1), cp.stderr
    nb = (out / "latest" / "00_environment.ipynb").read_text()
    assert ("require_gpus = False" if value == "false" else "require_gpus = None") in nb
    found = {f["id"]: f["status"] for f in json.loads((out / "latest" / "00_environment.results.json").read_text())["findings"]}
    if "env.gpu.driver" not in found:
        pytest.skip("this machine has an NVIDIA driver: no driver finding to turn into a skip")
    assert found["env.gpu.driver"] == status


# 6. One notebook's parameter: NOTEBOOK.NAME, when two notebooks declare one name with two meanings.

def _notebooks(*stems: str) -> list[Path]:
    return [REPO / "notebooks" / f"{s}.ipynb" for s in stems]


def test_a_plain_name_reaches_the_notebooks_that_declare_it_and_a_scoped_one_its_notebook_alone():
    """`concurrency` is the benchmark's levels only (accuracy's batch is `batch_size`): a plain --param reaches 40 and
    leaves 50 alone; `bench.concurrency` (or `benchmark.` / `40_benchmark.`) reaches 40 alone too, and a scoped name
    wins over a plain one for its notebook, whatever the order given."""
    nbs = _notebooks("40_benchmark", "50_accuracy")
    assert params.resolve(["concurrency=1,2,4"], nbs) == {nbs[0]: {"concurrency": [1, 2, 4]}, nbs[1]: {}}
    for scope in ("bench", "benchmark", "40_benchmark"):
        got = params.resolve([f"{scope}.concurrency=1,2,4", "accuracy.batch_size=4"], nbs)
        assert got == {nbs[0]: {"concurrency": [1, 2, 4]}, nbs[1]: {"batch_size": 4}}
    got = params.resolve(["40_benchmark.concurrency=2", "concurrency=8"], nbs)
    assert got == {nbs[0]: {"concurrency": [2]}, nbs[1]: {}}
    with pytest.raises(SpecError, match="no notebook 50_accuracy has a parameter 'concurrency'"):
        params.resolve(["accuracy.concurrency=4"], nbs)


@pytest.mark.parametrize("pair, message", [
    ("tune.concurrency=4", r"'tune' is not a selected notebook \(one of: 40_benchmark, 50_accuracy"),
    ("nosuch.concurrency=4", "'nosuch' is not a selected notebook"),
    ("accuracy.budget_s=4", "no notebook 50_accuracy has a parameter 'budget_s'"),
    ("a.b.c=1", "is not a parameter name"),
    ("bench.results_path=/x", "set by the runner"),
    ("bench.api_key=x", "refusing to pass a secret"),
])
def test_a_scoped_param_names_its_fault(pair, message):
    with pytest.raises(SpecError, match=message):
        params.resolve([pair], _notebooks("40_benchmark", "50_accuracy"))
