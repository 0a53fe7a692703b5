"""The server's own view of a level, beside ours: SGLang's Prometheus histograms and counters (`--enable-metrics`),
scraped before and after the level (bench/sweep.py), as deltas.

SGLang 0.5.23 (srt/observability/metrics_collector.py) observes, per finished request, in its HTTP process:
- `sglang:time_to_first_token_seconds`: its first token − the request's arrival at the tokenizer manager;
- `sglang:request_time_per_output_token_seconds`: (finished − first token) / (completion tokens − 1), our TPOT's
  definition on the server's clock;
- `sglang:inter_token_latency_seconds` (per token), `sglang:e2e_request_latency_seconds`;
- `sglang:queue_time_seconds`: time in the scheduler's waiting queue (a retracted request queues again);
and counts `sglang:num_retracted_requests_total`, `sglang:cached_tokens_total`, `sglang:prompt_tokens_total`.

Means are exact (Δ sum / Δ count); percentiles are Prometheus' `histogram_quantile` (linear within a bucket),
so only as fine as SGLang's buckets. Our TTFT contains the server's (the client sends before the server
receives, and the server stamps its first token before sending it), so ours is never below it by more than the
clocks' resolution; our TPOT and the server's measure the same span from both ends.
"""
from __future__ import annotations

import math
import re
from typing import Any

# our key -> the histogram's name without its prefix (any `prefix:` is accepted, as in telemetry)
HISTOGRAMS = {
    "ttft_ms": "time_to_first_token_seconds",
    "tpot_ms": "request_time_per_output_token_seconds",
    "itl_ms": "inter_token_latency_seconds",
    "e2e_ms": "e2e_request_latency_seconds",
    "queue_ms": "queue_time_seconds",
}
COUNTERS = {
    "requests": "num_requests_total",
    "retracted_requests": "num_retracted_requests_total",
    "aborted_requests": "num_aborted_requests_total",
    "prompt_tokens": "prompt_tokens_total",
    "generation_tokens": "generation_tokens_total",
    "cached_tokens": "cached_tokens_total",
}
PCTS = (50, 90, 99)
_LE = re.compile(r"(?:^|,)le=([^,]+)")


def _split(key: str) -> tuple[str, str]:
    """`sglang:x_bucket{a=1,le=0.5}` -> (`x_bucket`, `a=1,le=0.5`)."""
    name, _, labels = key.partition("{")
    return name.rsplit(":", 1)[-1], labels.rstrip("}")


def histogram_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, dict[str, Any]]:
    """Each histogram of HISTOGRAMS as its change over the level, summed over label sets (ranks, streaming or
    not): {name: {"buckets": [[le, cumulative count], …] by le, "sum": s, "count": n}}. A series first seen
    during the level counts from 0."""
    if not before or not after:
        return {}
    want = set(HISTOGRAMS.values())
    out: dict[str, dict[str, Any]] = {}
    for key, v in after.items():
        name, labels = _split(key)
        d = v - before.get(key, 0.0)
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and base in want:
                h = out.setdefault(base, {"buckets": {}, "sum": 0.0, "count": 0.0})
                if suffix == "_bucket":
                    m = _LE.search(labels)
                    if m:
                        le = float(m.group(1))
                        h["buckets"][le] = h["buckets"].get(le, 0.0) + d
                else:
                    h[suffix[1:]] += d
                break
    for h in out.values():
        h["buckets"] = [[le, n] for le, n in sorted(h["buckets"].items())]
    return out


def counter_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """COUNTERS' changes over the level, summed over label sets; a counter the server does not have is absent.
    SGLang creates `cached_tokens_total`'s series at the first cache hit (metrics_collector.py, `if cached_tokens >
    0`): a server that counts requests but shows no such series has cached nothing yet, 0, not unknown."""
    if not before or not after:
        return {}
    names = {v: k for k, v in COUNTERS.items()}
    out: dict[str, float] = {}
    for key, v in after.items():
        name, _ = _split(key)
        if name in names:
            out[names[name]] = out.get(names[name], 0.0) + v - before.get(key, 0.0)
    if "requests" in out:
        out.setdefault("cached_tokens", 0.0)
    return out


def quantile(buckets: list[list[float]], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative [le, count] buckets: linear within the bucket holding rank
    q·total (its lower bound 0 for the first); the highest finite bound when the rank is in the +Inf bucket."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lo_le, lo_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if math.isinf(le):
                return lo_le
            if n == lo_n:
                return le
            return lo_le + (le - lo_le) * (rank - lo_n) / (n - lo_n)
        lo_le, lo_n = le, n
    return lo_le


def figures(histograms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{our key: {"mean", "p50", "p90", "p99" (ms), "n"}} for each histogram that counted something."""
    out: dict[str, dict[str, Any]] = {}
    for key, name in HISTOGRAMS.items():
        h = histograms.get(name)
        if not h or h["count"] <= 0:
            continue
        n = int(round(h["count"]))
        row: dict[str, Any] = {"mean": h["sum"] / h["count"] * 1000}
        for p in PCTS:
            v = quantile(h["buckets"], p / 100)
            row[f"p{p}"] = None if v is None else v * 1000
        row["n"] = n
        out[key] = row
    return out


def level(server: dict[str, Any]) -> dict[str, Any] | None:
    """The level's server-side figures from sweep.server_deltas' result: latency figures (ms) and counters;
    None when the server exposes none of them (no /metrics, or not SGLang's)."""
    figs = figures(server.get("histograms") or {})
    counts = server.get("counters") or {}
    if not figs and not counts:
        return None
    out: dict[str, Any] = dict(figs)
    out.update({k: int(round(v)) for k, v in counts.items()})
    return out


# the rows of the side-by-side: (label, our summary key, server-side key)
BESIDE = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))


def beside(level_summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours beside the server's for one level: one row per metric with mean, p50 and p99 each way and the ratio
    of the means (ours / server's); [] when the level has no server-side figures."""
    srv = level_summary.get("server_side") or {}
    rows = []
    for label, key in BESIDE:
        s, o = srv.get(key), level_summary.get(key) or {}
        if not s or o.get("mean") is None:
            continue
        rows.append({"level": level_summary.get("label"), "metric": label,
                     "ours_mean_ms": o["mean"], "server_mean_ms": s["mean"],
                     "ours_p50_ms": o.get("p50"), "server_p50_ms": s.get("p50"),
                     "ours_p99_ms": o.get("p99"), "server_p99_ms": s.get("p99"),
                     "ratio_mean": o["mean"] / s["mean"] if s["mean"] else None,
                     "ours_n": o.get("n"), "server_n": s.get("n")})
    return rows
