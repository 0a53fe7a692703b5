"""The installed SGLang's own log format strings, found by AST in its source and rendered with values.

A test names a file under sglang/srt and a piece of the message; the smallest string literal (plain,
f-string or %-format) holding it is found and filled in. A placeholder the caller gave no value for
raises KeyError naming the expression: a new field in a new SGLang fails the test loudly.
"""
from __future__ import annotations

import ast
import os
from functools import cache
from pathlib import Path
from typing import Any

_SERVING = os.environ.get("RUNBOOK_SERVING_PYTHON", "")
_CANDIDATES = [Path(__file__).resolve().parents[2] / ".venv-serving" / "lib" / "python3.11" / "site-packages" / "sglang" / "srt"]
if _SERVING:
    _CANDIDATES.insert(0, Path(_SERVING).resolve().parents[1] / "lib" / "python3.11" / "site-packages" / "sglang" / "srt")
SRT = next((p for p in _CANDIDATES if p.is_dir()), None)


@cache
def _tree(rel: str) -> ast.AST:
    assert SRT is not None
    return ast.parse((SRT / rel).read_text())


def literal_text(node: ast.AST) -> str:
    """The literal parts of a string node (placeholders as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


def find(rel: str, needle: str) -> ast.AST:
    """The smallest string literal in sglang/srt/REL whose literal text contains `needle`."""
    hits = [n for n in ast.walk(_tree(rel)) if isinstance(n, (ast.Constant, ast.JoinedStr)) and needle in literal_text(n)]
    # an f-string's own Constant parts also match; prefer the whole literal (JoinedStr) over its pieces
    whole = [n for n in hits if isinstance(n, ast.JoinedStr)] or hits
    assert whole, f"sglang/srt/{rel}: no log format string containing {needle!r} (SGLang's format changed?)"
    return min(whole, key=lambda n: len(literal_text(n)))


def _key(expr: ast.AST) -> list[str]:
    src = ast.unparse(expr)
    keys = [src]
    if isinstance(expr, ast.Attribute):
        keys.append(expr.attr)
    return keys


def render(rel: str, needle: str, values: dict[str, Any] | None = None, args: tuple = ()) -> str:
    """Fill the format string: f-string placeholders from `values` (by expression source or attribute
    name), %-placeholders from `args`."""
    return fill(find(rel, needle), values, args, f"sglang/srt/{rel}")


def fill(node: ast.AST, values: dict[str, Any] | None = None, args: tuple = (), where: str = "") -> str:
    """One string literal (ast.Constant or f-string) rendered as SGLang would log it; a placeholder without a
    value raises KeyError naming it and `where`."""
    values = values or {}
    if isinstance(node, ast.Constant):
        return node.value % args if args else node.value
    assert isinstance(node, ast.JoinedStr)
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(v.value)
            continue
        assert isinstance(v, ast.FormattedValue)
        keys = _key(v.value)
        hit = next((k for k in keys if k in values), None)
        if hit is None:
            raise KeyError(f"{where}: no value for placeholder {keys[0]!r} in {literal_text(node)!r}")
        spec = ast.unparse(v.format_spec)[2:-1] if v.format_spec is not None else ""
        val = values[hit]
        out.append(format(repr(val) if v.conversion == ord("r") else val, spec))
    return "".join(out)


def line(msg: str, rank: int | None = 0, ts: str = "2026-01-05 10:00:00", journal: bool = False) -> str:
    """As SGLang's configure_logger writes it ("[%(asctime)s TP0] %(message)s"), optionally as journalctl
    -o short-iso shows it."""
    prefix = f" TP{rank}" if rank is not None else ""
    s = f"[{ts}{prefix}] {msg}"
    if journal:
        s = f"{ts.replace(' ', 'T')}+0000 gpu-host python[4242]: {s}"
    return s
