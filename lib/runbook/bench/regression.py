"""The regression check: this run against the previous archived run of the same deployment, like with like only."""
from __future__ import annotations

from typing import Any

from runbook.bench import workloads
from runbook.core.findings import Finding

ERROR_RATE_SLACK = 0.01          # error rate up by more than 1 point: a regression
LENGTH_TOLERANCE = 0.05          # mean output (or input) tokens per request differing by more: other work


def compare_previous(current: dict[str, Any], previous: dict[str, Any] | None, threshold_pct: float) -> list[Finding]:
    """Regressions against the previous archived run of the same deployment, like with like only: the
    same workload, corpus version, lengths, chat mode, session shape and trace speed for the run, and per level the same level with
    the same measured mean input and output lengths. Throughput, TPOT p50, TTFT p50/p99 and the error
    rate are compared; a level failing more requests than before is a regression even when its
    remaining requests are fast."""
    if not previous or not previous.get("levels"):
        return [Finding("bench.regression", "info", "no previous benchmark of this deployment to compare with")]
    # each workload declares its key (workloads/*.py); both runs' keys, so another workload's fields show too
    like = workloads.regression_key(previous.get("workload"), current.get("workload"))
    differ = [k for k in like if previous.get(k, _DEFAULTS.get(k)) != current.get(k, _DEFAULTS.get(k))]
    if differ:
        return [Finding("bench.regression", "skip", "previous run measured different work: not compared",
                        detail="; ".join(f"{k}: {previous.get(k)!r} then, {current.get(k)!r} now" for k in differ),
                        remedy="Compare runs with the same workload and corpus version; the next run compares with this one.")]
    prev = {(p.get("concurrency"), p.get("rate")): p for p in previous["levels"]}
    out: list[Finding] = []
    compared, skipped = 0, []
    for s in current.get("levels", []):
        p = prev.get((s.get("concurrency"), s.get("rate")))
        if not p:
            continue
        why = _unlike(p, s)
        if why:
            skipped.append(f"{s['label']}: {why}")
            continue
        compared += 1
        out += _level_regressions(p, s, threshold_pct)
    out += _slo_limit_regression(previous.get("slo_search") or {}, current.get("slo_search") or {}, threshold_pct)
    if skipped:
        out.append(Finding("bench.regression.unlike", "info", f"{len(skipped)} level(s) not compared: other work than the previous run",
                           detail="; ".join(skipped)))
    if not compared:
        return out or [Finding("bench.regression", "skip", "no level of the previous run matches this run's levels: not compared")]
    return out or [Finding("bench.regression", "pass", f"no regression beyond {threshold_pct:g}% against the previous run")]


def _level_regressions(p: dict[str, Any], s: dict[str, Any], threshold_pct: float) -> list[Finding]:
    """One level against the same level of the previous run: its error rate, then (when requests completed)
    output throughput, TPOT p50 and TTFT p50/p99."""
    out: list[Finding] = []
    tag = s["label"]
    pe, ce = float(p.get("error_rate") or 0.0), float(s.get("error_rate") or 0.0)
    if ce > pe + ERROR_RATE_SLACK:
        out.append(Finding(f"bench.regression.errors.{tag}", "fail" if ce > 0.05 else "warn",
                           f"{tag}: {ce:.0%} of requests failed, {pe:.0%} in the previous run",
                           detail=", ".join(f"{k}: {v}" for k, v in (s.get("errors") or {}).items()),
                           remedy="Read the failed records (error_kind, error) and the server log."))
    if not s.get("completed"):
        return out
    if p.get("output_tok_s") and s.get("output_tok_s") is not None:
        drop = (p["output_tok_s"] - s["output_tok_s"]) / p["output_tok_s"] * 100
        if drop > threshold_pct:
            out.append(Finding(f"bench.regression.{tag}", "warn", f"{tag}: output throughput down {drop:.0f}% since the previous run",
                               detail=f"{p['output_tok_s']:.1f} → {s['output_tok_s']:.1f} tok/s",
                               remedy="Diff the service unit and environment between the runs."))
    for key, pct, name in (("tpot_ms", "p50", "TPOT p50"), ("ttft_ms", "p50", "TTFT p50"), ("ttft_ms", "p99", "TTFT p99")):
        pt, ct = (p.get(key) or {}).get(pct), (s.get(key) or {}).get(pct)
        if pt and ct and (ct - pt) / pt * 100 > threshold_pct:
            kind = key.split("_")[0] + ("" if pct == "p50" else "_" + pct)
            out.append(Finding(f"bench.regression.{kind}.{tag}", "warn", f"{tag}: {name} up {(ct - pt) / pt * 100:.0f}%",
                               detail=f"{pt:.1f} → {ct:.1f} ms"))
    return out


def _slo_limit_regression(ps: dict[str, Any], cs: dict[str, Any], threshold_pct: float) -> list[Finding]:
    """The SLO search's limit against the previous run's, when both searched the same metric under the same SLO."""
    if ps.get("metric") and ps.get("metric") == cs.get("metric") and ps.get("slo") == cs.get("slo"):
        pl, cl = ps.get("limit"), cs.get("limit")
        if pl and (cl is None or (pl - cl) / pl * 100 > threshold_pct):
            return [Finding("bench.regression.slo_limit", "warn",
                            f"max load under SLO down: {pl:g} then, {cl if cl is not None else 'none'} now ({cs['metric']})",
                            remedy="Diff the service unit and environment between the runs.")]
    return []


_DEFAULTS: dict[str, Any] = {"range_ratio": 0.0}


def _unlike(p: dict[str, Any], s: dict[str, Any]) -> str:
    """Why two levels measured different work (mean lengths per successful request), or ''."""
    for key, name in (("output_tokens", "output"), ("input_tokens", "input")):
        pn, cn = p.get(key), s.get(key)
        pc, cc = p.get("completed") or 0, s.get("completed") or 0
        if not (isinstance(pn, (int, float)) and isinstance(cn, (int, float)) and pc and cc):
            continue
        pm, cm = pn / pc, cn / cc
        if max(pm, cm) > 0 and abs(pm - cm) / max(pm, cm) > LENGTH_TOLERANCE:
            return f"mean {name} {pm:.0f} then, {cm:.0f} now tokens per request"
    return ""

