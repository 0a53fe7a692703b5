"""The plan re-derived from what the log observed: the free memory when the weights began to load and the weights'
size, as SGLang logged them, through the kv package's own arithmetic (kv/memory.py). Beside the plan and the log
it tells a pool that is short because the arithmetic is off (a bug in this project's model of SGLang) from one
that is short because memory was not free at start (another process, a CUDA context, an offload engine) or the
weights took more than planned."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from runbook.core.errors import InputError
from runbook.core.units import GIB
from runbook.verify.logparse import Facts

ARITHMETIC_TOLERANCE = 0.01   # re-derived vs logged token pool: the log's GiB have two decimals; SGLang's own rounding
AS_PLANNED = 0.02             # logged pool within this of the plan: nothing to explain (compare.WARN_SHORT)


def observed_inputs(facts: Facts) -> dict[str, float] | None:
    """SGLang sizes the pool from the least free memory over the ranks (bootstrap.measure_pre_model_load_memory,
    kv_cache_configurator._profile_available_bytes take the minimum), so the minimum over ranks is read here too."""
    ranks = [w for w in facts.weights.values() if w.get("begin_avail_gib") is not None and w.get("avail_gib") is not None]
    if not ranks:
        return None
    free = min(w["begin_avail_gib"] for w in ranks)
    after = min(w["avail_gib"] for w in ranks)
    return {"free_before_weights_gib": free, "weights_gib": round(max(free - after, 0.0), 2)}


def replan(plan: Any, facts: Facts, gpu_mem_gib: float | None) -> dict[str, Any] | None:
    """`plan` is kv.plan_pools(spec) for the unit. None when the log lacks the inputs or the plan has no memory fraction."""
    obs = observed_inputs(facts)
    frac = getattr(getattr(plan, "result", None), "mem_fraction_static", None)
    if obs is None or frac is None or plan.inputs.kv_budget_gib is not None or obs["free_before_weights_gib"] <= 0:
        return None
    from runbook import kv

    inp = replace(plan.inputs, gpu_mem_gib=obs["free_before_weights_gib"], weights_bytes_per_gpu=int(obs["weights_gib"] * GIB),
                  mem_fraction_static=frac)
    try:
        r = kv.compute_pools(plan.arch, inp)   # kv/memory.py's own arithmetic, not a copy
    except InputError:
        return None
    not_free = round(gpu_mem_gib - obs["free_before_weights_gib"], 2) if gpu_mem_gib else None
    return {**obs, "gpu_memory_gib": gpu_mem_gib, "not_free_at_start_gib": not_free, "mem_fraction_static": frac,
            "max_total_num_tokens": r.max_total_num_tokens, "max_running_requests": r.max_running_requests,
            "max_state_slots": r.max_state_slots, "verdict": None}


def verdict(rp: dict[str, Any] | None, planned_weights_gib: float | None, logged_tokens: int | None,
            planned_tokens: int | None = None) -> tuple[str, str]:
    """(verdict, words): 'arithmetic_off' (the re-plan from the log's inputs misses what SGLang sized), else why the
    pool is short of the plan: 'memory_not_free' or 'weights_larger'; 'agrees' when nothing needs explaining.
    ('', '') without a re-plan."""
    if not rp or not rp.get("max_total_num_tokens") or not logged_tokens:
        return "", ""
    r, o = rp["max_total_num_tokens"], logged_tokens
    off = (r - o) / o
    inputs = (f"{rp['free_before_weights_gib']:.2f} GiB free when the weights began to load, weights {rp['weights_gib']:.2f} GiB, "
              f"--mem-fraction-static {rp['mem_fraction_static']:g}")
    if abs(off) > ARITHMETIC_TOLERANCE:
        return "arithmetic_off", (f"the arithmetic is off: from the log's own inputs ({inputs}) the plan gives {r:,} tokens, "
                                  f"SGLang sized {o:,} ({(o - r) / r:+.1%}): a bug in this project's model of SGLang, not the host "
                                  "(report it with this log)")
    not_free = rp.get("not_free_at_start_gib") or 0.0
    extra_weights = rp["weights_gib"] - planned_weights_gib if planned_weights_gib else 0.0
    agrees = f"from the log's own inputs ({inputs}) the plan gives {r:,} tokens, as SGLang did: the arithmetic is right"
    if planned_tokens and (planned_tokens - o) / planned_tokens <= AS_PLANNED:
        return "agrees", agrees
    if not_free > max(extra_weights, 0.0) and not_free > 0:
        return "memory_not_free", (f"memory was not free at start: {not_free:.2f} of {rp['gpu_memory_gib']:g} GiB per GPU were "
                                   "already taken when the weights began to load (another process, a CUDA context, an "
                                   f"offload engine; nvidia-smi lists them); {agrees}")
    if extra_weights > 0:
        return "weights_larger", f"the weights take {extra_weights:.2f} GiB per GPU more than planned; {agrees}"
    return "agrees", agrees
