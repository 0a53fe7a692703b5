"""Each stage notebook's `parameters` cell, generated from its stage's options model: `make notebook-params`
(`python -m runbook.runner.paramcell`; `--check` lists the stale ones and exits 1).

The cell declares the runner's parameters the notebook takes (`params.RUNNER_PARAMS`: deployment and results_path
always; artifact_dir, archive_root and interactive where the stage's options take them or the notebook's code reads
them), then every options field a notebook can set as `name: type = default  # help`: the field's type without its
bounds (the options model checks those), None for unset, and its description with "default: X" said as "None: X".
Left out: the verb's action field (the notebook shows `evaluate`'s report), fields marked `"notebook": False` in
`json_schema_extra` (settings of the verb's other actions) and fields the runner sets (one line each, never twice).
"""
from __future__ import annotations

import ast
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from runbook.core import paths, registry
from runbook.core.options import flag
from runbook.core.settings import default_text, shown_default
from runbook.runner.params import RESERVED, RUNNER_PARAMS

_ALWAYS = ("deployment", "results_path")
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str", Path: "str"}


def type_name(annotation: Any) -> str:
    """A field's type as a parameters cell writes it (what `params.coerce` reads back): `list[int]`, `float`;
    bounds and validators dropped, a Literal as its values' type, a path as str. None is added by the caller."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise ValueError(f"{annotation!r}: a parameter has one type besides None")
        return type_name(rest[0])
    if origin is Literal:
        return _SCALARS[type(args[0])]
    if origin is list:
        return f"list[{type_name(args[0])}]"
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    raise ValueError(f"{annotation!r}: no parameters-cell spelling for this type")


def _literal(value: Any) -> str:
    if isinstance(value, (str, Path)):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def _help(stage: registry.Stage, name: str, unset: bool) -> str:
    """The field's description as the notebook reads it: its own flags named as parameters, "default: X" as "None: X"
    where the parameter's default is None (the comment says what None takes)."""
    model = stage.options
    flags = {flag(model, k): k for k in model.model_fields}
    text = re.sub(r"--[a-z][a-z0-9-]*", lambda m: flags.get(m.group(0), m.group(0)), model.model_fields[name].description or "")
    if not unset:
        return text
    text = text.replace("default: ", "None: ")
    shown = shown_default(model.model_fields[name])
    if "None: " not in text and shown is not None:       # its settings' default, as --help shows it
        text += f" (None: {default_text(shown)})"
    if "None: " not in text:
        raise ValueError(f"{stage.verb} option {name}: its description must say what unset takes, '(default: X)'; "
                         "the notebook's parameter is None by default")
    return text


def _read_names(nb: dict[str, Any]) -> set[str]:
    """Every name the notebook's code reads outside its parameters cell."""
    names: set[str] = set()
    for c in nb["cells"]:
        if c["cell_type"] != "code" or "parameters" in c.get("metadata", {}).get("tags", []):
            continue
        src = "".join(c["source"])
        names |= {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
    return names


def _runner_names(stage: registry.Stage, nb: dict[str, Any]) -> list[str]:
    used = set(stage.options.model_fields) | _read_names(nb)
    return [n for n in RESERVED if n in _ALWAYS or n in used]


def _fields(stage: registry.Stage) -> list[str]:
    out = []
    for name, f in stage.options.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if name == stage.action_field or extra.get("notebook") is False or name in RESERVED:
            continue
        out.append(name)
    return out


def source(stage: registry.Stage, nb: dict[str, Any]) -> str:
    """The parameters cell of the stage's notebook `nb` (its JSON)."""
    lines = []
    for name in _runner_names(stage, nb):
        typ, default, what = RUNNER_PARAMS[name]
        lines.append(f"{name}: {typ} = {default}  # {what}")
    for name in _fields(stage):
        f = stage.options.model_fields[name]
        default = f.get_default(call_default_factory=True)
        typ = type_name(f.annotation) + (" | None" if default is None else "")
        lines.append(f"{name}: {typ} = {_literal(default)}  # {_help(stage, name, default is None)}")
    return "\n".join(lines)


def _cell(nb: Any) -> Any:
    return next(c for c in nb["cells"] if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", []))


def stale(notebooks: Path) -> list[str]:
    """The stage notebooks whose parameters cell differs from what the generator makes."""
    out = []
    for st in registry.stages():
        nb = json.loads((notebooks / f"{st.notebook}.ipynb").read_text(encoding="utf-8"))
        if "".join(_cell(nb)["source"]) != source(st, nb):
            out.append(st.notebook)
    return out


def write(notebooks: Path) -> list[str]:
    """Regenerate every stage notebook's parameters cell in place (nothing else in the file changes); the ones written."""
    import nbformat  # lazy: ~0.8 s, only where notebooks are rewritten

    done = []
    for st in registry.stages():
        path = notebooks / f"{st.notebook}.ipynb"
        raw = json.loads(path.read_text(encoding="utf-8"))
        new = source(st, raw)
        nb = nbformat.read(str(path), as_version=4)
        cell = _cell(nb)
        if cell.source != new:
            cell.source = new
            nbformat.write(nb, str(path))
            done.append(st.notebook)
    return done


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    notebooks = paths.notebooks_dir()
    if "--check" in args:
        old = stale(notebooks)
        for name in old:
            print(f"{name}.ipynb: parameters cell is stale; run make notebook-params", file=sys.stderr)
        return 1 if old else 0
    for name in write(notebooks):
        print(f"wrote {name}.ipynb's parameters cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
