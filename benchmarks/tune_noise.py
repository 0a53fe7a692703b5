"""Tune's noise rule on the real SGLang server on CPU (runbook.demo.sglang; RUNBOOK_SERVING_PYTHON or .venv-serving):
the demo's tune with a few candidates, the reference launched `--reference-runs` times. Prints tune's table and
recommendation, each run's output tok/s, and what the old rule (one run each, "more than tune.min_gain") would have
recommended from the same readings — the figures behind docs/tune.md's "A gain must clear the noise".

    .venv/bin/python benchmarks/tune_noise.py [--candidates no-radix,chunked-512] [--reference-runs 2] [--requests 4]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.core import ports
from runbook.core import spec as spec_mod
from runbook.demo.tune import SGLANG_CANDIDATES, write_sglang_spec
from runbook.tune import report, stage


def _old_rule(rows: list[dict], reference: str, min_gain: float) -> str:
    """The rule before noise.py: the highest first-run tok/s, the reference kept unless beaten by more than min_gain."""
    done = [r for r in rows if r["status"] == "done" and (r.get("guard") or {}).get("status") in ("pass", "reference", "skip")
            and not any(d.get("status") == "fail" for d in r.get("startup") or [])]
    if not done:
        return "none"
    ref = next((r for r in done if r["name"] == reference), None)
    best = max(done, key=lambda r: r["bench"]["output_tok_s"] or 0)
    if ref is not None and not best["bench"]["output_tok_s"] > ref["bench"]["output_tok_s"] * (1 + min_gain):
        best = ref
    return best["name"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", default="no-radix,chunked-512", help="names from runbook.demo.tune.SGLANG_CANDIDATES")
    ap.add_argument("--reference-runs", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4, help="requests per level (levels: 1 and 2 concurrent)")
    a = ap.parse_args()
    cands = {n: SGLANG_CANDIDATES[n] for n in a.candidates.split(",")}
    with tempfile.TemporaryDirectory() as d:
        path = write_sglang_spec(Path(d) / "tiny-sglang.yaml", ports.free_port(), candidates=cands,
                                 reference_runs=a.reference_runs, requests_per_level=a.requests)
        dep = spec_mod.load(path)
        rep = stage.evaluate(dep, stage.TuneOptions(archive=d))
    print(report.text_table(rep))
    print("\nruns in launch order (output tok/s, the best level):")
    runs = [(r.get("seq"), r["name"], r) for r in rep.rows if r.get("bench")]
    runs += [(x.get("seq"), f"{x['name']} (run {x['run']})", x) for r in rep.rows for x in r.get("repeats") or [] if x.get("bench")]
    for seq, name, r in sorted(runs, key=lambda t: t[0] or 0):
        print(f"  {seq:>2}  {name:<22} {r['bench']['output_tok_s']:8.1f}")
    print(f"\nthe old rule on the first runs' readings would recommend: {_old_rule(rep.rows, dep.tune.reference, dep.tune.min_gain)}")
    print(f"the noise rule recommends: {(rep.recommendation or {}).get('name')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
