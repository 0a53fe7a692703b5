"""Workloads (`--workload`), one module each in this package, found at import: random, code, longctx,
prefix, agentic (sessions), trace:FILE, and FILE (a JSON Lines prompt file). Each declares its
selection, description, options and their checks, regression key, and its request source or session
driver (base.WorkloadType); the registry (registry.py) resolves a --workload value to one. Request
lengths are measured with the model's tokenizer when one is given, otherwise approximated (~4
characters per token) and marked so.

Adding a workload: one module here defining `WORKLOAD = YourType()`, and its test."""
from __future__ import annotations

from typing import Any

from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BASE_KEY, BuildContext, LazyRequests, LevelLoad, Workload, WorkloadType
from runbook.bench.workloads.file import MAX_WORKLOAD_BYTES, read_workload_file
from runbook.bench.workloads.registry import (
    WORKLOADS,
    check,
    contract_gaps,
    describe,
    discover,
    help_text,
    names,
    ordered,
    register,
    regression_key,
    resolve,
)
from runbook.bench.workloads.trace import MAX_TRACE_LENGTH, SYNTHETIC_TRACE, TRACE_BLOCK, build_trace, read_trace
from runbook.corpus import code_prompts, code_text

discover()


def build(name: str, n: int, tokenizer: Any = None, vocab_size: int | None = None, ignore_eos: bool = True,
          **settings: Any) -> Workload:
    """n requests of the workload `name` selects (a request source's), under `settings` (BenchSettings fields:
    input_len, output_len, chat, seed, ...; the rest at their defaults)."""
    return resolve(name).build(BenchSettings(workload=name, **settings), n, BuildContext(tokenizer, vocab_size, ignore_eos))


__all__ = ["BASE_KEY", "MAX_TRACE_LENGTH", "MAX_WORKLOAD_BYTES", "SYNTHETIC_TRACE", "TRACE_BLOCK", "WORKLOADS", "BuildContext",
           "LazyRequests", "LevelLoad", "Workload", "WorkloadType", "build",
           "build_trace", "check", "code_prompts", "code_text", "contract_gaps", "describe", "discover", "help_text", "names", "ordered",
           "read_trace", "read_workload_file", "register", "regression_key", "resolve"]
