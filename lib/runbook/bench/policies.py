"""The gateway's routing policy, measured: the same agentic sessions through the gateway under each policy, on the
same replicas, and the prefix-cache hits per turn each one earns (SGLang's `usage.prompt_tokens_details.cached_tokens`).

Why it matters: an agent's turn re-sends the whole conversation, so its prefix is cached only on the replica that
served the previous turn. `cache_aware` routes by the longest cached prefix and keeps a session on one replica;
`round_robin` spreads turns over replicas, so a later turn often lands where its prefix is not. The figure that
decides is the hit rate of turns 2 and later (turn 1's hits are the shared system prompt alone).

The library does not know how to restart a gateway: the caller passes `relaunch(policy)`, which returns once the
gateway at the benchmark's URL routes with that policy (runbook.demo.topology.relauncher for the CPU demo; a
production gateway is a unit restart). Every replica's prefix cache is flushed before each policy's levels
(`flush_cache` on: the gateway fans POST /flush_cache out to its workers), so no policy inherits the other's cache.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from runbook.bench.run import run
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.core.findings import Finding

PREFERRED = "cache_aware"


def later_turns_hit(turns: Sequence[dict[str, Any]]) -> float | None:
    """Cached ÷ prompt tokens over turns 2 and later, weighted by each turn's prompt tokens (mean × requests)."""
    cached = prompt = 0.0
    for t in turns:
        if (t.get("turn") or 0) < 2 or t.get("cache_hit_rate") is None:
            continue
        inp = t.get("input_tokens") or {}
        n = (inp.get("mean") or 0.0) * (inp.get("n") or 0)
        cached += (t["cache_hit_rate"] or 0.0) * n
        prompt += n
    return cached / prompt if prompt > 0 else None


def _policy_row(policy: str, summary: dict[str, Any]) -> dict[str, Any]:
    levels = []
    for lv in summary.get("levels") or []:
        turns = lv.get("turns") or []
        levels.append({"label": lv.get("label"), "completed": lv.get("completed"), "failed": lv.get("failed"),
                       "cache_hit_rate": lv.get("cache_hit_rate"), "later_turns_hit_rate": later_turns_hit(turns),
                       "turns": [{"turn": t.get("turn"), "requests": t.get("requests"), "failed": t.get("failed"),
                                  "cache_hit_rate": t.get("cache_hit_rate"),
                                  "ttft_ms_p50": (t.get("ttft_ms") or {}).get("p50")} for t in turns],
                       "replicas": lv.get("replicas") or []})
    hits = [lv["later_turns_hit_rate"] for lv in levels if lv["later_turns_hit_rate"] is not None]
    return {"policy": policy, "later_turns_hit_rate": sum(hits) / len(hits) if hits else None, "levels": levels}


def compare_policies(policies: Sequence[str], relaunch: Callable[[str], None], settings: BenchSettings,
            slo: Any = None) -> tuple[dict[str, Any], list[Finding]]:
    """Each policy in turn: `relaunch(policy)`, then the run's levels (agentic sessions, caches flushed first).
    Returns ({"policies": [row per policy], "best": policy}, findings)."""
    if len(set(policies)) < 2:
        raise InputError("a policy comparison needs two or more different gateway policies, e.g. cache_aware,round_robin")
    if settings.workload != "agentic":
        raise InputError(f"the policy comparison measures cache hits per agentic turn: {{workload}} agentic, not {settings.workload}")
    o = settings.model_copy(update={"flush_cache": True})
    rows = []
    for p in policies:
        relaunch(p)
        res = run(o, slo)
        rows.append(_policy_row(p, res.summary))
    return {"policies": rows, "best": _best(rows)}, [finding(rows)]


def _best(rows: list[dict[str, Any]]) -> str | None:
    scored = [r for r in rows if r["later_turns_hit_rate"] is not None]
    return max(scored, key=lambda r: r["later_turns_hit_rate"])["policy"] if scored else None


def finding(rows: list[dict[str, Any]]) -> Finding:
    """`bench.gateway.policy`: which policy earned the most cache hits on turns 2+; warn when cache_aware was measured
    and did not (the figures say by how much), skip when no policy's turns reported cached tokens."""
    figs = ", ".join(f"{r['policy']} {r['later_turns_hit_rate']:.1%}" if r["later_turns_hit_rate"] is not None
                     else f"{r['policy']} —" for r in rows)
    best = _best(rows)
    if best is None:
        return Finding("bench.gateway.policy", "skip", "no policy's later turns reported cached tokens", evidence=figs,
                       remedy="Start SGLang with --enable-cache-report (usage.prompt_tokens_details.cached_tokens).")
    names = {r["policy"] for r in rows}
    if PREFERRED in names and best != PREFERRED:
        return Finding("bench.gateway.policy", "warn", f"{best} earned more prefix-cache hits per later turn than {PREFERRED}",
                       evidence=f"cache hits on turns 2+: {figs}",
                       remedy="Few sessions or short contexts let every policy hit the shared system prompt; measure with "
                              "more sessions (--concurrency) and longer contexts (--input-len) before choosing.")
    return Finding("bench.gateway.policy", "pass" if best == PREFERRED else "info",
                   f"{best} earned the most prefix-cache hits per later turn", evidence=f"cache hits on turns 2+: {figs}")
