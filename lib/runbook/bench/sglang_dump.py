"""SGLang's own request dumps as a trace: the .pkl files `--dump-requests-folder` (or
/configure_logging's dump_requests_folder) and `--crash-dump-folder` write.

SGLang 0.5.23 (srt/managers/tokenizer_manager.py, `_dump_data_to_file`, `dump_requests_before_crash`)
pickles {"server_args", "config_updates", "resolved_config", "requests": [(request object, output
dict, created_time, finished_time), ...], ["launch_command"]}: times are wall-clock seconds; the
output dict's meta_info holds prompt_tokens / completion_tokens / cached_tokens.

A pickle can run code when it is loaded. This reader never resolves a real class or function: every
global the file names (SGLang's dataclasses, enums, numpy, os.system alike) becomes an inert
placeholder that only keeps its state, so the runbook environment needs no SGLang and a hostile file
can do nothing but fail to parse. Lengths and times are then read from plain dicts, lists and ints.
"""
from __future__ import annotations

import io
import math
import pickle
from typing import Any

from runbook.core.errors import InputError
from runbook.core.numeric import is_int, is_number

PICKLE_MAGIC = b"\x80"           # protocol 2 and later start with PROTO


class Opaque:
    """Whatever class or function the pickle named: its arguments and state, nothing run."""

    _name = "?"

    def __new__(cls, *args: Any, **kw: Any) -> Opaque:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.__dict__["_args"] = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:      # (dict, slots) form
            for part in state:
                if isinstance(part, dict):
                    self.__dict__.update({k: v for k, v in part.items() if isinstance(k, str)})
        elif isinstance(state, dict):
            self.__dict__.update({k: v for k, v in state.items() if isinstance(k, str)})

    def __repr__(self) -> str:
        return f"<{self._name}>"


class _Inert(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return type(name[:64] or "_", (Opaque,), {"_name": f"{module}.{name}"[:200]})


def load(raw: bytes, source: str) -> Any:
    try:
        return _Inert(io.BytesIO(raw)).load()
    except RecursionError:
        raise InputError(f"{source}: the request dump nests too deep to read") from None
    except Exception as e:  # any malformed pickle is one bad input
        raise InputError(f"{source}: not a readable SGLang request dump ({type(e).__name__}: {str(e)[:120]}); "
                         "give a .pkl from --dump-requests-folder / --crash-dump-folder, or a Mooncake JSON Lines trace") from None


def _int(v: Any) -> int | None:
    return v if is_int(v) and v >= 0 else None


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return obj.__dict__.get(name) if isinstance(obj, Opaque) else None


def block_ids(ids: list[int], block: int, table: dict[tuple[int, tuple[int, ...]], int]) -> list[int]:
    """One id per `block` tokens, chained (an id stands for the whole prefix up to its block), so
    requests that shared a prefix in the dump share ids here, as Mooncake's hash_ids do."""
    out: list[int] = []
    prev = -1
    for k in range(0, len(ids), block):
        key = (prev, tuple(ids[k:k + block]))
        prev = table.setdefault(key, len(table))
        out.append(prev)
    return out


def rows(raw: bytes, source: str, block: int) -> tuple[list[dict[str, Any]], int]:
    """Trace rows (t s, input, output, hash_ids, session) from a dump, and how many entries had no lengths."""
    doc = load(raw, source)
    reqs = doc.get("requests") if isinstance(doc, dict) else None
    if not isinstance(reqs, (list, tuple)):
        raise InputError(f"{source}: a pickle, but not an SGLang request dump (no \"requests\" list)")
    out: list[dict[str, Any]] = []
    skipped = 0
    table: dict[tuple[int, tuple[int, ...]], int] = {}
    for entry in reqs:
        if not isinstance(entry, (tuple, list)) or len(entry) < 3:
            skipped += 1
            continue
        obj, res, created = entry[0], entry[1], entry[2]
        meta = _field(res, "meta_info")
        ids = _field(obj, "input_ids")
        ids = ids if isinstance(ids, (list, tuple)) and ids and all(_int(t) is not None for t in ids) else None
        n_in = _int(_field(meta, "prompt_tokens")) or (len(ids) if ids else None)
        sp = _field(obj, "sampling_params")
        n_out = _int(_field(meta, "completion_tokens"))
        if n_out is None:
            n_out = _int(_field(sp, "max_new_tokens"))
        if not is_number(created) or not math.isfinite(created) or not n_in or n_out is None:
            skipped += 1
            continue
        sess = next((v for v in (_field(obj, "session_id"), _field(obj, "conversation_id"))
                     if isinstance(v, (str, int)) and not isinstance(v, bool)), None)
        out.append({"t": float(created), "input": n_in, "output": n_out,
                    "hash_ids": block_ids(list(ids), block, table) if ids else [], "session": sess})
    if not out:
        raise InputError(f"{source}: the request dump has no request with a time and token counts"
                         + (f" ({skipped} entries without them)" if skipped else ""))
    out.sort(key=lambda r: float(r["t"]))
    return out, skipped
