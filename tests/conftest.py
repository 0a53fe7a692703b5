import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml"
SHARED = REPO.parent / "shared" / "reference"


def spec_data(**changes) -> dict:
    """The default spec as a dict, with dotted-path changes applied ("serving.flags": {...})."""
    import yaml

    data = yaml.safe_load(DEFAULT_SPEC.read_text())
    for path, value in changes.items():
        cur = data
        keys = path.split(".")
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    return data


def make_notebook(path: Path, params: str, *cells: str) -> Path:
    """A notebook with a `parameters` cell and code cells, kernel = the project's kernel."""
    p = new_code_cell(params)
    p.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[new_markdown_cell(f"# {path.stem}"), p] + [new_code_cell(c) for c in cells],
                      metadata={"kernelspec": {"name": "runbook", "display_name": "Python 3 (runbook)", "language": "python"}})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


RUNNER_PARAMS = 'deployment: str = ""\nresults_path: str = ""\n'


def record(findings_src: str = "[]", data_src: str = "{}") -> str:
    return ("from runbook import Finding\nfrom runbook.runner import notebook\n"
            f"notebook.finish(__import__('pathlib').Path(results_path).stem.split('.')[0], {findings_src}, results_path, data={data_src})")


def left_after_parent_killed(code: str, alive, wait_s: float) -> tuple[list[int], list[int]]:
    """`code` starts a server and prints its pid, in a child interpreter that is then SIGKILLed (a test run killed):
    `alive(pid)` before the kill, and once it is empty or `wait_s` passed. Whatever is left is SIGKILLed, so a
    failing test leaves nothing behind."""
    import signal
    import subprocess
    import time

    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        pid = int(parent.stdout.readline())
        before = alive(pid)
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + wait_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = alive(pid)
    for p in left:
        os.kill(p, signal.SIGKILL)
    return before, left


