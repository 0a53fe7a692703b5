"""Reading a deployment spec's YAML safely: a small regular UTF-8 file, bounded nesting and alias
expansion, no duplicate keys, and every plain scalar read the way its field needs rather than by a
YAML 1.1 surprise. spec.py validates the data this returns."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from runbook.core.errors import SpecError
from runbook.core.fsutil import FileRefused, read_regular
from runbook.core.specbase import TYPED_FLAGS, unwrap

MAX_SPEC_BYTES = 1 << 20      # a deployment spec is a few KiB; anything this big is a mistake (or a bomb)
_MAX_DEPTH = 64               # nesting levels
_MAX_NODES = 100_000          # YAML nodes after alias expansion ("billion laughs")

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, line, seen[key])
                seen[key] = line
            except TypeError:
                continue  # unhashable: SafeConstructor reports it
        return super().construct_mapping(node, deep=deep)


def read_spec(p: Path) -> str:
    """The spec's text: a regular, small, UTF-8 file, else one SpecError line naming it and the fix."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise SpecError(f"{p}: deployment spec not found (see deployments/ for examples)") from None
    except (OSError, ValueError) as e:
        raise SpecError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = read_regular(p, MAX_SPEC_BYTES, st, what="a deployment spec")
    except FileRefused as e:
        raise SpecError(f"{p}: {e.reason}; give the deployment spec's YAML file (e.g. deployments/<name>.yaml)") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save the file as UTF-8") from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.reader.ReaderError):
        return f"character #x{e.character if isinstance(e.character, int) else ord(e.character):04x} at position {e.position}: {e.reason}"
    msg = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
    return " ".join(str(msg).split())


