"""Pure metric arithmetic: list[RequestRecord] -> one level's summary. One definition per metric.

- TTFT: first chunk carrying output (content or reasoning) − send time.
- E2E: last chunk carrying output − send time (the trailing usage chunk and [DONE] are not counted).
- TPOT (per request): (E2E − TTFT) / (output tokens − 1), output tokens from server usage when sent.
- Inter-chunk latency: the gaps between consecutive output chunks (one sample per gap).
- ITL (per token): each gap divided evenly over the tokens of the later chunk — one sample per token,
  so speculative decoding's multi-token chunks are not mistaken for slow tokens.
  Tokens per chunk come from the server's usage; a late count is spread over the chunks it covers
  (`count_source`: usage is exact, anything else is an approximation and the report says so).
- Throughput: output (and input+output) tokens of successful requests / measured window. The window
  runs from the first send to the moment the last measured request finished, where a request finishes
  at its last output chunk if it succeeded and when its error arrived if it failed (timeout, close,
  HTTP error, bad chunk) — whether or not it had streamed anything before.
- Goodput: successful requests meeting every SLO in the spec / window; attainment counts failures. A
  metric a request does not have (TPOT of a 1-token output) is not held against it — the same rule
  as the level's SLO check, whose p99 is over the requests that have the metric.
- Client queue: asked to send → request headers on the wire (waiting for a pooled connection); kept
  out of TTFT and reported apart.
- Implausible records (`judge`): what no server could have produced is named, by kind, and kept out of every figure.
Percentiles are numpy's linear interpolation.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runbook.core.numeric import is_int
from runbook.core.spec import level_meets_slo  # noqa: F401  (the level-wide rule, re-exported for the stage)
from runbook.endpoint.client import RequestRecord

PCTS = (50, 90, 95, 99)


def ttft_s(r: RequestRecord) -> float | None:
    return r.chunk_times[0] - r.send_time if r.chunk_times else None


def e2e_s(r: RequestRecord) -> float | None:
    return r.chunk_times[-1] - r.send_time if r.chunk_times else None


def tpot_s(r: RequestRecord) -> float | None:
    n = r.output_tokens
    if not r.chunk_times or n < 2:
        return None
    e2e, ttft = e2e_s(r), ttft_s(r)
    assert e2e is not None and ttft is not None  # both are set when chunk_times is non-empty
    return (e2e - ttft) / (n - 1)


def chunk_gaps_s(r: RequestRecord) -> list[float]:
    return [b - a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]


def itl_per_token_s(r: RequestRecord) -> list[float]:
    """Each gap over the tokens of the later chunk; a chunk credited 0 tokens passes its gap on."""
    out: list[float] = []
    acc = 0.0
    for gap, n in zip(chunk_gaps_s(r), r.chunk_tokens[1:], strict=False):
        acc += gap
        if n > 0:
            out += [acc / n] * n
            acc = 0.0
    return out


def stats(xs: Iterable[float | None], scale: float = 1000.0) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99, max (×scale: seconds → ms by default); None when empty."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    a = np.asarray([x for x in xs if x is not None], dtype=float) * scale
    keys = ["mean"] + [f"p{p}" for p in PCTS] + ["max", "n"]
    if a.size == 0:
        return {k: (0 if k == "n" else None) for k in keys}
    out: dict[str, float | None] = {"mean": float(a.mean())}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PCTS})
    out["max"] = float(a.max())
    out["n"] = int(a.size)
    return out


def finished_at(r: RequestRecord) -> float:
    """When the request's outcome was known: last output chunk of a success, the error's arrival of a failure."""
    if r.ok and r.chunk_times:
        return r.chunk_times[-1]
    return r.end_time if r.end_time is not None else (r.chunk_times[-1] if r.chunk_times else r.send_time)


def window_s(records: Sequence[RequestRecord]) -> float:
    if not records:
        return 0.0
    return max(finished_at(r) for r in records) - min(r.send_time for r in records)


def meets_slo(r: RequestRecord, slo: Any) -> bool:
    """Every SLO the spec sets, for one request; a metric the request does not have (TPOT of a
    1-token output) is not applicable and does not count as a miss."""
    if not r.ok:
        return False
    checks = [(getattr(slo, "ttft_ms_p99", None), ttft_s(r)), (getattr(slo, "tpot_ms_p99", None), tpot_s(r)),
              (getattr(slo, "e2e_ms_p99", None), e2e_s(r))]
    return all(limit is None or v is None or v * 1000 <= limit for limit, v in checks)


# A record this many times faster than its own level was not produced by the server: the 0.5 ms TTFTs a tune run once
# printed were ~350x under the server's 176 ms step. Batching and speculative chunks move a legitimate request's pace
# by a few times, never by this much; the prefill rule uses the same margin (see _prefill_rate).
IMPLAUSIBLE_FACTOR = 50.0
MIN_STEP_S = 0.001   # below a millisecond per token the client's own scheduling sets the pace (servers scripted to stream at once)
# A first token also needs at least the server's own round trip (HTTP, tokenizer, scheduler, one forward): never under
# 2 ms. Needed because a loaded step is no bound for a lone one: on a CI host under contention, a cached-prefix turn
# through the gateway came back sooner than 1/50 of the level's loaded decode step, and was sound. A prefill bound
# under it is the round trip's noise, not prefill, and is not judged.
MIN_TTFT_S = 0.002
# The kinds (`implausible[].kind`), in the order a record is judged: it is named by the first that fits, and by the
# prefill rate only when no other rule named it.
KINDS = ("order", "too_many", "prefill", "one_read")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _order(r: RequestRecord) -> str | None:
    """Timestamps in an order no stream has: a negative TTFT, E2E, gap or time to an error. A missing send time or a
    timestamp that is no number is named (no figure of it can be placed); no chunks or no end time (a failure) is
    only not judged by the rules that need them."""
    if not _finite(r.send_time):
        return f"its send time is {r.send_time!r}: no figure of it can be placed"
    if not all(map(_finite, r.chunk_times)) or (r.end_time is not None and not _finite(r.end_time)):
        return "a timestamp of its response is not a number"
    if (r.chunk_times and r.chunk_times[0] < r.send_time) or (r.end_time is not None and r.end_time < r.send_time):
        return "its response began before its request was sent"
    ct = r.chunk_times
    back = next((k for k, (a, b) in enumerate(zip(ct, ct[1:], strict=False), 1) if b < a), None)
    if back is not None:
        return (f"chunk {back + 1} arrived {(r.chunk_times[back - 1] - r.chunk_times[back]) * 1000:.2f} ms before "
                f"chunk {back}: a negative gap")
    return None   # an end before the last chunk is no figure's: a success ends at its last chunk (finished_at)


def _too_many(r: RequestRecord, lv: _Level) -> str | None:
    """The server's own count (final usage) over max_tokens; a client-side count (a re-tokenized text) is not judged."""
    n = (r.usage or {}).get("completion_tokens")
    if r.ok and r.max_tokens and is_int(n) and int(n) > r.max_tokens:
        return f"{n} tokens where {r.max_tokens} were asked for"
    return None


