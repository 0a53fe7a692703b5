"""A GGUF file's metadata (the header's key-value pairs, arrays skipped): what the llama-server pre-check
needs to size the KV cache. The format: magic, version, tensor count, KV count, then typed pairs
(ggml's gguf.c; all little-endian)."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from runbook.core.errors import InputError

# type id -> struct format of one scalar (8 = string, 9 = array are read apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MAX_KV = 100_000


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise EOFError
    return struct.unpack("<" + fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    if n > 1 << 24:
        raise ValueError(f"a {n}-byte string")
    return f.read(n).decode("utf-8", "replace")


def _value(f: BinaryIO, t: int) -> Any:
    if t in _SCALARS:
        return _read(f, _SCALARS[t])
    if t == 8:
        return _string(f)
    if t == 9:
        sub, n = _read(f, "I"), _read(f, "Q")
        for _ in range(n):      # skipped: token lists and merges are not needed here
            _value(f, sub)
        return None
    raise ValueError(f"unknown value type {t}")


def metadata(path: str | Path) -> dict[str, Any]:
    """The header's scalar and string values by key; an InputError naming the file when it is not GGUF."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("no GGUF magic")
            _read(f, "I")                 # version
            _read(f, "Q")                 # tensor count
            n = _read(f, "Q")
            if n > _MAX_KV:
                raise ValueError(f"{n} metadata entries")
            out = {}
            for _ in range(n):
                key = _string(f)
                out[key] = _value(f, _read(f, "I"))
            return out
    except OSError as e:
        raise InputError(f"{p}: cannot read the model: {e.strerror or e}") from None
    except (ValueError, EOFError, struct.error) as e:
        raise InputError(f"{p}: not a GGUF model ({str(e) or 'cut short'}); model.path must name a .gguf file") from None
