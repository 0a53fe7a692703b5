"""Issue 50's warm-session figures from one run: `bench --find-max warm` on SGLang's CPU server with its pool pinned
small (`--max-total-tokens`), so the knee falls within reach on two cores —
1. under each radix eviction policy (lru, lfu, slru, priority, tlru), a server each, with think time;
2. lru without and with think time (the plan says it changes nothing);
3. two replicas behind the real gateway (smg) under cache_aware: whether the knee doubles.
Each row: the plan's prediction, the measured knee, and cache hit, TTFT p50 and tokens prefilled again per turn 2+ at
the knee and the first level past it. CPU figures of a 4.5 M-parameter model: what the cache does, not a deployment.

    RUNBOOK_SERVING_PYTHON=.venv-serving/bin/python RUNBOOK_GATEWAY_PYTHON=.venv-gateway/bin/python \\
        .venv/bin/python benchmarks/warm_sessions.py [--pool 1536] [--think 0.5] [--policies lru,tlru] [--no-gateway]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.core import ports
from runbook.demo import sglang, topology

SESSION = {"workload": "agentic", "turns": 3, "input_len": 160, "tool_result_len": 48, "output_len": 8, "warmup": 0,
           "telemetry": False, "timeout": 120.0, "find_max": "warm", "find_max_levels": 8, "concurrency": [1]}
POLICIES = ("lru", "lfu", "slru", "priority", "tlru")


def policy_flags(policy: str, pool: int) -> dict[str, Any]:
    """SGLang's flags for a pinned pool under `policy`; tlru needs its budget (threshold > next_prompt_estimate, in
    tokens): one turn's additions as the estimate, twice that as the threshold."""
    flags: dict[str, Any] = {**sglang.BESIDE_SIBLINGS, "max-total-tokens": pool, "radix-eviction-policy": policy}
    if policy == "tlru":
        q = SESSION["tool_result_len"] + SESSION["output_len"] + 32
        flags["radix-eviction-policy-config"] = json.dumps({"threshold": 2 * q, "next_prompt_estimate": q})
    return flags


def row(label: str, r: dict[str, Any], took_s: float) -> str:
    rows = {x["sessions"]: x for x in r["levels"]}
    knee, cold = rows.get(r["knee_sessions"] or -1, {}), rows.get(r["first_cold"] or -1, {})

    def cell(x: dict[str, Any]) -> str:
        if not x:
            return "—"
        hit, ttft, again = x["cache_hit_rate"], x["ttft_ms"].get("p50"), x["reprefill_tokens_per_turn"]
        return f"{hit:.0%} / {ttft:.1f} ms / {again:.0f}" if None not in (hit, ttft, again) else "n/a"
    curve = " ".join(f"{x['sessions']}:{x['warm_share']:.0%}" for x in r["levels"])
    return (f"| {label} | {r['pool_tokens']:,} | {r['context_tokens']:,} | {r['predicted_sessions']} | {r['knee_sessions']} | "
            f"{r['first_cold']} | {cell(knee)} | {cell(cold)} | {curve} | {took_s:.0f} s |")


HEAD = ("| run | pool | held context | plan | knee | first cold | at the knee: hit / TTFT p50 / re-prefilled | "
        "past it | warm share per level | took |\n|---|---|---|---|---|---|---|---|---|---|")


def search(url: str, model_dir: Path, think: float, spec: Any = None) -> tuple[dict[str, Any], float]:
    """The run's summary (its `warm_sessions` and levels) and its seconds."""
    kw = dict(SESSION, think_time=think, tokenizer=str(model_dir))
    o = BenchSettings.resolve(spec, **kw) if spec is not None else BenchSettings(url=url, **kw)
    t0 = time.perf_counter()
    res = bench.run(o)
    return res.summary, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=1536, help="--max-total-tokens of every server (default 1536)")
    ap.add_argument("--think", type=float, default=0.5, help="think time between turns, seconds (default 0.5)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--no-gateway", action="store_true")
    a = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="warm-sessions-"))
    print(f"sessions: {SESSION['turns']} turns, ~{SESSION['input_len']}-token context, {SESSION['tool_result_len']}-token "
          f"tool results, output {SESSION['output_len']}; think {a.think:g} s fixed; logs in {log_dir}\n")
    print(HEAD)
    for policy in filter(None, a.policies.split(",")):
        srv = sglang.start(flags=policy_flags(policy, a.pool), log_path=log_dir / f"{policy}.log")
        try:
            for think in ((0.0, a.think) if policy == "lru" else (a.think,)):
                s, took = search(srv.url, srv.model_dir, think)
                print(row(f"{policy}, think {think:g} s", s["warm_sessions"], took), flush=True)
        finally:
            srv.stop()
    if not a.no_gateway:
        base = sglang.deployment(ports.free_port(), flags=policy_flags("lru", a.pool))
        fleet = topology.start(topology.deployment(2, "cache_aware", base=base), log_dir)
        try:
            s, took = search(fleet.url, Path(fleet.spec.model.path), a.think, fleet.spec)
            print(row(f"gateway cache_aware, 2 replicas, think {a.think:g} s", s["warm_sessions"], took), flush=True)
            print(f"\npools: {s['warm_sessions']['servers']}\nper level, each replica's requests and cached tokens "
                  "(its own /metrics):")
            for lv in s["levels"]:
                print(f"  {lv['label']}: " + ", ".join(f"{x['name']} {x['requests']} req {x['cached_tokens']} cached"
                                                      for x in lv.get("replicas") or []))
        finally:
            fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