def _first_token(r: RequestRecord, lv: _Level) -> str | None:
    """Sooner than one forward: a cached prompt needs no prefill, so this bound stands whatever the cache held.
    The prompt's prefill is judged after every rule has run (_prefill_rate)."""
    ttft = ttft_s(r)
    if r.ok and lv.step is not None and ttft is not None and ttft * IMPLAUSIBLE_FACTOR < lv.step and ttft < MIN_TTFT_S:
        return (f"first token {ttft * 1000:.2f} ms after sending, under 1/{IMPLAUSIBLE_FACTOR:g} of one decode step "
                f"at this level ({lv.step * 1000:.1f} ms): too soon to have prefilled {r.input_tokens or '?'} tokens")
    return None


def _one_read(r: RequestRecord, lv: _Level) -> str | None:
    e2e = e2e_s(r)
    n = r.output_tokens
    if r.ok and lv.step is not None and e2e is not None and n > 1 and e2e * IMPLAUSIBLE_FACTOR < (n - 1) * lv.step:
        # since the send, not between chunks: a stream the server paced but the client read at once is sound
        return (f"all {r.output_tokens} tokens within {e2e * 1000:.2f} ms of sending, under 1/{IMPLAUSIBLE_FACTOR:g} "
                f"of the {r.output_tokens - 1} decode steps they need at this level ({lv.step * 1000:.1f} ms each)")
    return None