def _check_shape(text: str, p: Path) -> None:
    """Bound nesting before composing (PyYAML composes recursively)."""
    depth = 0
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > _MAX_DEPTH:
                raise SpecError(f"{p}: line {ev.start_mark.line + 1}: nested more than {_MAX_DEPTH} levels deep; "
                                "a deployment spec is a few levels of keys")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _count_nodes(root: yaml.Node, p: Path) -> None:
    """Refuse recursive aliases and alias bombs: count nodes as the constructed data would hold them."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            raise SpecError(f"{p}: line {n.start_mark.line + 1}: recursive alias (an anchor used inside itself)")
        total = 1
        if isinstance(n, (yaml.MappingNode, yaml.SequenceNode)):
            active.add(id(n))
            for child in n.value:
                for c in (child if isinstance(child, tuple) else (child,)):
                    total += size(c)
                    if total > _MAX_NODES:
                        raise SpecError(f"{p}: line {n.start_mark.line + 1}: aliases expand to more than {_MAX_NODES:,} "
                                        "values; a deployment spec needs far fewer (remove the alias chain)")
            active.discard(id(n))
        sizes[id(n)] = total
        return total

    size(root)


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL_TAG, _NULL_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
# Plain scalars only YAML 1.1 reads as numbers, and not as the digits show: base 60 (`30:00` is 1800,
# `1:30` is 90) and a leading-zero octal (`0755` is 493). YAML 1.2 and every reader would not agree.
_YAML11_ONLY = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?|0[0-7_]+)$")


def _as_written(root: yaml.Node, p: Path, model: type[BaseModel]) -> None:
    """Everywhere in the spec, a plain scalar is read the way its field needs, never by a YAML 1.1 surprise:

    - string fields (and serving.flags values SGLang gets as text): a number or date is kept as the text
      written (`served_name: 0755` stays "0755", `compute_capability: 12.0` stays "12.0", a flag `x: 1:30`
      stays "1:30"); yes/no/on/off/true/false must be quoted (YAML reads them as booleans); dates are left
      to the loader (an impossible one is refused with "quote a value meant as text"); serving.env's values
      ("text": a string that cannot be left empty) keep `0755`, `1:30`, `1e3` as written and refuse null too;
    - number fields (and the flags the runbook computes with): base-60 (`port: 30:00`) and leading-zero
      octal (`port: 030000`) are refused, as is a boolean; `0x1F`, `1_000` and quoted digits are numbers.
    """
    _walk(root, ("model", model), "", "", p)


def _walk(n: yaml.Node, kind: Any, where: str, key: str, p: Path) -> None:
    """Follow the spec's node tree alongside the model's fields; `kind` is what the field at `where` needs."""
    if isinstance(kind, tuple) and isinstance(n, yaml.MappingNode):
        _walk_mapping(n, kind, where, key, p)
    elif isinstance(kind, tuple) and kind[0] == "list" and isinstance(n, yaml.SequenceNode):
        for i, item in enumerate(n.value):
            _walk(item, kind[1], f"{where}[{i}]", key, p)
    elif isinstance(n, yaml.ScalarNode):
        if kind == "flag":
            # A value SGLang gets as text: keep YAML 1.1-only numbers and dates as written; true/false stay switches.
            if n.style is None and n.tag in (_INT_TAG, _FLOAT_TAG) and _YAML11_ONLY.match(n.value):
                n.tag = _STR
            return
        _scalar(n, kind, where, key, p)


def _walk_mapping(n: yaml.MappingNode, kind: tuple[Any, Any], where: str, key: str, p: Path) -> None:
    """A model's fields or a dict's values (merge keys followed); unknown keys are left for pydantic to report."""
    what, sub = kind
    for k, v in n.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        if k.tag == _MERGE:
            for m in (v.value if isinstance(v, yaml.SequenceNode) else [v]):
                _walk(m, kind, where, key, p)
            continue
        name = k.value
        path = f"{where}.{name}" if where else name
        if what == "model":
            f = sub.model_fields.get(name)
            if f is None:   # unknown keys: pydantic says so
                continue
            _walk(v, unwrap(f.annotation), path, name, p)
        elif what == "dict":
            child = "text" if sub is str else sub   # a mapping's string values are never empty (serving.env)
            if sub == "flag":
                typed = TYPED_FLAGS.get(name)
                child = typed[0] if typed else "flag"
            _walk(v, child, path, name, p)


def _scalar(n: yaml.ScalarNode, kind: Any, where: str, key: str, p: Path) -> None:
    """One plain scalar, read as its field needs: text kept as written, a number refused when only YAML 1.1 reads it."""
    if n.style is not None:        # quoted or block scalar: a string, as written
        return
    line = n.start_mark.line + 1
    if kind in (str, "text"):
        if n.tag in (_INT_TAG, _FLOAT_TAG):
            n.tag = _STR
        elif n.tag == _BOOL_TAG or (kind == "text" and n.tag == _NULL_TAG):
            what = "true/false" if n.tag == _BOOL_TAG else "null (no value)"
            raise SpecError(f"{p}: line {line}: {where}: YAML reads {n.value or 'an empty value'} as {what}, not text; "
                            f"quote the value: {key}: \"{n.value}\"")
    elif kind in (int, float):
        if n.tag in (_INT_TAG, _FLOAT_TAG) and _YAML11_ONLY.match(n.value):
            how = "base 60" if ":" in n.value else "octal"
            read = yaml.safe_load(n.value)
            raise SpecError(f"{p}: line {line}: {where}: YAML 1.1 reads {n.value} as {read} ({how}); "
                            f"write the number you mean in plain decimal digits, without leading zeros or colons")
        if n.tag == _BOOL_TAG:
            raise SpecError(f"{p}: line {line}: {where}: YAML reads {n.value} as true/false; write a number")


def parse(text: str, p: Path, model: type[BaseModel]) -> Any:
    """The spec's YAML as data, every scalar read as `model`'s field needs; any problem one SpecError line."""
    try:
        _check_shape(text, p)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _count_nodes(node, p)
            _as_written(node, p, model)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _DuplicateKey as e:
        raise SpecError(f"{p}: line {e.line}: duplicate key {e.key!r} (first at line {e.first}); keep only one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        raise SpecError(f"{p}:{where} not valid YAML: {_yaml_problem(e)}") from None
    except SpecError:
        raise
    except RecursionError:
        raise SpecError(f"{p}: nested too deeply to be a deployment spec") from None
    except Exception as e:  # a value PyYAML's constructors cannot build (e.g. `2001-02-30` as a date)
        raise SpecError(f"{p}: not a valid YAML value ({' '.join(str(e).split()) or type(e).__name__}); "
                        "quote a value meant as text, e.g. description: \"2001-02-30\"") from None
