"""The workloads known to `--workload`: every module of this package that defines `WORKLOAD` (found
at import, so adding a workload is adding its module), plus any registered at run time."""
from __future__ import annotations

import importlib
import pkgutil

from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import WorkloadType
from runbook.core.errors import InputError

WORKLOADS: dict[str, WorkloadType] = {}


def register(w: WorkloadType) -> WorkloadType:
    """Add a workload; ValueError when it breaks the contract."""
    why = contract_gaps(w)
    if why:
        raise ValueError(f"workload {w.name or type(w).__name__}: {'; '.join(why)}")
    if w.name in WORKLOADS and type(WORKLOADS[w.name]) is not type(w):
        raise ValueError(f"workload {w.name}: already registered by {type(WORKLOADS[w.name]).__module__}")
    if w.fallback and any(o.fallback and o.name != w.name for o in WORKLOADS.values()):
        raise ValueError(f"workload {w.name}: only one workload takes the values no other takes")
    WORKLOADS[w.name] = w
    return w


def contract_gaps(w: WorkloadType) -> list[str]:
    """What `w` lacks of the contract, and the settings it says it reads that are no BenchSettings field."""
    gaps = []
    if not w.name:
        gaps.append("no name")
    if not w.description.strip() or "\n" in w.description:
        gaps.append("needs a one-line description")
    if "workload" not in w.regression_key:
        gaps.append("its regression key must start from BASE_KEY (the workload itself at least)")
    if w.is_source == w.is_driver:
        gaps.append("needs exactly one of a request source (build) or a session driver (sessions)")
    unknown = [o for o in w.options if o not in BenchSettings.model_fields]
    if unknown:
        gaps.append(f"names no BenchSettings field: {', '.join(unknown)}")
    return gaps


def discover() -> list[str]:
    """Import this package's modules and register each one's WORKLOAD; the module names that had one."""
    package = importlib.import_module(__name__.rsplit(".", 1)[0])   # by name: no import cycle with the package
    found = []
    for m in pkgutil.iter_modules(package.__path__):
        mod = importlib.import_module(f"{package.__name__}.{m.name}")
        w = getattr(mod, "WORKLOAD", None)
        if isinstance(w, WorkloadType):
            register(w)
            found.append(m.name)
    return found


def check(o: BenchSettings) -> None:
    """What the run may do with the workload `o` selects, as the workload declares it, then the workload's own
    check of its settings: InputError with the fix."""
    wt = resolve(o.workload)
    wt.check(o)
    if o.find_max is not None and wt.own_load:
        raise InputError(f"{{find_max}} slo varies the load; {wt.own_load}, so it cannot be searched")
    if o.workers != 1 and wt.one_process:
        raise InputError(f"{{workers}} N splits fixed-concurrency levels of {{requests}} over N processes; {wt.one_process} "
                         "run in one process: drop {workers}")
    if o.compare_url and not wt.paired:
        unpaired = " or ".join(w.name for w in ordered() if not w.paired)
        raise InputError(f"{{compare_url}} runs the A/B comparison on single requests; it does not take the {unpaired} workloads")


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
    raise InputError(f"{{workload}} {ref}: not {'|'.join(named())}")


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