class _Level:
    """What the level's own records say the server can do. `step`: the upper quartile over the level's records of each
    one's median gap per token — it stays a sound request's while up to three in four records are too fast (the tune
    run's six of eight) or one in four waits out a retraction in its only gap. Not TPOT: a retracted request's TPOT
    holds its whole wait, and with a few of those in a level that stopped at EOS after two tokens, a sound two-token
    answer was 50 times "too fast". None (the pace rules off) under MIN_STEP_S or without a gap."""

    def __init__(self, records: Sequence[RequestRecord]) -> None:
        import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
        paces = [float(np.median(g)) for r in records if r.ok and (g := itl_per_token_s(r))]
        step = float(np.percentile(paces, 75)) if paces else None
        self.step = step if step is not None and step >= MIN_STEP_S else None


# After `order` (whose records the level's pace leaves out), judged in this order until one names the record: (kind,
# rule). A rule reads what it needs; a record that lacks it (no chunks, no usage, a failure) is not judged by it.
RULES: tuple[tuple[str, Callable[[RequestRecord, _Level], str | None]], ...] = (
    ("too_many", _too_many), ("prefill", _first_token), ("one_read", _one_read))


def _uncached(r: RequestRecord) -> int | None:
    """Prompt tokens the server had to prefill, where its usage says how many it served from its prefix cache."""
    n, c = r.input_tokens, r.cached_tokens
    return n - c if n is not None and c is not None and n > c else None


def _prefill_rate(records: Sequence[RequestRecord], lv: _Level) -> dict[int, str]:
    """First tokens sooner than the prompt's prefill at IMPLAUSIBLE_FACTOR times the level's own rate. The rate is the
    fastest (seconds per uncached token) of the level's other records that prefilled between half and twice as many
    tokens (a short prompt's TTFT is mostly the server's fixed cost; a long one's attention costs more per token), and
    that no other rule named (so the tune run's six of eight cannot vouch for each other). The fastest, not a
    quartile: a queue only slows a record, and a level where half the requests waited out a whole decode (SGLang under
    a small pool), or a rate past capacity, puts any quartile in the queue. Judged only where the server reports its
    cached tokens (a prompt served from the cache needs no prefill: warm-up caches the level's first prompts), while
    the pace rules are on (a server scripted to answer at once has no prefill to speak of), and on first tokens sooner
    than one of the level's decode steps: any prefill is at least one forward, so a slower one may be the lone request
    a server admitted while every other waited behind it, which no other record's rate bounds."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    rows: list[tuple[RequestRecord, int, float]] = []
    for r in records:
        n, t = _uncached(r), ttft_s(r)
        if r.ok and n and t is not None and t > 0:
            rows.append((r, n, t))
    if lv.step is None or len(rows) < 2:
        return {}
    rows.sort(key=lambda x: x[1])
    toks = np.array([x[1] for x in rows], dtype=float)
    per_tok = np.array([t / n for _, n, t in rows])
    lo, hi = np.searchsorted(toks, toks / 2, "left"), np.searchsorted(toks, toks * 2, "right")
    here = np.arange(len(rows))
    best = np.minimum(_range_min(per_tok, lo, here), _range_min(per_tok, here + 1, hi))   # the record itself left out
    out: dict[int, str] = {}
    for (r, n, t), ref, refs in zip(rows, best, hi - lo - 1, strict=True):
        need = n * ref / IMPLAUSIBLE_FACTOR
        if refs and need > MIN_TTFT_S and t < need and t < lv.step:
            out[r.id] = (f"first token {t * 1000:.2f} ms after sending, too soon to have prefilled its {n} uncached tokens: "
                         f"the fastest of the {refs} other records at this level with half to twice as many took "
                         f"{ref * 1000:.3f} ms per token, and at {IMPLAUSIBLE_FACTOR:g} times that rate they take {need * 1000:.1f} ms")
    return out


def _range_min(a: Any, lo: Any, hi: Any) -> Any:
    """min(a[lo[i]:hi[i]]) for each i, inf where the range is empty."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    ext = np.append(a, np.inf)
    idx = np.empty(2 * len(lo), dtype=np.intp)
    idx[0::2], idx[1::2] = lo, np.maximum(lo, hi)
    got = np.minimum.reduceat(ext, idx)[0::2]
    return np.where(hi > lo, got, np.inf)


