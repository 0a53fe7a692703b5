"""Byte units are defined once, in runbook.core.units: a module that spells 1024**3 itself can drift."""
import ast
import re

from conftest import REPO

from runbook.core import units

LIB = REPO / "lib" / "runbook"
_POWERS = {2**10, 2**20, 2**30, 2**40, 10**6, 10**9}
_UNIT = re.compile(r"_?[KMGT]I?B")   # KIB, MIB, GIB, GB, _GIB: a unit, not a count like MAX_CHECKPOINT_GIB


def _const(node: ast.AST):
    try:
        v = ast.literal_eval(node)
        return v if isinstance(v, int) else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift)):
            a, b = _const(node.left), _const(node.right)
            if isinstance(a, int) and isinstance(b, int):
                return a**b if isinstance(node.op, ast.Pow) else a << b
        return None


def _unit_definitions(text: str) -> list[str]:
    """Module-level NAME = <a power-of-two byte unit> assignments."""
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and _const(node.value) in _POWERS:
            out += [t.id for t in node.targets if isinstance(t, ast.Name) and _UNIT.fullmatch(t.id)]
    return out


def test_units_are_binary():
    assert (units.MIB, units.GIB) == (1024**2, 1024**3)


def test_no_module_defines_its_own_byte_unit():
    bad = []
    for p in sorted(LIB.rglob("*.py")):
        if "data" in p.relative_to(LIB).parts or p == LIB / "core" / "units.py":
            continue
        bad += [f"{p.relative_to(REPO)}: {n}" for n in _unit_definitions(p.read_text())]
    assert not bad, "define byte units in runbook.core.units only:\n" + "\n".join(bad)


def test_the_scan_finds_a_local_unit():
    assert _unit_definitions("GIB = 1024**3\n_MIB = 1 << 20\nGB = 10**9\nN = 1024\nMAX_GIB = 1 << 20\n") == ["GIB", "_MIB", "GB"]
