"""Through a gateway: how the load spread over the replicas, from each replica's own /metrics, beside the client's
figures. The sweep scrapes every replica before and after each level (bench/sweep.py `run_level(replicas=...)`);
this module turns the two scrapes into the level's `replicas` rows.

SGLang 0.5.23 counts, per finished request, in its HTTP process (srt/observability/metrics_collector.py):
`sglang:num_requests_total`, `sglang:prompt_tokens_total`, `sglang:generation_tokens_total` and
`sglang:cached_tokens_total` (the server's own counters; bench/server_side.py's COUNTERS). A replica's share is its
Δ over the sum of every replica's Δ, so requests the gateway sent nowhere (failed before any replica) are not in the
denominator: the client's own count of requests and output tokens is shown beside the replicas' sum.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runbook.bench import server_side

# the row's counters, from server_side.COUNTERS' names
FIELDS = ("requests", "prompt_tokens", "generation_tokens", "cached_tokens")


def deltas(before: Mapping[str, dict[str, float] | None], after: Mapping[str, dict[str, float] | None]) -> dict[str, Any]:
    """{replica: {"counters": {...}, "scraped": bool}} from the scrapes before and after a level; a replica whose
    /metrics did not answer either time is `scraped: false` with no counters (a replica stopped mid-level)."""
    out: dict[str, Any] = {}
    for name in before.keys() | after.keys():
        b, a = before.get(name), after.get(name)
        out[name] = {"counters": server_side.counter_deltas(b, a) if b and a else {}, "scraped": bool(b and a)}
    return out


def rows(replicas: Mapping[str, str], measured: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per replica (in the spec's order): its counters over the level and its share of the replicas' requests
    and generated tokens (None where nothing was counted or the replica was not scraped)."""
    out: list[dict[str, Any]] = []
    for name, url in replicas.items():
        m = measured.get(name) or {}
        c = m.get("counters") or {}
        row: dict[str, Any] = {"name": name, "url": url, "scraped": bool(m.get("scraped"))}
        row.update({f: (int(round(c[f])) if f in c else None) for f in FIELDS})
        out.append(row)
    for key, share in (("requests", "request_share"), ("generation_tokens", "token_share")):
        total = sum(r[key] or 0 for r in out if r["scraped"])
        for r in out:
            r[share] = (r[key] or 0) / total if r["scraped"] and total > 0 else None
    return out


def beside(level_summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The replicas' sums beside the client's own figures for one level: requests the client completed and sent,
    output tokens it counted; None when the level read no replicas."""
    reps = level_summary.get("replicas")
    if not reps:
        return None
    scraped = [r for r in reps if r.get("scraped")]
    return {"replica_requests": sum(r.get("requests") or 0 for r in scraped),
            "replica_generation_tokens": sum(r.get("generation_tokens") or 0 for r in scraped),
            "client_requests": (level_summary.get("completed") or 0) + (level_summary.get("failed") or 0),
            "client_completed": level_summary.get("completed"),
            "client_output_tokens": level_summary.get("output_tokens"),
            "replicas_scraped": len(scraped), "replicas": len(reps)}
