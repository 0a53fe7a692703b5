"""Speculative decoding judged on real text against random tokens (pure: no HTTP; speculation_study.py sends the requests).

Per corpus kind and context-length bucket, from the same prompts sent to a server that speculates and to the same
server with speculation off:

- acceptance: accepted ÷ drafted draft tokens, summed over the bucket's requests, from llama-server's per-request
  `timings` (`draft_n`, `draft_n_accepted`; llama-server leaves both out of a request that drafted nothing);
- accept length: llama.cpp's own mean accepted length, 1 + accepted ÷ verification steps, where the server's
  `/metrics` (llama-server `--metrics`) counted the bucket's steps; else None;
- tokens per target pass: output tokens ÷ (output tokens − accepted), each accepted draft token having saved one pass;
- decode tok/s: (output tokens − 1) ÷ (E2E − TTFT) summed over the bucket (stage 40's TPOT, inverted), with and
  without speculation, and the speed-up: their ratio, with a paired bootstrap interval over the prompts
  (each prompt's own ratio, on the log scale).

Random-token prompts give an n-gram drafter nothing to copy and a draft model nothing to predict, which is why the
story's "no gain" on them says little about real prompts; the verdict puts the two side by side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runbook.core.findings import Finding
from runbook.core.numeric import is_int
from runbook.endpoint.records import RequestRecord

KINDS = ("code", "agentic", "random")      # what speculation_study.py can send
REAL = ("code", "agentic")                 # real text; `random` is the control
MAX_DRAFT_PER_TOKEN = 1024                 # llama.cpp caps every drafter's n_max at 1024: more per output token is absurd


@dataclass(frozen=True)
class DraftCounts:
    """One request's draft counters, checked: accepted ≤ drafted, accepted < output tokens."""
    drafted: int
    accepted: int
    predicted: int



def draft_counts(timings: Any) -> tuple[DraftCounts | None, str | None]:
    """The request's counters, or None and one line saying why they cannot be used. A `timings` without `draft_n`
    is a request that drafted nothing (llama-server omits both counters then)."""
    if not isinstance(timings, dict):
        return None, "no `timings` object in the response (llama-server sends it on the last chunk)"
    predicted = timings.get("predicted_n")
    if not is_int(predicted) or predicted < 0:
        return None, f"timings.predicted_n is {predicted!r}, not a count"
    if "draft_n" not in timings and "draft_n_accepted" not in timings:
        return DraftCounts(0, 0, predicted), None
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not is_int(drafted) or not is_int(accepted):
        return None, f"timings.draft_n {drafted!r} / draft_n_accepted {accepted!r} are not both integers"
    if drafted < 0 or accepted < 0:
        return None, f"negative draft counters (draft_n {drafted}, draft_n_accepted {accepted})"
    if accepted > drafted:
        return None, f"draft_n_accepted {accepted} exceeds draft_n {drafted}"
    if accepted and accepted >= predicted:
        return None, f"draft_n_accepted {accepted} is not below predicted_n {predicted} (each accepted token is an output token)"
    if drafted > MAX_DRAFT_PER_TOKEN * max(1, predicted):
        return None, f"draft_n {drafted} for {predicted} output tokens is more than any drafter's limit allows"
    return DraftCounts(drafted, accepted, predicted), None


def decode_time(r: RequestRecord) -> tuple[int, float] | None:
    """(output tokens − 1, E2E − TTFT) of a successful request with two or more output tokens, else None."""
    n = r.output_tokens
    if not r.ok or len(r.chunk_times) < 1 or n < 2:
        return None
    span = r.chunk_times[-1] - r.chunk_times[0]
    return (n - 1, span) if span > 0 else None


def tok_s(records: list[RequestRecord]) -> float | None:
    """Decode tokens per second over the records: Σ(output − 1) ÷ Σ(E2E − TTFT)."""
    parts = [d for d in map(decode_time, records) if d]
    t = sum(s for _, s in parts)
    return sum(n for n, _ in parts) / t if t > 0 else None


def speedup_interval(spec: list[RequestRecord], base: list[RequestRecord]) -> tuple[float, float, float] | None:
    """Each prompt's speed-up (its decode rate with ÷ without speculation, paired by request id): the geometric mean
    with a 95 % bootstrap interval; None with fewer than two pairs."""
    from runbook.core.stats import bootstrap_ci  # lazy: numpy only when a bucket has pairs

    def rate(r: RequestRecord) -> float | None:
        d = decode_time(r)
        return d[0] / d[1] if d else None

    by_id = {r.id: rate(r) for r in base}
    logs = [math.log(a / b) for r in spec if (a := rate(r)) and (b := by_id.get(r.id))]
    if len(logs) < 2:
        return None
    mean, lo, hi = bootstrap_ci(logs)
    return math.exp(mean), math.exp(lo), math.exp(hi)


def metric_counts(deltas: dict[str, float] | None) -> dict[str, float]:
    """The speculative counters from one bucket's /metrics deltas (llama-server's names, any prefix)."""
    names = {"spec_decode_num_draft_tokens_total": "drafted", "spec_decode_num_accepted_tokens_total": "accepted",
             "spec_decode_num_drafts_total": "steps"}
    out: dict[str, float] = {}
    for k, v in (deltas or {}).items():
        bare = k.split("{")[0].split(":")[-1]
        if bare in names and isinstance(v, (int, float)) and math.isfinite(v):
            out[names[bare]] = float(v)
    return out


