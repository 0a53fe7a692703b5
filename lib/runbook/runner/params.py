"""--param KEY=VALUE: typed and validated against each notebook's `parameters` cell.

papermill's own `-p` guesses types from the text ("12.10" becomes 12.1, "true" stays a string);
here the annotation in the parameters cell (`tp: int | None = None`) decides, through pydantic. A stage
parameter is `T | None`, None meaning the spec's value; `--param tp=none` (or null) passes None.
"""
from __future__ import annotations

import ast
import io
import json
import re
import tokenize
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from runbook.core import registry, secrets
from runbook.core.errors import SpecError
from runbook.core.options import FINITE, describe
from runbook.core.paths import DEFAULT_DEPLOYMENT
from runbook.core.secrets import is_secret_key

# Names a parameters cell may use in annotations; anything else is passed as a string.
_TYPES: dict[str, Any] = {
    "int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict,
    "List": list, "Dict": dict, "Optional": Optional, "None": type(None),
}
# Parameters the runner itself sets (the runner-notebook contract); a user may not override them. Each as a notebook's
# generated parameters cell declares it (runner/paramcell.py): type, default when run by hand, what it is. The archive
# root holds earlier runs (regression checks; the run being written is hidden until it completes) and tune's runs.
# Each is the options field of that name where a stage takes it (its CLI flag the alias: --out, --archive, --progress).
RUNNER_PARAMS: dict[str, tuple[str, str, str]] = {
    "deployment": ("str", f'"../deployments/{DEFAULT_DEPLOYMENT}"', "deployment spec (YAML)"),
    "results_path": ("str", '""', "results JSON written here; set by the runner"),
    "artifact_dir": ("str | None", "None", "raw records written here; set by the runner (None: not written)"),
    "archive_root": ("str | None", "None", "the archive: earlier runs, tune's runs; set by the runner (None: outputs/)"),
    "interactive": ("bool", "True", "a person is at the notebook (False under the runner): 20's what-if panel, 40's progress bars"),
}
RESERVED = tuple(RUNNER_PARAMS)
NONE = ("none", "null")   # --param values that mean None for a `T | None` parameter


def _type(name: str | None) -> Any:
    if not name or name == "None":
        return None
    try:
        return eval(name, {"__builtins__": {}}, _TYPES)  # names restricted to _TYPES
    except Exception:
        return None