def judge(records: Sequence[RequestRecord]) -> dict[int, tuple[str, str]]:
    """Records the server could not have produced, id -> (kind, why), each of KINDS judged against its own level: a
    timestamp order no stream has (`order`), more tokens than asked for (`too_many`), a first token sooner than one
    forward or than the prompt's prefill (`prefill`), every token sooner after the send than the decode steps they need
    (`one_read`). The level's pace is read from the records whose timestamps are in order."""
    out = {r.id: ("order", why) for r in records if (why := _order(r))}
    rest = [r for r in records if r.id not in out]
    lv = _Level(rest)
    for r in rest:
        got = next(((k, w) for k, rule in RULES if (w := rule(r, lv))), None)
        if got:
            out[r.id] = got
    out.update((i, ("prefill", why)) for i, why in _prefill_rate([r for r in rest if r.id not in out], lv).items())
    return out


def implausible(records: Sequence[RequestRecord]) -> dict[int, str]:
    """judge(), id -> why."""
    return {i: why for i, (_, why) in judge(records).items()}


def sound(records: Sequence[RequestRecord], named: Iterable[dict[str, Any]]) -> list[RequestRecord]:
    """The records every figure is computed from: all but those a level's summary names (its `implausible`)."""
    bad = {b["id"] for b in named}
    return [r for r in records if r.id not in bad]


def summarise(records: Sequence[RequestRecord], slo: Any = None) -> dict[str, Any]:
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    bad = judge(records)
    records = [r for r in records if r.id not in bad]
    ok = [r for r in records if r.ok]
    win = window_s(records)
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.input_tokens or 0 for r in ok)
    client_tok = sum(r.output_tokens_client for r in ok)
    reasoning = sum(int((r.usage or {}).get("reasoning_tokens") or 0) for r in ok)
    errors: dict[str, int] = {}
    for r in records:
        if r.error_kind:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    chunks = sum(len(r.chunk_times) for r in ok)
    good = sum(1 for r in records if meets_slo(r, slo)) if slo is not None else None
    s: dict[str, Any] = {
        "completed": len(ok), "failed": len(records) - len(ok), "error_rate": (len(records) - len(ok)) / len(records) if records else 0.0,
        "errors": errors, "window_s": win,
        "output_tokens": out_tok, "output_tokens_client": client_tok, "output_token_discrepancy": out_tok - client_tok,
        "input_tokens": in_tok, "reasoning_tokens": reasoning,
        "output_tok_s": out_tok / win if win > 0 else 0.0, "total_tok_s": (in_tok + out_tok) / win if win > 0 else 0.0,
        "request_s": len(ok) / win if win > 0 else 0.0,
        "ttft_ms": stats(ttft_s(r) for r in ok), "tpot_ms": stats(tpot_s(r) for r in ok),
        "itl_ms": stats(x for r in ok for x in itl_per_token_s(r)),
        "inter_chunk_ms": stats(x for r in ok for x in chunk_gaps_s(r)), "e2e_ms": stats(e2e_s(r) for r in ok),
        "tokens_per_chunk": out_tok / chunks if chunks else None,
        "spec_accept_length_mean": (float(np.mean(acc)) if (acc := [r.spec_accept_length for r in ok if r.spec_accept_length]) else None),
        "count_sources": sorted({r.count_source for r in ok}),
        "server_counted": all(r.usage is not None and isinstance(r.usage.get("completion_tokens"), int) for r in ok),
        "itl_exact": all(r.count_source == "usage" for r in ok),
        "client_queue_ms": stats(r.queue_s for r in records),
        "implausible": [{"id": i, "kind": kind, "why": why} for i, (kind, why) in sorted(bad.items())],
    }
    if good is not None:
        s["goodput_req_s"] = good / win if win > 0 else 0.0
        s["slo_attainment"] = good / len(records) if records else 0.0
    return s
