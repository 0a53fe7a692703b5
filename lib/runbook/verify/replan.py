"""The plan re-derived from what the log observed: the free memory when the weights began to load and the weights'
size, as SGLang logged them, through the kv package's own arithmetic (kv/memory.py). Beside the plan and the log
it tells a pool that is short because the arithmetic is off (a bug in this project's model of SGLang) from one
that is short because memory was not free at start (another process, a CUDA context, an offload engine) or the
weights took more than planned."""
from __future__ import annotations

from typing import Any

from runbook import kv
from runbook.core.errors import InputError
from runbook.core.units import GIB
from runbook.verify.logparse import Facts

ARITHMETIC_TOLERANCE = 0.01   # re-derived vs logged token pool: the log's GiB have two decimals; SGLang's own rounding
AS_PLANNED = 0.02             # logged pool within this of the plan: nothing to explain (compare.WARN_SHORT)
# On CPU the pool comes from the host's free memory as SGLang's scheduler reads it once more after the weights,
# unlogged, while SGLang's own tokenizer manager and detokenizer are still starting beside it and other processes
# take or free memory: the log's readings bound the re-plan, not a relative tolerance. Measured on a 24 GiB host
# shared with other work: from 137 MiB less to 115 MiB more free at that reading than at the log's last.
CPU_UNLOGGED_GIB = 0.25
CPU_ROUNDING_GIB = 0.01       # two readings of the log, each to 0.005 GiB


def observed_inputs(facts: Facts) -> dict[str, float] | None:
    """SGLang sizes the pool from the least free memory over the ranks (bootstrap.measure_pre_model_load_memory,
    kv_cache_configurator._profile_available_bytes take the minimum), so the minimum over ranks is read here too."""
    ranks = [{**w, "before": _free_before(w)} for w in facts.weights.values() if w.get("avail_gib") is not None]
    ranks = [w for w in ranks if w["before"] is not None]
    if not ranks:
        return None
    free = min(w["before"] for w in ranks)
    after = min(w["avail_gib"] for w in ranks)
    begin = all(w.get("begin_avail_gib") is not None for w in ranks)
    return {"free_before_weights_gib": free, "weights_gib": round(max(free - after, 0.0), 2),
            "free_before_from": "Load weight begin" if begin else "Load weight end (avail mem + mem usage)"}


def _free_before(w: dict[str, Any]) -> float | None:
    """Free memory when the weights began to load: the `Load weight begin` line, else (older SGLang logs carry
    none) the `Load weight end` line's avail mem plus its mem usage, which SGLang computes as their difference."""
    if w.get("begin_avail_gib") is not None:
        return float(w["begin_avail_gib"])
    if w.get("usage_gib") is not None:
        return round(float(w["avail_gib"]) + float(w["usage_gib"]), 2)
    return None


def replan(plan: Any, facts: Facts, gpu_mem_gib: float | None, cpu: bool = False) -> dict[str, Any] | None:
    """`plan` is kv.assess(spec) for the unit. None when the log lacks the inputs or the plan has no memory fraction.
    `cpu`: SGLang runs with --device cpu, where the memory is the host's and no GPU's size applies."""
    obs = observed_inputs(facts)
    frac = getattr(getattr(plan, "result", None), "mem_fraction_static", None)
    if obs is None or frac is None or plan.inputs.kv_budget_gib is not None or obs["free_before_weights_gib"] <= 0:
        return None
    try:
        inp = plan.inputs.but(gpu_mem_gib=obs["free_before_weights_gib"], weights_bytes_per_gpu=int(obs["weights_gib"] * GIB),
                              mem_fraction_static=frac)
        r = kv.compute_pools(plan.arch, inp)   # kv/memory.py's own arithmetic, not a copy
    except InputError:
        return None
    if cpu:
        gpu_mem_gib = None
    not_free = round(gpu_mem_gib - obs["free_before_weights_gib"], 2) if gpu_mem_gib else None
    return {**obs, "gpu_memory_gib": gpu_mem_gib, "not_free_at_start_gib": not_free, "mem_fraction_static": frac,
            "max_total_num_tokens": r.max_total_num_tokens, "max_running_requests": r.max_running_requests,
            "max_state_slots": r.max_state_slots, "kv_bytes_per_token": r.kv_bytes_per_token_per_gpu, "cpu": cpu,
            "verdict": None}


def cpu_bounds(rp: dict[str, Any]) -> tuple[int, int] | None:
    """The token pools a CPU server can size from the log's readings: the re-plan give or take what the unlogged
    reading may differ by and the readings' rounding."""
    r, cell = rp.get("max_total_num_tokens"), rp.get("kv_bytes_per_token")
    if not rp.get("cpu") or not r or not cell:
        return None
    slack = int((CPU_UNLOGGED_GIB + CPU_ROUNDING_GIB) * GIB // cell)
    return max(0, r - slack), r + slack


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
    bounds = cpu_bounds(rp)
    if bounds is not None:
        lo, hi = bounds
        mib = (r - o) * rp["kv_bytes_per_token"] / 2**20
        if lo <= o <= hi:
            return "agrees", (f"from the log's own inputs ({inputs}) the plan gives {r:,} tokens and SGLang sized {o:,}: on CPU it "
                              f"reads the host's free memory once more after the weights (unlogged), {mib:.0f} MiB "
                              f"{'less' if mib >= 0 else 'more'} than the log's last reading; the arithmetic is right")
        return "arithmetic_off", (f"the arithmetic is off: from the log's own inputs ({inputs}) the plan gives {r:,} tokens, "
                                  f"SGLang sized {o:,} ({mib:.0f} MiB apart; on CPU its unlogged reading after the weights "
                                  f"explains {lo:,}-{hi:,}): a bug in this project's model of SGLang, or more memory taken or "
                                  "freed by other processes during start-up than is usual (report it with this log)")
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
        return "memory_not_free", (f"memory was not free at start: {not_free:.2f} of {rp['gpu_memory_gib']:.2f} GiB per GPU were "
                                   "already taken when the weights began to load (another process, a CUDA context, an "
                                   f"offload engine; nvidia-smi lists them); {agrees}")
    if extra_weights > 0:
        return "weights_larger", f"the weights take {extra_weights:.2f} GiB per GPU more than planned; {agrees}"
    return "agrees", agrees