@pytest.fixture
def cli():
    """Run `python -m runbook ...` as cron would; returns CompletedProcess."""
    import subprocess

    def _run(*args, env=None, timeout=300):
        e = dict(os.environ, **(env or {}))
        return subprocess.run([sys.executable, "-m", "runbook", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=e, cwd=REPO)
    return _run


@pytest.fixture(scope="session")
def llama():
    """A real llama-server on CPU serving the tiny random model (built once, cached in .cache/)."""
    from runbook.demo import llama as demo

    exe = demo.llama_server_path()
    if not exe.is_file():
        if os.environ.get("CI"):
            exe = demo.build_llama_server()
        else:
            pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    srv = demo.start_llama_server(exe, demo.tiny_model(), parallel=8)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def sglang_server(tmp_path_factory):
    """The real SGLang server on CPU serving the tiny HF model (runbook.demo.sglang), shared by the session.
    `make test` builds its interpreter (.venv-serving), so it runs rather than skips: a missing engine fails
    with the one line that names the make target."""
    from runbook.demo import sglang as demo

    srv = demo.start(log_path=tmp_path_factory.mktemp("sglang") / "server.log")   # kept with pytest's tmp dirs
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def real_model():
    """The real trained model's folder (runbook.demo.realmodel: hf/, the GGUF, manifest.json), checked by SHA-256.
    `make test` builds it (`make real-model`); built here once when missing."""
    from runbook.demo import realmodel

    d = realmodel.build()
    realmodel.verify(d)
    return d


@pytest.fixture(scope="session")
def real_sglang(real_model, tmp_path_factory):
    """SGLang on CPU serving the real model with its BF16 KV cache (deployments/smollm2-sglang-cpu.yaml), shared by
    the session: the reference every accuracy comparison on real weights is made against."""
    from runbook.core import ports
    from runbook.demo import realmodel
    from runbook.demo import sglang as demo

    dep = demo.deployment(ports.free_port(), source=realmodel.spec_path())
    srv = demo.start(dep, log_path=tmp_path_factory.mktemp("sglang-real") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def real_sglang_fp8(real_model, tmp_path_factory):
    """The same real model with `--kv-cache-dtype fp8_e4m3` and no scaling factors (scale 1.0, as SGLang logs): the
    story's configuration, the candidate every real-weights accuracy comparison measures against `real_sglang`."""
    from runbook.core import ports
    from runbook.demo import realmodel
    from runbook.demo import sglang as demo

    dep = demo.deployment(ports.free_port(), source=realmodel.spec_path(), flags={"kv-cache-dtype": "fp8_e4m3"})
    srv = demo.start(dep, log_path=tmp_path_factory.mktemp("sglang-real-fp8") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def gateway_fleet(tmp_path_factory):
    """Two SGLang CPU replicas of the tiny model behind the real gateway (smg from `make gateway-env`), each started
    from its rendered unit's ExecStart (runbook.demo.topology), policy cache_aware; shared by the session."""
    from runbook.demo import topology

    fleet = topology.launch(tmp_path_factory.mktemp("fleet"))
    yield fleet
    fleet.stop()


# ---------------------------------------------------------------- markers: what `make test-fast` leaves out
# A reason marker (pyproject's `markers`) implies `slow`; a test that takes one of these fixtures, directly or
# through another fixture, gets the fixture's reason. tests/test_markers.py checks that every test whose source
# shows a reason (running the serving interpreter, `runbook run`, llama-server, chromium) carries it.
SLOW_REASONS = ("serving", "llama", "sglang", "browser", "notebook", "server")
SLOW_FIXTURES = {"llama": "llama", "sglang_server": "sglang", "gateway_fleet": "sglang", "real_sglang": "sglang",
                 "real_sglang_fp8": "sglang",
                 "nodes_server": "sglang",
                 "real_model": "serving",
                 "browser": "browser", "lab": "browser", "default_run": "notebook",
                 "s3": "server", "wheel_venv": "server"}


def slow_reasons(item) -> set[str]:
    """The reason markers an item carries or earns through its fixtures."""
    got = {m.name for m in item.iter_markers() if m.name in SLOW_REASONS}
    return got | {SLOW_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in SLOW_FIXTURES}


def repeats_on_second_transport(item) -> bool:
    """A scenario parametrised over both HTTP transports runs once in the fast set, on the default one."""
    from runbook.endpoint.client import DEFAULT_TRANSPORT

    params = getattr(getattr(item, "callspec", None), "params", {})
    return "transport" in params and params["transport"] != DEFAULT_TRANSPORT


def pytest_collection_modifyitems(config, items):
    for item in items:
        reasons = slow_reasons(item)
        for name in sorted(reasons):
            item.add_marker(name)
        if reasons or repeats_on_second_transport(item):
            item.add_marker("slow")
    if hasattr(config, "workerinput") and "groups_file" in config.workerinput:
        share_workers(items, Path(config.workerinput["groups_file"]))


# ---------------------------------------------------------------- pytest-xdist: which tests share a worker
# `make test` runs two xdist workers (`--dist loadgroup`). A module's tests run on one worker, so its module- and
# class-scoped servers start once; modules that take the same session-scoped server are one group, so that server
# starts once in the run, not once per worker. xdist's own xdist_group marks do not reach its scheduler under
# pytest 9 (it renames `item._nodeid`, which pytest 9 no longer reads), so each worker writes the groups it
# collected to a file and the controller's scheduler reads it.
SHARED_SERVERS = ("llama", "sglang_server", "real_sglang", "real_sglang_fp8", "gateway_fleet")


def worker_groups(items) -> dict[str, str]:
    """Each test's group: its module, merged with every module that shares a session server with it."""
    parent: dict[str, str] = {}

    def root(k: str) -> str:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    for item in items:
        mod = item.nodeid.split("::", 1)[0]
        for f in SHARED_SERVERS:
            if f in item.fixturenames:
                parent[root(mod)] = root(f)
    return {item.nodeid: root(item.nodeid.split("::", 1)[0]) for item in items}


def share_workers(items, groups_file: Path) -> None:
    """Order the groups by their slow tests, most first (the longest work starts first and no long group is left
    for last), and write each test's group for the scheduler. Every worker collects and writes the same."""
    groups = worker_groups(items)
    weight: dict[str, int] = {}
    for item in items:
        weight[groups[item.nodeid]] = weight.get(groups[item.nodeid], 0) + (100 if item.get_closest_marker("slow") else 1)
    first = {g: i for i, g in reversed(list(enumerate(groups[it.nodeid] for it in items)))}
    items.sort(key=lambda it: (-weight[groups[it.nodeid]], first[groups[it.nodeid]]))
    tmp = groups_file.with_name(f"{groups_file.name}.{os.getpid()}")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, groups_file)


GROUPS_FILE = pytest.StashKey[Path]()


def pytest_configure_node(node):
    """The controller: tells each worker where to write the groups."""
    if GROUPS_FILE not in node.config.stash:
        node.config.stash[GROUPS_FILE] = Path(tempfile.mkdtemp(prefix="xdist-groups-")) / "groups.json"
    node.workerinput["groups_file"] = str(node.config.stash[GROUPS_FILE])


def pytest_unconfigure(config):
    if GROUPS_FILE in config.stash:
        shutil.rmtree(config.stash[GROUPS_FILE].parent, ignore_errors=True)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        """xdist's scope scheduling over the workers' groups, in the workers' order."""
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:   # read once: every worker has finished collecting before the first split
                self.groups = json.loads(config.stash[GROUPS_FILE].read_text())
            return self.groups.get(nodeid, nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False
    return ByGroup(config, log)