def bucket_row(kind: str, context: int, spec: list[RequestRecord], base: list[RequestRecord],
               deltas: dict[str, float] | None = None) -> tuple[dict[str, Any], list[str]]:
    """One (kind, context) bucket's figures and the one-line problems met in its responses."""
    problems: list[str] = []
    counts: list[DraftCounts] = []
    for r in spec:
        if not r.ok:
            problems.append(f"request {r.id}: {r.error_kind}: {r.error}")
            continue
        c, why = draft_counts(r.timings)
        if c is None:
            problems.append(f"request {r.id}: {why}")
        else:
            counts.append(c)
    drafted, accepted = sum(c.drafted for c in counts), sum(c.accepted for c in counts)
    predicted = sum(c.predicted for c in counts)
    m = metric_counts(deltas)
    steps = m.get("steps") if "drafted" in m and "accepted" in m else None   # steps only where the counts cross-check
    if steps is not None and (m["drafted"] != drafted or m["accepted"] != accepted):
        problems.append(f"/metrics counted {m.get('accepted', 0):.0f}/{m.get('drafted', 0):.0f} accepted/drafted over the "
                        f"bucket, its responses {accepted}/{drafted}: another client shares the server (figures from the responses)")
        steps = None
    fast, slow = tok_s(spec), tok_s(base)
    ci = speedup_interval(spec, base)
    prompt = [r.input_tokens for r in spec if r.ok and r.input_tokens]
    row = {"kind": kind, "real": kind in REAL, "context_tokens": context,
           "prompt_tokens_mean": round(sum(prompt) / len(prompt)) if prompt else None,
           "requests": len(counts), "base_requests": sum(1 for r in base if decode_time(r)),
           "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None,
           "accept_length": 1 + accepted / steps if steps else None,
           "tokens_per_pass": predicted / (predicted - accepted) if predicted > accepted else None,
           "tok_s": fast, "tok_s_base": slow, "speedup": fast / slow if fast and slow else None,
           "speedup_ci": [ci[1], ci[2]] if ci else None}
    return row, problems


def pooled(rows: list[dict[str, Any]], real: bool) -> dict[str, Any]:
    """Acceptance over every bucket of real text (or of random tokens), token-weighted, and the speed-up's range."""
    rs = [r for r in rows if r["real"] is real]
    drafted, accepted = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
    ups = [r["speedup"] for r in rs if r["speedup"]]
    return {"acceptance": accepted / drafted if drafted else None, "drafted": drafted,
            "requests": sum(r["requests"] for r in rs), "speedup_min": min(ups, default=None), "speedup_max": max(ups, default=None)}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def _ups(p: dict[str, Any]) -> str:
    lo, hi = p["speedup_min"], p["speedup_max"]
    if lo is None:
        return "no baseline"
    return f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}×"


def verdict(rows: list[dict[str, Any]], mode: str = "") -> Finding:
    """The section's first line: acceptance on real text vs random tokens and by how much random tokens mislead."""
    real, rnd = pooled(rows, True), pooled(rows, False)
    on = f" ({mode})" if mode else ""
    if not real["drafted"] and not rnd["drafted"]:
        return Finding("bench.spec.real_vs_random", "warn", f"speculative decoding{on}: no draft tokens on any prompt",
                       detail="The server drafted nothing (draft_n absent from every response): speculation is off, or its "
                              "drafter never found a candidate.",
                       remedy="Start llama-server with --spec-type (e.g. ngram-simple) or --model-draft, and --metrics.")
    if real["acceptance"] is None or rnd["acceptance"] is None:
        which = "real text" if real["acceptance"] is None else "random tokens"
        return Finding("bench.spec.real_vs_random", "warn", f"speculative decoding{on}: nothing drafted on {which}",
                       detail=f"acceptance on real text {_pct(real['acceptance'])}, on random tokens {_pct(rnd['acceptance'])}",
                       remedy="Send more or longer prompts of the kind that drafted nothing.")
    gap = 100 * (real["acceptance"] - rnd["acceptance"])
    how = "understates" if gap > 0 else "overstates"
    title = (f"acceptance on real text {_pct(real['acceptance'])} vs random tokens {_pct(rnd['acceptance'])}{on}: judging "
             f"speculation on random tokens {how} it by {abs(gap):.0f} points")
    return Finding("bench.spec.real_vs_random", "info", title,
                   detail=f"speed-up on real text {_ups(real)}, on random tokens {_ups(rnd)}; {real['requests']} real-text and "
                          f"{rnd['requests']} random-token requests, {real['drafted']:,} and {rnd['drafted']:,} draft tokens",
                   remedy="Judge speculative decoding on --workload code, agentic or prefix, never on random tokens.")


def problem_findings(problems: dict[str, list[str]]) -> list[Finding]:
    """One warn per bucket whose responses could not all be used, its first problem as the line."""
    out = []
    for bucket, ps in problems.items():
        if ps:
            more = f" (+{len(ps) - 1} more)" if len(ps) > 1 else ""
            out.append(Finding(f"bench.spec.responses.{bucket}", "warn", f"{bucket}: {len(ps)} response(s) not counted",
                               detail=ps[0][:300] + more,
                               remedy="Check that the server is llama-server with speculative decoding on and nothing else "
                                      "sends it requests during the study."))
    return out
