"""`--find-max warm`: how many agent sessions the server keeps warm at a context and a think time, the knee where
they start evicting one another, and the plan's prediction beside it.

While an agent runs its tools its conversation sits in SGLang's radix cache, evictable. The pool holds every idle
session's prefix only while the sessions' contexts fit in it; past that each new turn's allocation evicts the leaf
the eviction policy ranks lowest — under `lru`, SGLang's default, the session idle longest, which is the one about
to come back — so turns 2+ prefill their whole context again and TTFT jumps from one turn's new tokens to the
whole context. The plan's prediction is the pool in tokens over the context a session comes back to — its previous
turn's prompt and answer, the most a turn needs still cached — in whole pages (kv/memory.py `held_at_context`).

Each level runs N agentic sessions at once (bench/sessions.py), each all its turns, from a flushed cache. A turn
2+ is warm when the server reused at least 90 % of what its session had sent and received before it; a level
keeps its sessions warm when 90 % of those turns are. The search doubles N from the start until a level does not,
then bisects (bench/slo_search.py `highest`)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from runbook.bench import metrics
from runbook.bench.settings import BenchSettings
from runbook.bench.slo_search import highest
from runbook.bench.sweep import Level
from runbook.core.errors import InputError
from runbook.core.findings import Finding, Status
from runbook.endpoint.records import RequestRecord
from runbook.kv import held_at_context

WARM_TURN = 0.9       # a turn is warm when the server reused ≥ 90 % of its session's earlier prompt and answer: the
                      # rest is prefilled again, and 10 % of a 100K context is already seconds of TTFT
WARM_LEVEL = 0.9      # a level keeps its sessions warm when ≥ 90 % of its turns 2+ are warm
WARM_SEARCH_MAX = 4096.0
DEFAULT_POLICY = "lru"          # SGLang 0.5.23 srt/arg_groups/fields/memory.py: radix_eviction_policy = "lru"

# What each radix eviction policy evicts first: SGLang 0.5.23 srt/mem_cache/radix_cache.py `evict` pops the
# evictable leaves from a heap ordered by the policy's get_priority (srt/mem_cache/evict_policy.py), lowest first.
EVICTS_FIRST = {
    "lru": "the leaf used least recently (LRUStrategy: last_access_time): the session idle longest",
    "lfu": "the leaf hit least often, then the least recent (LFUStrategy: hit_count, last_access_time)",
    "slru": "leaves hit fewer than 2 times before protected ones, each segment least recent first (SLRUStrategy)",
    "priority": "the lowest request priority, then the least recent (PriorityStrategy)",
    "tlru": "each conversation's newest tokens past what keeps its next prefill under `threshold` tokens "
            "(--radix-eviction-policy-config threshold, next_prompt_estimate), then the least recent (TLRUStrategy, "
            "arXiv:2510.15152)",
}
POLICY_SOURCE = "SGLang 0.5.23 srt/mem_cache/radix_cache.py RadixCache.evict; srt/mem_cache/evict_policy.py"


def pool(infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the servers say of their prefix caches (SGLang's /server_info, by name: the one server, or each replica
    behind a gateway): pool tokens (their sum), page size, context length, the eviction policy; an InputError when
    one reports no pool or has its radix cache off."""
    servers: dict[str, dict[str, int]] = {}
    for name, info in infos.items():
        tokens = info.get("max_total_num_tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise InputError(f"{name}'s /server_info reports no max_total_num_tokens: --find-max warm needs SGLang's pool size")
        if info.get("disable_radix_cache"):
            raise InputError(f"{name} runs with --disable-radix-cache: no session stays warm; drop that flag to search")
        page = info.get("page_size", 1)
        if not isinstance(page, int) or isinstance(page, bool) or page < 1:
            raise InputError(f"{name}'s /server_info reports page_size {page!r}: --find-max warm needs a whole number of "
                             "tokens, 1 or more")
        servers[name] = {"pool_tokens": tokens, "page_size": page}
    first = next(iter(infos.values()))
    policy = str(first.get("radix_eviction_policy") or DEFAULT_POLICY)
    lengths = [n for n in (_context_length(i) for i in infos.values()) if n]
    return {"pool_tokens": sum(x["pool_tokens"] for x in servers.values()), "page_size": servers[next(iter(servers))]["page_size"],
            "context_length": min(lengths) if lengths else None, "eviction_policy": policy,
            "eviction_policy_config": first.get("radix_eviction_policy_config"),
            "evicts_first": EVICTS_FIRST.get(policy, "(a policy this runbook does not describe)"),
            "policy_source": POLICY_SOURCE, "servers": servers}


def _context_length(info: dict[str, Any]) -> int | None:
    """The longest request the server takes: --context-length where given, else the scheduler's max_req_input_len
    (the model's context less one, capped by the pool) plus one."""
    n = info.get("context_length")
    if isinstance(n, int) and n > 0:
        return n
    m = info.get("max_req_input_len")
    return m + 1 if isinstance(m, int) and m > 0 else None


def predicted(p: dict[str, Any], context: int) -> int:
    """The plan's warm sessions: how many contexts of `context` tokens each pool holds in whole pages, summed (behind a
    gateway: each session routed to the replica that holds its prefix)."""
    return sum(held_at_context(x["pool_tokens"], x["page_size"], context) for x in p["servers"].values())


def estimated_context(o: BenchSettings, held: int | None) -> int:
    """The context a session's last turn comes back to, before anything ran: `held` (bench/sessions.py
    `SessionPlan.held_context`, by the local tokenizer), else the lengths asked for."""
    return held if held is not None else o.input_len + (o.turns - 2) * (o.tool_result_len + o.output_len) + o.output_len


def reachable(start: int, levels: int) -> int:
    """The most sessions a search of `levels` levels doubling from `start` can try."""
    return int(min(WARM_SEARCH_MAX, start * 2 ** max(0, levels - 1)))


def check_reach(p: dict[str, Any], context: int, start: int, levels: int) -> None:
    """Before any level runs: a context the server cannot hold, or a knee the sweep cannot reach, is an InputError
    (not a made-up knee)."""
    ctx_len = p.get("context_length")
    if isinstance(ctx_len, int) and context > ctx_len:
        raise InputError(f"a session reaches ~{context:,} tokens, past the server's context length ({ctx_len:,}): "
                         "lower {input_len}, {turns} or {tool_result_len}")
    want = predicted(p, context) + 1
    if want > reachable(start, levels):
        raise InputError(f"the plan predicts {want - 1:,} warm sessions at ~{context:,} tokens, but {levels} levels from "
                         f"{start} reach {reachable(start, levels):,}: start at {{concurrency}} {max(1, (want - 1) // 2)}")


def level_row(sessions: int, records: list[RequestRecord], turns: int) -> dict[str, Any]:
    """One level's turns 2+: warm share, cache hit, TTFT p50/p90, tokens prefilled again per turn, and the sessions'
    held context: the most a turn 2+ came back to, its previous turn's prompt and answer (the server's own counts).
    The warm share is over every turn 2+ the level's sessions should have sent (sessions × (turns − 1)): a turn that
    failed, or never ran because its session ended, is not warm."""
    by: dict[tuple[Any, int], RequestRecord] = {(r.meta.get("session"), r.meta["turn"]): r for r in records
                                                if r.ok and isinstance(r.meta.get("turn"), int)}
    counted: list[tuple[RequestRecord, int, int, int]] = []     # turn 2+: (record, prompt, cached, its past)
    for (s, t), r in by.items():
        prev = by.get((s, t - 1))
        if t >= 2 and prev is not None and r.cached_tokens is not None and r.input_tokens:
            counted.append((r, r.input_tokens, r.cached_tokens, (prev.input_tokens or 0) + prev.output_tokens))
    warm = [r for r, _, cached, past in counted if cached >= WARM_TURN * past]
    again = [n - cached for _, n, cached, _ in counted]
    held: dict[Any, int] = {}             # per session: the most a later turn of it came back to
    for (s, t), r in by.items():
        if (s, t + 1) in by:
            held[s] = max(held.get(s, 0), (r.input_tokens or 0) + r.output_tokens)
    expected = sessions * max(0, turns - 1)
    share = len(warm) / expected if expected else None
    return {"sessions": sessions, "turns_measured": len(counted), "turns_expected": expected, "warm_turns": len(warm),
            "warm_share": share, "cache_reported": any(r.cached_tokens is not None for (_, t), r in by.items() if t >= 2),
            "warm": share is not None and share >= WARM_LEVEL,
            "cache_hit_rate": (sum(c[2] for c in counted) / sum(c[1] for c in counted) if counted else None),
            "ttft_ms": {k: v for k, v in metrics.stats(metrics.ttft_s(c[0]) for c in counted).items() if k in ("p50", "p90", "n")},
            "reprefill_tokens_per_turn": statistics.fmean(again) if again else None,
            "context_tokens": int(statistics.median(held.values())) if held else None}


async def search(measure: Callable[[Level], Awaitable[tuple[dict[str, Any], list[RequestRecord]]]], o: BenchSettings,
                 p: dict[str, Any], context_estimate: int) -> dict[str, Any]:
    """The knee: the most concurrent sessions whose turns 2+ stay warm, by doubling then bisecting, beside the plan's
    prediction at the measured held context."""
    start = int(min(o.concurrency)) if o.concurrency else 1
    check_reach(p, context_estimate, start, o.find_max_levels)
    rows: list[dict[str, Any]] = []

    async def at(v: float) -> bool:
        n = int(v)
        _, records = await measure(Level(f"s{n}", concurrency=n))
        row = level_row(n, records, o.turns)
        if not row["cache_reported"] and any(r.ok and (r.meta.get("turn") or 0) >= 2 for r in records):
            raise InputError("the server reported no cached tokens for turns 2+: start SGLang with --enable-cache-report "
                             "(usage.prompt_tokens_details.cached_tokens)")
        rows.append(row)
        return bool(row["warm"])

    lo, hi, resolved = await highest(at, float(start), WARM_SEARCH_MAX, o.find_max_levels)
    rows.sort(key=lambda r: r["sessions"])
    contexts = [r["context_tokens"] for r in rows if r["context_tokens"]]
    context = int(statistics.median(contexts)) if contexts else context_estimate
    plan = predicted(p, context)
    knee = int(lo) if lo else None
    return {"knee_sessions": knee if hi is not None else None, "first_cold": int(hi) if hi is not None else None,
            "resolved": resolved, "reached": hi is not None, "warm_at_least": knee, "levels": rows,
            "predicted_sessions": plan, "context_tokens": context, "context_estimate": context_estimate,
            "think_time_s": o.think_time, "think_dist": o.think_dist, "turns": o.turns, **p,
            "rule": f"a turn 2+ is warm when the server reused ≥ {WARM_TURN:.0%} of its session's earlier prompt and "
                    f"answer; a level is warm when ≥ {WARM_LEVEL:.0%} of its turns 2+ are",
            "max_levels": o.find_max_levels}


def findings(r: dict[str, Any]) -> list[Finding]:
    """The verdict: how many agents stay warm at this context and think time, and whether the server agrees with the
    plan to within one level of the search."""
    at = f"at ~{r['context_tokens']:,} tokens and {r['think_time_s']:g} s think time ({r['think_dist']})"
    plan = f"the plan predicts {r['predicted_sessions']:,} ({r['pool_tokens']:,}-token pool, page {r['page_size']})"
    around = ", ".join(f"{x['sessions']} {'warm' if x['warm'] else 'cold'} ({_pct(x['warm_share'])})" for x in r["levels"])
    policy = f"eviction {r['eviction_policy']}: evicts {r['evicts_first']}"
    if not r["reached"]:
        return [Finding("bench.warm_sessions", "warn", f"every level kept its sessions warm up to {r['warm_at_least']} "
                        f"sessions {at}: the knee is above the sweep", detail=f"{plan}; levels: {around}; {policy}",
                        remedy="Raise --find-max-levels or start at a higher --concurrency; no knee is reported.")]
    if r["knee_sessions"] is None:
        return [Finding("bench.warm_sessions", "fail", f"no session stays warm {at}: already cold at {r['first_cold']}",
                        detail=f"{plan}; levels: {around}; {policy}",
                        remedy="Shorten the sessions' context, or give the pool more memory (the plan, stage 20).")]
    knee, gap = r["knee_sessions"], r["knee_sessions"] - r["predicted_sessions"]
    step = _step(r["levels"], knee)
    agree = abs(gap) <= step
    st: Status = "pass" if agree and r["resolved"] else "warn"
    verdict = (f"{knee} agent sessions stay warm {at}; {plan}"
               + ("" if agree else f" — the server keeps {abs(gap)} {'more' if gap > 0 else 'fewer'}"))
    return [Finding("bench.warm_sessions", st, verdict,
                    detail=f"first cold at {r['first_cold']}; levels: {around}; {policy}"
                           + ("" if r["resolved"] else f"; not resolved within {r['max_levels']} levels"),
                    remedy="" if agree else "Check the pool the server reports against the plan (verify, stage 50) and "
                                              "what else holds the cache (shared prefixes, running requests).")]


def _step(levels: list[dict[str, Any]], knee: int) -> int:
    """The search's resolution at the knee: the gap to the nearest level tried above it (at least one)."""
    above = [x["sessions"] for x in levels if x["sessions"] > knee]
    return max(1, min(above) - knee) if above else 1


def _pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.0%}"
