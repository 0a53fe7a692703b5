"""Issue 42's figures from one run: two SGLang CPU replicas of the tiny model behind the real gateway (smg), started
from their rendered units; the plan per replica and in total beside each live replica's pool; the gateway verify
table; cache hits per agentic turn through the gateway under cache_aware and round_robin (only the gateway
relaunched); one replica killed mid-run, accounted request by request. CPU figures of a 4.5 M-parameter model: they
say what the gateway does, not what a deployment serves.

    RUNBOOK_SERVING_PYTHON=.venv-serving/bin/python RUNBOOK_GATEWAY_PYTHON=.venv-gateway/bin/python \\
        .venv/bin/python benchmarks/topology_figures.py
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook import verify
from runbook.bench import failover, policies
from runbook.bench.settings import BenchSettings
from runbook.demo import topology
from runbook.endpoint.reach import fetch_json
from runbook.kv.plan import assess as kv_plan

SESSIONS = {"workload": "agentic", "concurrency": [4], "requests": 8, "turns": 3, "input_len": 128, "output_len": 8,
            "chat": True, "warmup": 0, "telemetry": False}


def main() -> int:
    log_dir = Path(tempfile.mkdtemp(prefix="topology-figures-"))
    fleet = topology.launch(log_dir, policy="cache_aware")
    try:
        spec = fleet.spec
        plan = kv_plan(spec)
        topo = plan.topology or {}
        rep = verify.evaluate(spec, verify.VerifyOptions(log_dir=str(log_dir)))
        seen = {r["name"]: r for r in rep.data()["replicas"]}
        print("## plan per replica beside each live pool (/server_info; running requests from its log)")
        print("| replica | url | planned max_total_num_tokens | live max_total_num_tokens | planned running | live running |")
        print("|---|---|---|---|---|---|")
        for row in topo.get("replicas", []):
            info = fetch_json(row["url"] + "/server_info", timeout=10)
            observed = seen.get(row["name"], {}).get("observed") or {}
            print(f"| {row['name']} | {row['url']} | {row.get('max_total_num_tokens')} | {info.get('max_total_num_tokens')} | "
                  f"{row.get('max_running_requests')} | {observed.get('max_running_requests')} |")
        print(f"total: {topo.get('total')}\npolicy: {topo.get('policy_note')}\n")

        print("## gateway verify")
        for f in rep.findings:
            if f.id.startswith(("verify.gateway", "verify.replica")):
                print(f"| {f.id} | {f.status} | {f.title} |")
        print()

        o = BenchSettings.resolve(spec, **SESSIONS)
        res, found = policies.compare_policies(["cache_aware", "round_robin"], topology.relauncher(fleet, log_dir), o)
        (c,) = SESSIONS["concurrency"]
        sessions = max(c, -(-SESSIONS["requests"] // SESSIONS["turns"]))   # as the agentic workload plans them
        print(f"## cache hits per agentic turn through the gateway ({sessions} sessions x {SESSIONS['turns']} turns, "
              f"concurrency {c})")
        print("| policy | turn 1 | turn 2 | turn 3 | turns 2+ | requests per replica |")
        print("|---|---|---|---|---|---|")
        for p in res["policies"]:
            lv = p["levels"][0]
            turns = {t["turn"]: t["cache_hit_rate"] for t in lv["turns"]}
            print(f"| {p['policy']} | {turns.get(1)} | {turns.get(2)} | {turns.get(3)} | {p['later_turns_hit_rate']} | "
                  f"{[(r['name'], r['requests']) for r in lv['replicas']]} |")
        print(f"finding: {found[0].status} {found[0].title}\n")

        victim = fleet.replicas["r1"]

        def kill() -> None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.stop()

        o = BenchSettings.resolve(spec, workload="code", concurrency=[4], duration=16.0, output_len=16, warmup=0,
                                  telemetry=False)
        res2, acc = failover.run_with_stop(o, kill, after_s=6.0)
        print("## replica r1 killed 6 s into a 16 s level at concurrency 4")
        for k, v in acc["phases"].items():
            print(f"| {k} | requests {v['requests']} | failed {v['failed']} | errors {v.get('errors')} |")
        for f in acc["failed"][:10]:
            print(f"  failed: id {f['id']} phase {f['phase']} status {f['status']} {f['error_kind']} sent {f['sent_s']:.2f} s: "
                  f"{str(f['error'])[:100]}")
        lv = res2.summary["levels"][0]
        print(f"shares after: {[(r['name'], r['scraped'], r['request_share']) for r in lv['replicas']]}")
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
