"""The import graph of lib/runbook, read from the source with `ast`: no import cycles (inside packages too),
and an import inside a function only with its reason on the line (`# lazy: <reason>`), which is where it
keeps the CLI's start-up light (the registry imports every stage package for `runbook --help`); no private
name (`_x`) taken from another module.

Each rule carries an allow-list of what the packages still being reworked hold today. The lists are exact:
a new cycle or a new unexplained import fails, and so does one that went away, so the lists only shrink."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

LIB = REPO / "lib" / "runbook"

# Cycles known today, each as its edges (importer -> imported); it goes when its contract moves to a leaf module
# the others import. None is left.
KNOWN_CYCLES: list[set[str]] = []

# Imports inside functions without a `# lazy:` reason, per file (relative to lib/runbook): none is left.
UNEXPLAINED_LAZY: dict[str, int] = {
}

# Private names taken from another module, per file, today: none.
PRIVATE_REACH_INS: dict[str, list[str]] = {}

LAZY = re.compile(r"#\s*lazy:\s*\S")


def module_name(path: Path, lib: Path = LIB) -> str:
    parts = path.relative_to(lib.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(lib: Path = LIB) -> dict[str, tuple[Path, str]]:
    """Module name -> (file, text) for every module of the package (the corpus data is not code)."""
    return {module_name(p, lib): (p, p.read_text()) for p in sorted(lib.rglob("*.py"))
            if "data" not in p.relative_to(lib).parts}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING"


def imports(module: str, path: Path, text: str) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that runs, with whether it sits inside a function. `if TYPE_CHECKING:`
    blocks never run, so they are left out (their `else:` is kept)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for n in child.orelse:
                    visit(n, in_function)
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, in_function))
            visit(child, inner)

    visit(ast.parse(text, str(path)), False)
    return out


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules an import statement loads: `import a.b` -> a.b; `from a import b` -> a.b when b
    is a submodule, else a; relative imports resolved against the importing module's package."""
    if isinstance(node, ast.Import):
        names = {a.name for a in node.names}
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[: len(pkg) - node.level + 1]
            base = ".".join(pkg + ([base] if base else []))
        names = {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {n for n in names if n in known} - {module}


def graph(srcs: dict[str, tuple[Path, str]]) -> dict[str, set[str]]:
    """Importer -> the modules it imports, at module level or inside a function (both run sooner or later).
    Imports by name at run time (importlib: the registry's discovery of stage packages) are not read."""
    known = set(srcs)
    return {m: {t for node, _ in imports(m, p, text) for t in targets(node, m, p.name == "__init__.py", known)}
            for m, (p, text) in srcs.items()}


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """Each strongly connected component of more than one module, as its internal edges (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append({f"{a} -> {b}" for a in sorted(comp) for b in sorted(g[a] & comp)})

    for v in sorted(g):
        if v not in index:
            connect(v)
    return found


def _show(cs: list[set[str]]) -> str:
    return "\n".join("  " + "\n  ".join(sorted(c)) + "\n" for c in cs)


def cycle_problems(found: list[set[str]], known: list[set[str]]) -> str:
    new = [c for c in found if c not in known]
    gone = [c for c in known if c not in found]
    msg = ""
    if new:
        msg += f"import cycles not in KNOWN_CYCLES (move the shared contract to a leaf module):\n{_show(new)}"
    if gone:
        msg += f"KNOWN_CYCLES lists cycles that are gone or changed: update the list (found now:\n{_show(found)})\n{_show(gone)}"
    return msg


def lazy_imports(srcs: dict[str, tuple[Path, str]], lib: Path = LIB) -> dict[str, tuple[int, int]]:
    """File (relative to lib/runbook) -> (imports inside functions, of which without a `# lazy:` reason)."""
    out: dict[str, tuple[int, int]] = {}
    for m, (p, text) in srcs.items():
        lines = text.splitlines()
        inner = [node for node, in_function in imports(m, p, text) if in_function]
        bare = [n for n in inner if not any(LAZY.search(lines[i - 1]) for i in range(n.lineno, (n.end_lineno or n.lineno) + 1))]
        if inner:
            out[p.relative_to(lib).as_posix()] = (len(inner), len(bare))
    return out


def stray_reasons(srcs: dict[str, tuple[Path, str]], lib: Path = LIB) -> list[str]:
    """`# lazy:` comments on lines that hold no import inside a function: a reason for nothing."""
    bad = []
    for m, (p, text) in srcs.items():
        lines = {i for node, f in imports(m, p, text) if f for i in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
        bad += [f"{p.relative_to(lib).as_posix()}:{i}" for i, line in enumerate(text.splitlines(), 1)
                if LAZY.search(line) and i not in lines]
    return bad


def lazy_problems(counts: dict[str, tuple[int, int]], allowed: dict[str, int]) -> str:
    bare = {f: n for f, (_, n) in counts.items() if n}
    if bare == allowed:
        return ""
    table = "\n".join(f"  {f}: {total} inside functions, {n} without a reason"
                      + ("" if allowed.get(f) == n else f"  (allowed: {allowed.get(f, 0)})")
                      for f, (total, n) in sorted(counts.items()) if n or f in allowed)
    gone = sorted(set(allowed) - set(bare))
    return ("imports inside functions without `# lazy: <reason>` differ from UNEXPLAINED_LAZY: move each to the top "
            f"of its module, or give the reason it keeps start-up light; then update the list.\n{table}"
            + (f"\n  gone from: {', '.join(gone)}" if gone else "")
            + f"\n  total: {sum(t for t, _ in counts.values())} imports inside functions in {len(counts)} files")


def private_reach_ins(srcs: dict[str, tuple[Path, str]], lib: Path = LIB) -> dict[str, list[str]]:
    """File -> the private names (`_name`, not dunders) it takes from another runbook module: imported by
    name (`from m import _x`) or reached through an imported name (`m._x`, `Serving._x`)."""
    out: dict[str, list[str]] = {}
    private = re.compile(r"^_(?!_)")
    for m, (p, text) in srcs.items():
        bound: dict[str, str] = {}
        found: list[str] = []
        for node, _ in imports(m, p, text):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("runbook")):
                for a in node.names:
                    bound[a.asname or a.name] = a.name
                    if private.match(a.name):
                        found.append(a.name)
            elif isinstance(node, ast.Import):
                bound.update({a.asname or a.name.split(".")[0]: a.name for a in node.names if a.name.startswith("runbook")})
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and private.match(node.attr):
                found.append(f"{node.value.id}.{node.attr}")
        if found:
            out[p.relative_to(lib).as_posix()] = sorted(set(found))
    return out


def test_no_import_cycles_but_the_known_ones():
    msg = cycle_problems(cycles(graph(sources())), KNOWN_CYCLES)
    assert not msg, msg


def test_imports_inside_functions_give_their_reason():
    srcs = sources()
    msg = lazy_problems(lazy_imports(srcs), UNEXPLAINED_LAZY)
    assert not msg, msg
    stray = stray_reasons(srcs)
    assert not stray, f"`# lazy:` on a line with no import inside a function: {stray}"


def test_no_private_name_crosses_a_module_but_the_known_ones():
    found = private_reach_ins(sources())
    assert found == PRIVATE_REACH_INS, (
        "private names taken from another module differ from PRIVATE_REACH_INS: make a shared helper public "
        f"(or move it to the module that uses it), then update the list.\nfound: {found}")


# ---- the checks can fail -------------------------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, tuple[Path, str]]:
    lib = tmp_path / "runbook"
    for name, text in files.items():
        f = lib / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return sources(lib)


def test_the_old_spec_tunespec_cycle_is_caught():
    """core/tunespec.py as it was: `from runbook.core.spec import ..., Serving, _Strict`, while spec.py
    imported Tune from it mid-file."""
    srcs = sources()
    path, text = srcs["runbook.core.tunespec"]
    srcs["runbook.core.tunespec"] = (path, text + "\nfrom runbook.core.spec import Serving, _Strict\n")
    found = cycles(graph(srcs))
    assert {"runbook.core.spec -> runbook.core.tunespec", "runbook.core.tunespec -> runbook.core.spec"} in found
    assert "runbook.core.tunespec -> runbook.core.spec" in cycle_problems(found, KNOWN_CYCLES)


def test_cycles_are_found_through_every_form_of_import(tmp_path):
    srcs = _tree(tmp_path, {
        "__init__.py": "",
        "a/__init__.py": "from runbook.a.one import x\n",                 # a package root and its own module
        "a/one.py": "def f():\n    from runbook import a\n",             # inside a function
        "b/__init__.py": "",
        "b/two.py": "from . import three\n",                              # relative, a submodule
        "b/three.py": "import runbook.c.four\n",
        "c/__init__.py": "",
        "c/four.py": "from ..b.two import y\n",                           # relative, up a package
        "d/__init__.py": "",
        "d/five.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runbook.d.six import Z\n",
        "d/six.py": "from runbook.d import five\n",                       # five -> six only for type checkers
    })
    found = cycles(graph(srcs))
    assert {"runbook.a -> runbook.a.one", "runbook.a.one -> runbook.a"} in found
    assert {"runbook.b.two -> runbook.b.three", "runbook.b.three -> runbook.c.four", "runbook.c.four -> runbook.b.two"} in found
    assert len(found) == 2
    assert "gone or changed" in cycle_problems([], [found[0]])


def test_an_unexplained_import_inside_a_function_is_caught(tmp_path):
    srcs = _tree(tmp_path, {
        "__init__.py": "",
        "m.py": ("import json\n\n"
                 "def f():\n    import pandas as pd  # lazy: pandas only for the notebook's table\n\n"
                 "def g():\n    import os\n\n"
                 "def h():\n    from x import (\n        y,  # lazy: the reason may sit on any line of the statement\n    )\n"),
        "n.py": "import json  # lazy: a reason for a top-level import is stray\n",
    })
    counts, stray = lazy_imports(srcs, tmp_path / "runbook"), stray_reasons(srcs, tmp_path / "runbook")
    assert counts == {"m.py": (3, 1)}
    assert "m.py: 3 inside functions, 1 without a reason" in lazy_problems(counts, {})
    assert lazy_problems(counts, {"m.py": 1}) == ""
    assert "gone from: m.py" in lazy_problems({}, {"m.py": 1})
    assert stray == ["n.py:1"]


def test_a_private_reach_in_is_caught():
    """core/tunespec.py as it was: it subclassed spec's `_Strict` and called `Serving._flag_values`."""
    srcs = sources()
    path, text = srcs["runbook.core.tunespec"]
    srcs["runbook.core.tunespec"] = (path, text + "\nfrom runbook.core.spec import Serving, _Strict\n"
                                                  "Serving._flag_names(Serving._flag_values({}))\n")
    assert private_reach_ins(srcs)["core/tunespec.py"] == ["Serving._flag_names", "Serving._flag_values", "_Strict"]