def notebook_params(notebook: Path) -> dict[str, dict[str, Any]]:
    """The notebook's parameters: name -> {inferred_type_name, default, help}.

    Read with Python's own parser: papermill's line regex skips any line with a second '=' (such as
    `args: list[str] = []  # e.g. ["kv-cache-dtype=bf16"]`) or a `T | None` annotation (its pattern has no
    `|`), which hid those parameters from --param."""
    import nbformat  # lazy: ~0.8 s that `runbook --help` would pay; only --param and `runbook run` read notebooks

    nb = nbformat.read(str(notebook), as_version=4)
    cell = next((c for c in nb.cells if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        return {}
    src = cell.source
    try:
        tree = ast.parse(src)
    except SyntaxError:
        import papermill  # lazy: ~0.8 s, only for a parameters cell Python cannot parse

        return papermill.inspect_notebook(str(notebook))
    comments: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - ast.parse accepted it
        pass
    out: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names, ann, value = [node.target.id], ast.unparse(node.annotation), node.value
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            names, ann, value = [t.id for t in node.targets if isinstance(t, ast.Name)], "None", node.value
        else:
            continue
        for name in names:
            out[name] = {"name": name, "inferred_type_name": ann,
                         "default": ast.get_source_segment(src, value) if value is not None else "None",
                         "help": comments.get(node.end_lineno or node.lineno, "")}
    return out


def coerce(key: str, raw: str, type_name: str | None, where: str) -> Any:
    typ = _type(type_name)
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType) and type(None) in args:
        if raw.strip().lower() in NONE:      # `tp: int | None`: none means unset, as an absent flag
            return None
        rest = [a for a in args if a is not type(None)]
        typ = rest[0] if len(rest) == 1 else typ
    if typ is None or typ is str:
        return raw
    origin = typing.get_origin(typ) or typ
    value: Any = raw
    try:
        if origin in (list, tuple):
            value = json.loads(raw) if raw.lstrip().startswith("[") else [x.strip() for x in raw.split(",") if x.strip()]
        elif origin is dict:
            value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SpecError(f"--param {key}={raw}: not valid JSON for {type_name} ({e.msg})") from None
    try:
        return TypeAdapter(typ, config=FINITE).validate_python(value)
    except ValidationError as e:
        raise SpecError(f"--param {key}={raw}: {where} declares {key}: {type_name}; the value {describe(e.errors()[0])}") from None


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE pairs, each KEY a parameter name or NOTEBOOK.NAME (one notebook's parameter: a stage name, verb or
    notebook stem before the dot), checked for what may never be a parameter."""
    out: dict[str, str] = {}
    for p in pairs:
        if "=" not in p:
            raise SpecError(f"--param {p!r}: expected KEY=VALUE")
        k, v = p.split("=", 1)
        k = k.strip()
        scope, _, name = k.rpartition(".")
        if not name.isidentifier() or (scope and not re.fullmatch(r"\w+", scope)):
            raise SpecError(f"--param {p!r}: {k!r} is not a parameter name (NAME, or NOTEBOOK.NAME for one notebook)")
        if is_secret_key(name):
            raise SpecError(f"--param {k}: refusing to pass a secret as a notebook parameter (papermill stores parameters in "
                            "clear text); put it in the environment or in the spec's serving.env_file")
        if name in RESERVED:
            raise SpecError(f"--param {k}: set by the runner; use --deployment / --out instead")
        out[k] = v
    return out


def _scoped(key: str, notebooks: list[Path]) -> tuple[list[Path] | None, str]:
    """The notebooks a key addresses (None: every one declaring it) and the parameter's name: `bench.concurrency`
    is notebook 40's alone (stage name, verb or notebook stem before the dot)."""
    scope, _, name = key.rpartition(".")
    if not scope:
        return None, name
    try:
        stem = registry.get(scope).notebook
    except KeyError:
        stem = scope
    picked = [nb for nb in notebooks if nb.stem == stem]
    if not picked:
        raise SpecError(f"--param {key}: {scope!r} is not a selected notebook "
                        f"(one of: {', '.join(nb.stem for nb in notebooks)}; or a stage's name or verb)")
    return picked, name


_SECRET_WHERE = ("notebooks read secrets at run time from the environment or serving.env_file (papermill writes "
                 "parameters into the notebook and onto its command line)")


def _secret_inside(value: Any) -> str | None:
    """What in a typed parameter value is a secret by its name: a dict key, a NAME=VALUE item (an --arg
    what-if such as api-key=...), a URL's password. None when nothing is."""
    if isinstance(value, dict):
        for k, v in value.items():
            if is_secret_key(str(k)):
                return f"key {k!r}"
            inner = _secret_inside(v)
            if inner:
                return inner
    elif isinstance(value, (list, tuple)):
        return next((w for w in map(_secret_inside, value) if w), None)
    elif isinstance(value, str):
        name = re.match(r"\s*-*([A-Za-z_][\w.-]*)\s*[=:]", value)
        if name and is_secret_key(name.group(1)):
            return f"{name.group(1)}=…"
        try:
            if urlsplit(value.strip()).password:
                return "a URL with a password"
        except ValueError:
            pass
    return None


def refuse_secrets(values: dict[str, Any], scrub: Iterable[str]) -> None:
    """No secret reaches a notebook parameter: a value holding a known secret (any spelling the scrubber knows),
    or a secret by its name inside the value, is refused before anything is written. The message names the
    parameter, never the value."""
    known = secrets.expand(scrub)
    for where, v in values.items():
        text = v if isinstance(v, str) else json.dumps(v)
        if any(s in text for s in known):
            raise SpecError(f"{where}: holds the value of a secret (a secret-named environment variable, the API key "
                            f"or a serving.env_file value); {_SECRET_WHERE}")
        inner = _secret_inside(v)
        if inner:
            raise SpecError(f"{where}: holds a secret ({inner}); {_SECRET_WHERE}")


def resolve(pairs: list[str], notebooks: list[Path], scrub: Iterable[str] = ()) -> dict[Path, dict[str, Any]]:
    """Typed parameters per notebook; every key must be declared by at least one selected notebook (a scoped
    NOTEBOOK.NAME by that notebook, and it wins there over a plain NAME), and no value may hold a secret (`scrub`:
    the run's secret values)."""
    raw = parse_pairs(pairs)
    refuse_secrets({f"--param {k}": v for k, v in raw.items()}, scrub)   # before a type error could echo the value
    per_nb: dict[Path, dict[str, Any]] = {nb: {} for nb in notebooks}
    if not raw:
        return per_nb
    declared: dict[Path, dict[str, dict[str, Any]]] = {nb: notebook_params(nb) for nb in notebooks}
    for k, v in sorted(raw.items(), key=lambda kv: "." in kv[0]):     # scoped last: they override a plain NAME
        scope, name = _scoped(k, notebooks)
        takers = [nb for nb in (scope or notebooks) if name in declared[nb]]
        if not takers:
            known = sorted({n for nb in (scope or notebooks) for n in declared[nb] if n not in RESERVED})
            where = f"notebook {scope[0].stem}" if scope else "selected notebook"
            raise SpecError(f"--param {k}: no {where} has a parameter {name!r} (known: {', '.join(known)})")
        for nb in takers:
            per_nb[nb][name] = coerce(k, v, declared[nb][name].get("inferred_type_name"), nb.name)
            refuse_secrets({f"--param {k}": per_nb[nb][name]}, scrub)
    return per_nb
