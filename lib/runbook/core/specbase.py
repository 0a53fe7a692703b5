"""The spec's shared base, a leaf every spec module builds on (spec.py, tunespec.py): the strict model,
the bounds, the rules a serving flag passes and the SLO model. It imports only core.options (the rule that
every number is finite), so the sections built on it import it, not each other."""
from __future__ import annotations

import math
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runbook.core.numeric import is_int
from runbook.core.options import FINITE

_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Flags owned by other spec sections, so the spec cannot say the same thing twice.
_OWNED_FLAGS = {
    "model-path": "model.path", "model": "model.path", "tp-size": "parallelism.tp", "tp": "parallelism.tp",
    "tensor-parallel-size": "parallelism.tp", "pp-size": "parallelism.pp", "pipeline-parallel-size": "parallelism.pp",
    "dp-size": "parallelism.attn_dp", "attn-dp-size": "parallelism.attn_dp", "enable-dp-attention": "parallelism.attn_dp",
    "host": "serving.host", "port": "serving.port", "served-model-name": "model.served_name",
    "api-key": "serving.env_file (never inline a key)",
}

FlagValue = bool | int | float | str | None
# SGLang flags whose type the runbook relies on (kv sizing, service checks): checked at load, so a
# `context-length: lots` is a one-line spec error instead of a traceback in a later stage.
# name -> (type, lowest allowed, highest allowed, what to write)
_I32 = 2**31 - 1               # SGLang keeps token and request counts in int32 tensors
TYPED_FLAGS: dict[str, tuple[type, float, float, str]] = {
    "context-length": (int, 1, _I32, f"a token count in [1, {_I32:,}]"),
    "max-running-requests": (int, 1, _I32, f"a request count in [1, {_I32:,}]"),
    "max-total-tokens": (int, 1, _I32, f"a token count in [1, {_I32:,}]"),
    "max-prefill-tokens": (int, 1, _I32, f"a token count in [1, {_I32:,}]"),
    "chunked-prefill-size": (int, -1, _I32, f"a token count in [1, {_I32:,}], or -1 to disable chunked prefill"),
    "page-size": (int, 1, 1 << 20, f"a token count in [1, {1 << 20:,}]"),
    "cuda-graph-max-bs": (int, 1, 1 << 20, f"a batch size in [1, {1 << 20:,}]"),
    "max-mamba-cache-size": (int, 1, _I32, f"a count in [1, {_I32:,}]"),
    "mem-fraction-static": (float, 0, 1, "a fraction in (0, 1]"),
    "mamba-full-memory-ratio": (float, 0, 1000, "a ratio in (0, 1000]"),
    "swa-full-tokens-ratio": (float, 0, 1000, "a ratio in (0, 1000]"),
}
_BOOL_STRINGS = {"true", "false", "yes", "no", "on", "off"}


# Sane upper bounds: far above any real deployment, low enough that 2**70 GPUs or 1e30 GiB is an error,
# not a MemoryError (or a silently absurd plan) in a later stage.
MAX_GPUS_PER_NODE = 1024
MAX_PARALLEL = 1024           # tp, pp, attn_dp
MAX_NODES = 1024
MAX_GPU_MEMORY_GIB = 4096     # the largest GPUs today have under 300 GiB
MAX_CHECKPOINT_GIB = 1 << 20  # 1 PiB
MAX_TOKENS = 1 << 24          # benchmark and recall lengths: 16M tokens
MAX_LIST = 1000               # entries in a list of levels, lengths or depths
MAX_SECONDS = 7 * 24 * 3600


def unwrap(tp: Any) -> Any:
    """int / float / bool / str / "flag" / ("list", kind) / ("dict", kind) / ("model", cls) / "any" for an annotation."""
    origin = get_origin(tp)
    if origin is Annotated:
        return unwrap(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return unwrap(args[0]) if len(args) == 1 else "flag"
    if origin is Literal:
        return str
    if origin is list:
        return ("list", unwrap(get_args(tp)[0]))
    if origin is dict:
        return ("dict", unwrap(get_args(tp)[1]))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return ("model", tp)
    return tp if tp in (int, float, bool, str) else "any"


class Strict(BaseModel):
    """Every spec section: unknown keys refused, frozen, no inf/nan, no true/false for a number."""
    model_config = ConfigDict(extra="forbid", frozen=True, **FINITE)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, data: Any) -> Any:
        """pydantic reads true as 1 for an int field: `tp: yes` must not mean TP 1."""
        if isinstance(data, dict):
            for name, f in cls.model_fields.items():
                if isinstance(data.get(name), bool) and unwrap(f.annotation) in (int, float):
                    raise ValueError(f"{name}: must be a number, not true/false (got {data[name]!r})")
        return data


def check_flag_values(v: Any) -> Any:
    """A flags mapping's values, before pydantic reads them: one scalar each, finite, no quoted switch,
    the typed flags within their bounds."""
    if not isinstance(v, dict):
        return v
    for k, val in v.items():
        if isinstance(val, (dict, list)):
            raise ValueError(f"{k}: a flag takes one value (a string, number or true/false), not a {type(val).__name__}")
        if isinstance(val, float) and not math.isfinite(val):
            raise ValueError(f"{k}: {val} is not a finite number")
        if isinstance(val, str) and val.strip().lower() in _BOOL_STRINGS:
            raise ValueError(f"{k}: {val!r} is a quoted string, which SGLang would get as a value, not a switch: "
                             f"write {k}: true (unquoted) to set the switch, or false to leave it off")
        if isinstance(k, str) and k in TYPED_FLAGS and val is not None:
            typ, lo, hi, what = TYPED_FLAGS[k]
            ok_type = (is_int(val)) or (typ is float and isinstance(val, float))
            if not ok_type or not (lo <= val <= hi) or (typ is float and val == 0) or (typ is int and val == 0):
                raise ValueError(f"{k}: must be {what} (got {val!r})")
    return v


def check_flag_names(v: dict[str, FlagValue], owned: dict[str, str] | None = None, where: str = "serving.flags",
                     example: str = "kv-cache-dtype") -> dict[str, FlagValue]:
    """A flags mapping's names: lower-case with hyphens, none that another spec section owns (`owned`: name -> the
    section that sets it; default the server's)."""
    owned = _OWNED_FLAGS if owned is None else owned
    for k in v:
        if k.startswith("-") or not _FLAG_NAME.match(k):
            raise ValueError(f"{k!r}: write flags without leading dashes, lower-case with hyphens (e.g. {example})")
        if k in owned:
            raise ValueError(f"{k}: set it through {owned[k]}, not {where}")
    return v


def http_url(host: str, port: int) -> str:
    """http://HOST:PORT, an IPv6 literal in brackets."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


class SLO(Strict):
    ttft_ms_p99: float | None = Field(default=None, gt=0, le=MAX_SECONDS * 1000)
    tpot_ms_p99: float | None = Field(default=None, gt=0, le=MAX_SECONDS * 1000)
    e2e_ms_p99: float | None = Field(default=None, gt=0, le=MAX_SECONDS * 1000)
