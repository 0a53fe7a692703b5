"""One launched candidate under load: the fixed levels (figures per context-length bucket) and the SLO
search's limit, through stage 40's own benchmark (bench.assess), with the energy drawn meanwhile."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runbook import bench
from runbook.core.spec import Deployment
from runbook.tune.energy import EnergyMeter


def tokenizer_dir(spec: Deployment) -> str | None:
    """A directory with tokenizer.json next to the model (a GGUF file's folder, a checkpoint, the model card)."""
    for p in (spec.model.path, spec.model.card):
        if not p:
            continue
        d = spec.resolve_path(p)
        d = d if d.is_dir() else d.parent
        if (d / "tokenizer.json").is_file():
            return str(d)
    return None


def bucket_of(tokens: int | None, bounds: list[int]) -> str | None:
    if tokens is None:
        return None
    lo = 0
    for b in bounds:
        if tokens <= b:
            return f"{_k(lo)}–{_k(b)}" if lo else f"≤{_k(b)}"
        lo = b
    return f">{_k(bounds[-1])}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def buckets(records: list[Any], bounds: list[int]) -> list[dict[str, Any]]:
    """TTFT and TPOT (p50, p99) and acceptance length per context-length bucket of the prompt tokens."""
    groups: dict[str, list[Any]] = {}
    for r in records:
        if r.ok:
            groups.setdefault(bucket_of(r.input_tokens, bounds) or "unknown", []).append(r)
    order = [bucket_of(b, bounds) for b in bounds] + [f">{_k(bounds[-1])}", "unknown"]
    out = []
    for name in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
        rs = groups[name]
        ttft, tpot = bench.stats(bench.ttft_s(r) for r in rs), bench.stats(bench.tpot_s(r) for r in rs)
        acc = [r.spec_accept_length for r in rs if r.spec_accept_length]
        out.append({"bucket": name, "requests": len(rs), "ttft_ms_p50": ttft["p50"], "ttft_ms_p99": ttft["p99"],
                    "tpot_ms_p50": tpot["p50"], "tpot_ms_p99": tpot["p99"],
                    "accept_length": round(sum(acc) / len(acc), 3) if acc else None})
    return out


def turns(records: list[Any]) -> list[dict[str, Any]]:
    """Per agentic turn index over every fixed level: requests, failed, TTFT p50 and the prefix-cache hit rate (the
    server's `cached_tokens` over prompt tokens, where it reports them): through a gateway, what its policy keeps of a
    session's prefix on one replica. [] for a workload without turns."""
    by: dict[int, list[Any]] = {}
    for r in records:
        t = r.meta.get("turn")
        if isinstance(t, int):
            by.setdefault(t, []).append(r)
    out = []
    for t in sorted(by):
        ok = [r for r in by[t] if r.ok]
        pairs = [(r.cached_tokens, r.input_tokens) for r in ok if r.cached_tokens is not None and r.input_tokens]
        hit = sum(c for c, _ in pairs) / sum(n for _, n in pairs) if pairs else None
        out.append({"turn": t, "requests": len(by[t]), "failed": len(by[t]) - len(ok),
                    "ttft_ms_p50": bench.stats(bench.ttft_s(r) for r in ok)["p50"],
                    "cache_hit_rate": None if hit is None else round(hit, 4)})
    return out


def per_request(levels: list[Any]) -> list[dict[str, Any]]:
    """Each successful request's output tok/s (its output tokens over its send-to-last-token time), keyed so that the
    same prompt pairs across candidates: level and request id, or level, session and turn (agentic sessions take ids in
    send order). `block`: requests of one level that ran side by side (a concurrency's width of ids or sessions) share
    the server's state, so they are one unit of the paired interval (tune/noise.py), as in stage 40's A/B."""
    out = []
    for lv in levels:
        width = max(1, lv.level.concurrency or 1)
        for r in lv.sound:
            e2e = bench.e2e_s(r)
            if not r.ok or not e2e or r.output_tokens <= 0:
                continue
            s, t = r.meta.get("session"), r.meta.get("turn")
            key, unit = (f"s{s}t{t}", s) if isinstance(s, int) and isinstance(t, int) else (str(r.id), r.id)
            out.append({"key": f"{lv.level.label}/{key}", "block": f"{lv.level.label}/{unit // width}",
                        "tok_s": round(r.output_tokens / e2e, 4)})
    return out


def _settings(spec: Deployment, url: str, **kw: Any) -> bench.BenchSettings:
    t = spec.tune
    given = dict(url=url, workload=t.workload, concurrency=list(t.concurrency), requests=t.requests_per_level, turns=t.turns,
                 input_len=t.input_len, output_len=t.output_len, tokenizer=tokenizer_dir(spec), warmup=1)
    return bench.BenchSettings.resolve(spec, **{**given, **kw})


def has_slo(slo: Any) -> bool:
    return slo is not None and any(getattr(slo, f"{m}_ms_p99", None) for m in ("ttft", "tpot", "e2e"))


def run(spec: Deployment, url: str, out: Path | None = None, nvml: Any = None, deadline: float | None = None) -> dict[str, Any]:
    """The candidate's benchmark figures: levels, buckets, throughput, the SLO limit, J per output token. The SLO
    search is left out once the candidate's time budget (`deadline`, monotonic) is spent."""
    t = spec.tune
    slo = t.slo or spec.slo
    cspec = spec.model_copy(update={"slo": slo})
    meter = EnergyMeter(nvml)
    meter.start()
    fixed = bench.assess(cspec, _settings(cspec, url, out=out))
    joules = meter.stop()
    recs = [r for lv in fixed.levels for r in lv.sound]     # every figure below, as the levels' own: no implausible record
    levels = [{k: lv.get(k) for k in ("label", "concurrency", "completed", "failed", "output_tok_s", "ttft_ms", "tpot_ms",
                                      "spec_accept_length_mean")} for lv in fixed.summary.get("levels", [])]
    out_tokens = sum(r.output_tokens for r in recs if r.ok)
    doc: dict[str, Any] = {"levels": levels, "buckets": buckets(recs, list(t.buckets)),
                           "output_tok_s": max((lv["output_tok_s"] or 0 for lv in levels), default=None),
                           "failed_requests": sum(lv["failed"] or 0 for lv in levels),
                           "j_per_token": round(joules / out_tokens, 4) if joules is not None and out_tokens else None,
                           "energy_skipped": meter.skipped, "findings": [f.to_dict() for f in fixed.findings],
                           "per_request": per_request(fixed.levels), "turns": turns(recs)}
    acc = [r.spec_accept_length for r in recs if r.ok and r.spec_accept_length]
    doc["accept_length"] = round(sum(acc) / len(acc), 3) if acc else None
    if t.slo_search and has_slo(slo) and (deadline is None or time.monotonic() < deadline):
        o = _settings(cspec, url, find_max="slo", find_max_levels=t.search_levels)
        search = bench.assess(cspec, o).summary.get("slo_search") or {}
        doc["slo_limit"] = search.get("limit") or 0
        doc["slo_search"] = {k: search.get(k) for k in ("metric", "limit", "first_miss", "resolved", "levels_tried")}
    else:
        doc["slo_limit"] = None
        doc["slo_search_skipped"] = ("no SLO to search against" if not has_slo(slo) else
                                     "the candidate's time budget was spent" if t.slo_search else "tune.slo_search is off")
    if t.warm_search and (deadline is None or time.monotonic() < deadline):
        o = _settings(cspec, url, find_max="warm", find_max_levels=max(t.search_levels, 2), concurrency=[1])   # from one up
        w = bench.assess(cspec, o).summary.get("warm_sessions") or {}
        doc["warm_sessions"] = {k: w.get(k) for k in ("knee_sessions", "first_cold", "predicted_sessions", "reached",
                                                       "resolved", "context_tokens", "eviction_policy", "levels")}
    return doc
