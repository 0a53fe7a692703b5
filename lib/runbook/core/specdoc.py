"""The deployment spec's field reference, generated from the pydantic model so it cannot drift.

`python -m runbook.core.specdoc > docs/spec-reference.md` regenerates the committed page;
tests/test_docs.py fails when the model changed and the page was not regenerated.
"""
from __future__ import annotations

import inspect
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from runbook.core.spec import Deployment

_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is not None and getattr(origin, "__name__", "") == "Annotated":
        return _type_name(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return " or ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in get_args(tp))
    if origin is list:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        key, value = get_args(tp)
        return f"map of {_type_name(key)} to {_type_name(value)}"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _constraints(metadata: list[Any]) -> list[str]:
    """gt/ge/lt/le, max_length and pattern from a field's (or an Annotated item's) metadata."""
    out = []
    for m in metadata:
        for attr, sign in _BOUNDS:
            value = getattr(m, attr, None)
            if value is not None:
                out.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value}")
        if getattr(m, "max_length", None) is not None:
            out.append(f"at most {m.max_length:,} entries")
        if getattr(m, "pattern", None) is not None:
            out.append(f"matches `{m.pattern}`")
    return out


def _item_constraints(tp: Any) -> list[str]:
    """Bounds on a list's items (`list[Annotated[int, Field(gt=0)]]`)."""
    if get_origin(tp) is list:
        item = get_args(tp)[0]
        if get_origin(item) is not None and getattr(get_origin(item), "__name__", "") == "Annotated":
            meta: list[Any] = []
            for a in get_args(item)[1:]:
                meta.extend(a.metadata if isinstance(a, FieldInfo) else [a])
            return [f"each {c}" for c in _constraints(meta)]
    return []


def _default(f: FieldInfo) -> str:
    if f.default_factory is not None:
        value = f.default_factory()  # type: ignore[call-arg]
    elif f.default is PydanticUndefined:
        return "required"
    else:
        value = f.default
    if isinstance(value, BaseModel):
        return "its fields' defaults"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value in ({}, [], ""):
        return "empty"
    return f"`{value}`"


def _comments(cls: type[BaseModel]) -> dict[str, str]:
    """Comment lines right above a field in the class source: the model's own explanation where the
    Field has no description."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"(\w+)\s*:", stripped)
        if m and pending:
            out[m.group(1)] = " ".join(pending)
        pending = []
    return out


def _describe(name: str, f: FieldInfo, comments: dict[str, str]) -> str:
    if f.description:
        return f.description
    if name in comments:
        return comments[name]
    sub = _model_of(f.annotation)
    if sub is not None and sub.__doc__:
        return " ".join(sub.__doc__.split())
    return ""


def _model_of(tp: Any) -> type[BaseModel] | None:
    """The section model behind a field (`Serving`, or `Node` for `list[Node]`)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if get_origin(tp) is list:
        return _model_of(get_args(tp)[0])
    return None


def _cell(text: str) -> str:
    """Plain text into a table cell: no pipes, HTML or emphasis read into it (`<host>`, `FSSPEC_S3_*`)."""
    for char in "\\*_|":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _rows(cls: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    comments = _comments(cls)
    for name, f in cls.model_fields.items():
        if f.exclude:
            continue    # filled by the loader, not written in a spec
        path = f"{prefix}{name}"
        sub = _model_of(f.annotation)
        # Bounds hold code spans (patterns): only a pipe needs escaping there.
        bounds = ", ".join(_constraints(list(f.metadata)) + _item_constraints(f.annotation)).replace("|", r"\|")
        rows.append(f"| `{path}` | {_cell(_type_name(f.annotation))} | {_default(f)} | "
                    f"{bounds} | {_cell(_describe(name, f, comments))} |")
        if sub is not None:
            rows.extend(_rows(sub, f"{path}[]." if get_origin(f.annotation) is list else f"{path}."))
    return rows


def render(model: type[BaseModel] = Deployment) -> str:
    """The reference page as markdown: one row per field path, with type, default, bounds and description."""
    lines = [
        "# Deployment spec reference",
        "",
        "<!-- Generated from runbook.core.spec.Deployment: do not edit by hand. Regenerate with",
        "     python -m runbook.core.specdoc > docs/spec-reference.md -->",
        "",
        "Every key a deployment spec may hold, generated from the pydantic model that validates it "
        "(`lib/runbook/core/spec.py`). Unknown keys are refused. What the sections are for: "
        "[The deployment spec](spec.md).",
        "",
        "| field | type | default | bounds | description |",
        "|---|---|---|---|---|",
    ]
    lines.extend(_rows(model, ""))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
