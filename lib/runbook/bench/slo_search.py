"""`--find-max slo`: the highest load meeting the spec's SLOs, by bracketing then bisecting the concurrency (or
rate), one measured level at a time; its findings."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from runbook.bench import metrics
from runbook.bench.settings import BenchSettings
from runbook.bench.sweep import Level
from runbook.core.findings import Finding, Status

SLO_SEARCH_MAX_ERROR = 0.01       # a level failing more requests than this does not meet the SLOs
SLO_SEARCH_RATE_STEP = 0.10       # rate searches stop when the bracket is this narrow (relative)
SLO_SEARCH_MAX = {"concurrency": 4096.0, "rate": 100000.0}


def level_meets(s: dict[str, Any], slo: Any) -> bool:
    """The search's rule: the level's SLO check (bench.slo: each metric's p99 within its limit) and at
    most 1% of requests failed."""
    return metrics.level_meets_slo(s, slo) and float(s.get("error_rate") or 0.0) <= SLO_SEARCH_MAX_ERROR


async def highest(at: Callable[[float], Awaitable[bool]], start: float, bound: float, max_levels: int,
                  integer: bool = True) -> tuple[float, float | None, bool]:
    """The highest load `at` passes: bracket by doubling from `start` until a level fails (or `bound`), then bisect
    between the last that passed and the first that failed — to one (integer), or 10% — within `max_levels` calls
    of `at`. (last passed or 0, first failed or None, whether the bracket closed.) Assumes passing falls as load rises."""
    tried = 0

    async def check(v: float) -> bool:
        nonlocal tried
        tried += 1
        return await at(v)

    lo, hi = 0.0, None
    v = start
    while tried < max_levels:
        if not await check(v):
            hi = v
            break
        lo = v
        if v >= bound:
            break
        v = min(bound, v * 2)
    while hi is not None and tried < max_levels:
        if integer:
            if hi - lo <= 1:
                break
            mid = float((int(lo) + int(hi)) // 2) if lo else float(int(hi) // 2)
            if mid < 1:
                break
        else:
            if lo and hi / lo <= 1 + SLO_SEARCH_RATE_STEP:
                break
            mid = (lo + hi) / 2 if lo else hi / 2
        if await check(mid):
            lo = mid
        else:
            hi = mid
    resolved = hi is not None and ((hi - lo <= 1) if integer else bool(lo) and hi / lo <= 1 + SLO_SEARCH_RATE_STEP)
    return lo, hi, bool(resolved)


async def slo_search(measure: Any, o: BenchSettings, slo: Any) -> dict[str, Any]:
    """The highest load meeting the SLOs: bracket by doubling from the start (the first --concurrency
    or --rate, else concurrency 1) until a level misses, then bisect between the last level that met
    them and the first that missed — to one request of concurrency, or 10% of rate — with at most
    `find_max_levels` levels in all. Assumes attainment falls as load rises."""
    metric = "rate" if o.rates else "concurrency"
    integer = metric == "concurrency"
    start = float(min(o.rates)) if o.rates else float(min(o.concurrency) if o.concurrency else 1)
    tried: list[dict[str, Any]] = []

    async def at(v: float) -> bool:
        lv = Level(f"c{int(v)}", concurrency=int(v)) if integer else Level(f"r{v:g}", rate=v)
        s = await measure(lv)
        ok = level_meets(s, slo)
        tried.append({metric: int(v) if integer else v, "label": lv.label, "meets_slo": ok,
                      "slo_attainment": s.get("slo_attainment"), "goodput_req_s": s.get("goodput_req_s"),
                      "error_rate": s.get("error_rate"), "ttft_ms_p99": s["ttft_ms"]["p99"], "tpot_ms_p99": s["tpot_ms"]["p99"]})
        return ok

    lo, hi, resolved = await highest(at, start, SLO_SEARCH_MAX[metric], o.find_max_levels, integer)
    limit: float | None = (int(lo) if integer else lo) if lo else None
    return {"metric": metric, "limit": limit, "levels_tried": tried,
            "first_miss": (int(hi) if integer else hi) if hi is not None else None,
            "resolved": bool(resolved), "max_levels": o.find_max_levels,
            "slo": {k: getattr(slo, k, None) for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")},
            "rule": "each SLO metric's p99 within its limit and at most 1% of requests failed"}


def slo_search_findings(r: dict[str, Any]) -> list[Finding]:
    unit = "concurrent requests" if r["metric"] == "concurrency" else "requests/s"
    around = ", ".join(f"{t['label']} {'meets' if t['meets_slo'] else 'misses'}" for t in
                       sorted(r["levels_tried"], key=lambda t: t[r["metric"]]))
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in r["slo"].items() if v)
    if r["limit"] is None:
        return [Finding("bench.slo_search", "fail", f"no load meets the SLOs (first level tried missed: {around.split(',')[0]})",
                        detail=f"{slo}; {r['rule']}", remedy="Revisit the deployment's flags, or the SLOs.")]
    st: Status = "pass" if r["resolved"] else "warn"
    how = (f"first miss at {r['first_miss']:g}" if r["first_miss"] is not None else
           "no level tried missed (the search hit its bound)")
    return [Finding("bench.slo_search", st, f"max load under SLO: {r['limit']:g} {unit} ({how})",
                    detail=f"{slo}; levels tried: {around}" + ("" if r["resolved"] else
                                                             f"; not resolved within {r['max_levels']} levels"))]

