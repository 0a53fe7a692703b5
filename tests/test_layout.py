"""The layout's rules, checked from the source: stages import each other only through their package
roots, every stage has the same shape, and the notebooks' "What to do" names findings that exist."""
import ast
import fnmatch
import json
import re
from pathlib import Path

import pytest
from conftest import REPO

from runbook.core import registry

LIB = REPO / "lib" / "runbook"

STAGES = tuple(s.package for s in registry.stages())      # the registry says which packages are stages
SHARED = ("core", "model", "endpoint", "corpus")
# The layers above the stages, and the other layers each may use besides the shared ones. None of them
# imports a stage: they reach stages only through the registry.
# demo runs the whole runbook through the CLI, and starts SGLang with the command line of the unit service renders.
UPPER = {"alerts": (), "runner": ("alerts",), "fleet": ("runner",), "demo": ("cli", "service")}


def _sources(pkg: str) -> list[Path]:
    return sorted(p for p in (LIB / pkg).rglob("*.py") if "data" not in p.relative_to(LIB).parts)


def _imports(path: Path, text: str) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) for every runbook import in a file, relative ones resolved."""
    tree = ast.parse(text, str(path))
    pkg = ".".join(("runbook",) + path.relative_to(LIB).parent.parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("runbook")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            if mod.startswith("runbook"):
                out.append((mod, [a.name for a in node.names], node.lineno))
    return out


def _all(stage: str) -> list[str]:
    tree = ast.parse((LIB / stage / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def _violations(path: Path, layer: str, text: str) -> list[str]:
    allowed = UPPER.get(layer, ())
    bad = []
    for mod, names, line in _imports(path, text):
        parts = mod.split(".")
        if len(parts) < 2:
            # `from runbook import quant`: a stage through its package root; shared layers import no stage
            bad += [f"{path.relative_to(REPO)}:{line}: shared layer {layer} imports stage {n}"
                    for n in names if n in STAGES and layer not in STAGES]
            continue
        target = parts[1]
        if target == layer or target in SHARED or target in allowed:
            continue
        if target in STAGES and layer in STAGES and len(parts) == 2 and set(names) <= set(_all(target)):
            continue
        bad.append(f"{path.relative_to(REPO)}:{line}: {layer} imports {mod} {names}")
    return bad


def test_no_stage_imports_another_stages_internals():
    bad = [v for layer in STAGES + SHARED + tuple(UPPER) for p in _sources(layer) for v in _violations(p, layer, p.read_text())]
    assert not bad, "\n".join(bad)


def test_every_package_is_a_stage_a_shared_layer_or_an_upper_layer():
    pkgs = {p.parent.name for p in LIB.glob("*/__init__.py")} - {"_data"}
    known = set(STAGES) | set(SHARED) | set(UPPER)
    assert pkgs == known, pkgs ^ known


def test_fleet_and_demo_are_layers_nothing_below_imports():
    """fleet (the index over every host's runs) and demo (llama.cpp tooling) sit on top: only the CLI
    reaches fleet, and nothing in the library imports demo (it runs as `python -m runbook.demo`)."""
    bad = []
    for p in LIB.rglob("*.py"):
        rel = p.relative_to(LIB)
        if "data" in rel.parts:
            continue
        for mod, names, line in _imports(p, p.read_text()):
            targets = {mod.split(".")[1]} if mod.count(".") else set(names)
            for t in targets & {"fleet", "demo"}:
                if rel.parts[0] not in (t, "cli.py"):
                    bad.append(f"{rel}:{line}: imports {t}")
    assert not bad, bad


@pytest.mark.parametrize("layer, text, expect", [
    ("kv", "from runbook.quant.sglang_rules import sglang_view\n", "kv imports runbook.quant.sglang_rules"),
    ("kv", "from runbook.quant import sglang_rules\n", "kv imports runbook.quant"),       # a submodule, not the root's API
    ("core", "from runbook import kv\n", "shared layer core imports stage kv"),
    ("model", "from runbook.service.render import build\n", "model imports runbook.service.render"),
    ("service", "from ..bench.sweep import Level\n", "service imports runbook.bench.sweep"),
    ("runner", "from runbook import kv\n", "shared layer runner imports stage kv"),
    ("fleet", "from runbook.bench.run import assess\n", "fleet imports runbook.bench.run"),
    ("demo", "from runbook.runner.run import run\n", "demo imports runbook.runner.run"),
])
def test_import_rule_catches_a_violation(layer, text, expect):
    assert any(expect in v for v in _violations(LIB / layer / "planted.py", layer, text))


def test_import_rule_allows_package_roots():
    assert _violations(LIB / "service" / "x.py", "service",
                       "from runbook import kv, quant\nfrom runbook.core.spec import Deployment\n") == []


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_the_same_shape(stage):
    import importlib

    mod = importlib.import_module(f"runbook.{stage}")
    assert mod.__doc__ and mod.__doc__.startswith("Stage "), stage
    assert "evaluate" in mod.__all__ and callable(mod.evaluate)
    assert "assess" in mod.__all__ and callable(mod.assess), f"{stage}: the stage's body is `assess` (docs/contributing.md)"
    assert (LIB / stage / "report.py").is_file(), f"{stage}: tables and plots live in report.py"
    for name in mod.__all__:
        assert hasattr(mod, name), f"runbook.{stage}.__all__ names {name}, which it lacks"


def _finding_id_patterns() -> list[tuple[re.Pattern, str]]:
    """Every id a Finding(...) in the library can take: (regex, an example with x for each field)."""
    pats = []
    for path in LIB.rglob("*.py"):
        if "data" in path.relative_to(LIB).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Finding"):
                continue
            a = node.args[0]
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                pats.append((re.compile(re.escape(a.value)), a.value))
            elif isinstance(a, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else None for v in a.values]
                pats.append((re.compile("".join(re.escape(p) if p is not None else ".+" for p in parts)),
                             "".join(p if p is not None else "x" for p in parts)))
    return pats


def _what_to_do_ids(nb: Path) -> list[str]:
    cells = json.loads(nb.read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("## What to do"))
    return re.findall(r"\*\*`([a-z_][a-z0-9_.*-]*)`", text)


@pytest.mark.parametrize("nb", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_what_to_do_names_findings_the_library_emits(nb):
    pats = _finding_id_patterns()
    ids = _what_to_do_ids(nb)
    assert ids, f"{nb.name}: no finding ids in What to do"
    # `quant.ckpt.*` is met by ckpt.dtypes; `accuracy.kvquant.fp8_e4m3.scale1.*` by f"accuracy.kvquant.{fmt}.{scaling}.{source}"
    missing = [i for i in ids if not any(p.fullmatch(i.replace("*", "x")) or fnmatch.fnmatchcase(ex, i) for p, ex in pats)]
    assert not missing, f"{nb.name} names findings the library never emits: {missing}"


def test_finding_id_check_can_fail():
    pats = _finding_id_patterns()
    assert not any(p.fullmatch("kv.no_such_finding") for p, _ in pats)
    assert any(p.fullmatch("service.flag.x") for p, _ in pats)


@pytest.mark.parametrize("nb", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_leads_with_the_verdict_and_says_when_cost_side_effects(nb):
    cells = json.loads(nb.read_text())["cells"]
    head = "".join(cells[0]["source"])
    for word in ("**When.**", "**Cost.**", "**Side effects.**"):
        assert word in head, f"{nb.name}: first cell lacks {word}"
    code = [c for c in cells if c["cell_type"] == "code"]
    first = "".join(code[1]["source"])   # the cell after parameters
    # one call validates the parameters, runs the stage, shows and records its findings (or its input finding)
    assert f'notebook.evaluate("{nb.stem.split("_", 1)[1]}", spec, results_path' in first, \
        f"{nb.name}: the verdict is not the first result"
    casts = re.findall(r"\b(?:int|float|str|bool)\(", "".join("".join(c["source"]) for c in code[1:]))
    assert not casts, f"{nb.name}: a cell casts a parameter"


def test_notebook_options_drop_only_none():
    from runbook.core.errors import InputError
    from runbook.runner import notebook

    assert notebook.options("kv_memory", tp=None, kv_dtype=None, contexts=None, mem_fraction_static=None,
                            model_dir=None).model_dump(exclude_none=True) == {}
    o = notebook.options("kv_memory", tp=8, kv_dtype="bf16", contexts=[8192], mem_fraction_static=0.88)
    assert (o.tp, o.kv_dtype, o.contexts, o.mem_fraction_static) == (8, "bf16", [8192], 0.88)
    o = notebook.options("benchmark", chat=True, interactive=True, artifact_dir="/x")
    # the runner's parameters are the options' own names, not renamed on the way in (their flags: --progress, --out)
    assert o.model_dump(include={"chat", "interactive", "artifact_dir"}) == {"chat": True, "interactive": True,
                                                                               "artifact_dir": Path("/x")}
    # 0, False, "" and [] are values: a 0 is checked as one, a False kept (it turns a spec's true off)
    with pytest.raises(InputError, match="tp must be at least 1"):
        notebook.options("kv_memory", tp=0)
    assert notebook.options("environment", require_gpus=False).require_gpus is False
    assert notebook.options("benchmark", archive_root="").archive_root == ""     # '' is bench's "no regression check"


@pytest.mark.parametrize("nb", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_imports_resolve(nb):
    import importlib

    for c in json.loads(nb.read_text())["cells"]:
        if c["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(c["source"]))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runbook"):
                mod = importlib.import_module(node.module)
                for a in node.names:
                    assert hasattr(mod, a.name) or importlib.util.find_spec(f"{node.module}.{a.name}"), \
                        f"{nb.name}: from {node.module} import {a.name}"


def test_corpus_is_intact_and_frozen():
    from runbook import corpus

    assert corpus.verify() == []
    assert corpus.manifest()["version"] == corpus.VERSION
    # frozen: not the library's current sources
    assert "def test_corpus_is_intact_and_frozen" not in corpus.code_text()
    assert len(corpus.code_prompts()) >= 8


@pytest.mark.serving
def test_one_sglang_version_constant():
    import subprocess

    from runbook.core import SGLANG_VERSION

    out = subprocess.run(["make", "-s", "-C", str(REPO), "--eval", "print-v: ; @echo $(SGLANG_VERSION)", "print-v"],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    assert out == SGLANG_VERSION
    serving = __import__("os").environ.get("RUNBOOK_SERVING_PYTHON")
    if serving:
        v = subprocess.run([serving, "-c", "from importlib.metadata import version; print(version('sglang'))"],
                           capture_output=True, text=True, timeout=60).stdout.strip()
        assert v == SGLANG_VERSION


@pytest.mark.parametrize("stage", STAGES)
def test_every_export_is_the_object_not_a_submodule(stage):
    """A stage package binds its names by plain imports; a function named like its module (service's `check`) is
    the function, not the module the import system also sets as the package attribute of that name."""
    import importlib
    import pkgutil
    import types

    pkg = importlib.import_module(f"runbook.{stage}")
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"runbook.{stage}.{m.name}")
    bad = [n for n in pkg.__all__ if isinstance(getattr(pkg, n), types.ModuleType)]
    assert not bad, f"runbook.{stage}: {bad} resolve to modules"


def test_the_cli_does_not_import_the_heavy_stacks():
    """The registry imports every stage package, and each binds its names by plain imports; `runbook VERB --help`
    stays light (no pandas, matplotlib, ml_dtypes, aiohttp, numpy, safetensors, tokenizers or jsonschema: those imports
    sit inside the functions that need them; 0.39 s here, where importing every stage's stacks took 1.35 s)."""
    import subprocess
    import sys

    code = ("import sys; from runbook import cli; cli.build_parser(); "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'ml_dtypes', 'jupyter_client', 'aiohttp', 'numpy', "
            "'safetensors', 'tokenizers', 'jsonschema') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# A function longer than this hides its steps: split it where a split names a real step.
MAX_FUNCTION_LINES = 80


def _long_functions(text: str, where: str) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (n.end_lineno or n.lineno) - n.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{where}:{n.lineno} {n.name} is {lines} lines")
    return out


def test_no_function_is_longer_than_80_lines():
    long = []
    for p in sorted(LIB.rglob("*.py")):
        rel = p.relative_to(LIB).as_posix()
        if rel.startswith("corpus/data/"):
            continue
        long += _long_functions(p.read_text(), rel)
    assert long == []


@pytest.mark.parametrize("lines, caught", [(80, False), (81, True)])
@pytest.mark.parametrize("method", [False, True], ids=["function", "async method"])
def test_function_length_rule_can_fail(lines, caught, method):
    import textwrap

    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 1))   # the def line plus lines - 1 statements
    src = f"def f():\n{body}"
    if method:
        src = "class C:\n" + textwrap.indent(src.replace("def f():", "async def m(self):"), "    ")
    assert len(src.splitlines()) == lines + method
    assert bool(_long_functions(src, "planted.py")) == caught


# ---- the registry rule: a notebook's file name is written in one place, Stage.notebook ----------

_STEM = re.compile(r"\b\d\d_[a-z][a-z_]*\b")


def _literal_violations(path: Path, text: str, own: str) -> list[str]:
    """String constants naming a registered notebook, outside the package of the stage it belongs to."""
    stems = {s.notebook: s.package for s in registry.stages()}
    tree = ast.parse(text)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for m in _STEM.findall(node.value):
                if m in stems and stems[m] != own:
                    bad.append(f"{path}:{node.lineno}: {m!r}")
    return bad


def test_no_notebook_file_name_outside_its_own_stage():
    bad = []
    for p in LIB.rglob("*.py"):
        rel = p.relative_to(LIB)
        if "data" in rel.parts:
            continue
        bad += _literal_violations(rel, p.read_text(), rel.parts[0] if len(rel.parts) > 1 else "")
    assert not bad, "\n".join(bad)


def test_the_literal_rule_can_fail():
    assert _literal_violations(Path("runner/figures.py"), 'x = "40_benchmark"\n', "runner")
    assert _literal_violations(Path("fleet/index.py"), 'f"{d}/20_kv_memory.results.json"\n', "fleet")
    assert not _literal_violations(Path("bench/x.py"), 'x = "40_benchmark"\n', "bench")
    assert not _literal_violations(Path("verify/x.py"), '"""Compares with what 20_kv_memory predicted."""\n', "verify")


# The OS layer (core/oscalls.py) is the only module that runs systemd's tools or sets signal handlers: one failure
# model for the commands, one place where signals are saved and put back.
OS_LAYER = LIB / "core" / "oscalls.py"
SYSTEMD_TOOLS = {"systemctl", "journalctl", "systemd-run"}
_SUBPROCESS_MODULES = {"subprocess", "asyncio.subprocess"}
_PROCESS_CALLS = {"create_subprocess_exec", "create_subprocess_shell", "system", "popen"}


def _os_violations(path: Path, text: str) -> list[str]:
    """What a module outside the OS layer does that is the layer's: signal handlers set, or systemd's tools run
    (a module that can start processes and names one of the tools as a whole string)."""
    tree = ast.parse(text, str(path))
    runs_processes, bad, tools = False, [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            runs_processes |= any(a.name in _SUBPROCESS_MODULES for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            runs_processes |= node.module in _SUBPROCESS_MODULES
            bad += [f"{path.name}:{node.lineno}: imports signal.{a.name}" for a in node.names
                    if node.module == "signal" and a.name in ("signal", "set_wakeup_fd")]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            owner = f.value.id if isinstance(f.value, ast.Name) else ""
            if (owner, f.attr) in (("signal", "signal"), ("signal", "set_wakeup_fd")) or f.attr == "add_signal_handler":
                bad.append(f"{path.name}:{node.lineno}: sets a signal handler ({owner or '…'}.{f.attr})")
            if f.attr in _PROCESS_CALLS and owner in ("os", "asyncio"):
                runs_processes = True
        elif isinstance(node, ast.Constant) and node.value in SYSTEMD_TOOLS:
            tools.append(f"{path.name}:{node.lineno}: runs {node.value}")
    return bad + (tools if runs_processes else [])


def test_only_the_os_layer_runs_systemd_tools_or_sets_signal_handlers():
    bad = [f"{p.relative_to(REPO)}: {v}" for p in sorted(LIB.rglob("*.py")) if p != OS_LAYER and "data" not in p.parts
           for v in _os_violations(p, p.read_text())]
    assert not bad, "use runbook.core.oscalls instead:\n" + "\n".join(bad)


@pytest.mark.parametrize("text", [
    "import subprocess\ndef f(u):\n    return subprocess.run(['systemctl', 'is-active', u])\n",
    "import subprocess\nCTL = ('systemctl',)\ndef f(u):\n    return subprocess.run([*CTL, 'stop', u])\n",
    "from subprocess import run\ndef f(u):\n    return run(['journalctl', '-u', u])\n",
    "import asyncio\nasync def f():\n    await asyncio.create_subprocess_exec('systemd-run', '--unit=x')\n",
    "import signal\nsignal.signal(signal.SIGTERM, lambda *a: None)\n",
    "from signal import signal as sig\n",
    "import asyncio, signal\nasyncio.get_event_loop().add_signal_handler(signal.SIGTERM, print)\n",
])
def test_os_rule_catches_a_violation(text):
    assert _os_violations(Path("x.py"), text)


def test_os_rule_allows_naming_the_tools_in_messages_and_running_other_programs():
    text = ("import subprocess\nREMEDY = 'see `systemctl status x`'\n"
            "def f():\n    return subprocess.run(['git', 'rev-parse', 'HEAD'])\n")
    assert _os_violations(Path("x.py"), text) == []
    assert _os_violations(Path("x.py"), "SYSTEMCTL = ('systemctl',)\n") == []    # a default handed to the layer


def _preexec_violations(path: Path, text: str) -> list[str]:
    """Calls that pass `preexec_fn`: Python run between fork and exec is unsafe once the process has threads. A child
    the kernel signals when this process dies is core/oscalls.py's `dying_with_parent` (or `SessionChild`)."""
    return [f"{path.name}:{n.lineno}: passes preexec_fn" for n in ast.walk(ast.parse(text, str(path)))
            if isinstance(n, ast.Call) and any(k.arg == "preexec_fn" for k in n.keywords)]


def test_nothing_in_lib_passes_preexec_fn():
    bad = [f"{p.relative_to(REPO)}: {v}" for p in sorted(LIB.rglob("*.py")) if "data" not in p.parts
           for v in _preexec_violations(p, p.read_text())]
    assert not bad, "use runbook.core.oscalls.dying_with_parent instead:\n" + "\n".join(bad)


def test_preexec_rule_names_a_planted_violation():
    text = ("import subprocess\nfrom runbook.core import oscalls\n\n"
            "def start(cmd):\n    # preexec_fn named in a comment or a 'preexec_fn' string is no call\n"
            "    return subprocess.Popen(cmd, start_new_session=True,\n"
            "                            preexec_fn=lambda: oscalls.prctl(1, 15))\n")
    assert _preexec_violations(Path("lib/runbook/demo/x.py"), text) == ["x.py:6: passes preexec_fn"]
    assert _preexec_violations(Path("x.py"), "import subprocess\nsubprocess.Popen(['true'])  # no 'preexec_fn'\n") == []
