"""The workloads known to `--workload`: every module of this package that defines `WORKLOAD` (found
at import, so adding a workload is adding its module), plus any registered at run time."""
from __future__ import annotations

import importlib
import pkgutil

from runbook.bench.workloads.base import WorkloadType
from runbook.core.errors import InputError

WORKLOADS: dict[str, WorkloadType] = {}


def register(w: WorkloadType) -> WorkloadType:
    """Add a workload; ValueError when it breaks the contract (tests also check its option names against
    BenchOptions, which imports this package)."""
    why = contract_gaps(w)
    if why:
        raise ValueError(f"workload {w.name or type(w).__name__}: {'; '.join(why)}")
    if w.name in WORKLOADS and type(WORKLOADS[w.name]) is not type(w):
        raise ValueError(f"workload {w.name}: already registered by {type(WORKLOADS[w.name]).__module__}")
    if w.fallback and any(o.fallback and o.name != w.name for o in WORKLOADS.values()):
        raise ValueError(f"workload {w.name}: only one workload takes the values no other takes")
    WORKLOADS[w.name] = w
    return w


def contract_gaps(w: WorkloadType, option_fields: set[str] | None = None) -> list[str]:
    """What `w` lacks of the contract; with `option_fields`, also the option names it declares that are no field."""
    gaps = []
    if not w.name:
        gaps.append("no name")
    if not w.description.strip() or "\n" in w.description:
        gaps.append("needs a one-line description")
    if "workload" not in w.regression_key:
        gaps.append("its regression key must start from BASE_KEY (the workload itself at least)")
    if w.is_source == w.is_driver:
        gaps.append("needs exactly one of a request source (build) or a session driver (sessions)")
    unknown = [o for o in (*w.options, *w.regression_key)
               if option_fields is not None and o not in option_fields and o not in ("workload", "corpus_version")]
    if unknown:
        gaps.append(f"names no BenchOptions field: {', '.join(unknown)}")
    return gaps


def discover() -> list[str]:
    """Import this package's modules and register each one's WORKLOAD; the module names that had one."""
    import runbook.bench.workloads as pkg

    found = []
    for m in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
        w = getattr(mod, "WORKLOAD", None)
        if isinstance(w, WorkloadType):
            register(w)
            found.append(m.name)
    return found


def ordered() -> list[WorkloadType]:
    return sorted(WORKLOADS.values(), key=lambda w: (w.fallback, w.order, w.name))


def resolve(ref: str | None) -> WorkloadType:
    """The workload a --workload value selects: by name, by prefix (trace:FILE), else the file workload."""
    ref = ref or ""
    for w in ordered():
        if not w.fallback and w.matches(ref):
            return w
    for w in WORKLOADS.values():
        if w.fallback:
            return w
    raise InputError(f"--workload {ref}: not {'|'.join(named())}")


def names() -> list[str]:
    """Registry keys, in help order."""
    return [w.name for w in ordered()]


def named() -> list[str]:
    """How each workload but the file one is written in --workload (trace:FILE)."""
    return [w.usage or w.name for w in ordered() if not w.fallback]


def help_text() -> str:
    """The --workload help line."""
    return " | ".join((w.usage or w.name) + (f" ({w.hint})" if w.hint else "") for w in ordered())


def describe() -> str:
    """One line per workload, for docs: how to select it, what it sends."""
    return "\n".join(f"- `{w.usage or w.name}`: {w.description}" for w in ordered())


def regression_key(*workload_refs: str | None) -> tuple[str, ...]:
    """The summary fields two runs must share to be compared: the union of their workloads' keys, in order."""
    out: list[str] = []
    for ref in workload_refs:
        for k in resolve(ref).regression_key:
            if k not in out:
                out.append(k)
    return tuple(out)
