"""What tune itself costs per candidate, on real llama-server candidates (the tiny CPU model), or with `--engine sglang`
on the real SGLang server on CPU (runbook.demo.sglang; RUNBOOK_SERVING_PYTHON or .venv-serving).

Per candidate, tune's overhead is its launch-to-result time less the server's own start-up (launch to
ready) and the benchmark: the pre-check, reading the start-up log, the accuracy guard, teardown, the
GPU-memory check and archiving the result. The guard is shown apart (it is measurement too, of accuracy). The
pre-check runs once for all candidates (one SGLang parser run per interpreter): each row shows its share.

    .venv/bin/python benchmarks/tune_overhead.py [--engine sglang] [--candidates 3] [--requests 4] [--output-len 16]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.core import ports
from runbook.core import spec as spec_mod
from runbook.demo import llama as demo
from runbook.demo.tune import write_sglang_spec, write_spec
from runbook.tune import stage

CANDIDATES = {"q8-kv": {"flags": {"cache-type-k": "q8_0", "cache-type-v": "q8_0"}},
              "np4": {"flags": {"parallel": 4}},
              "q4-kv": {"flags": {"cache-type-k": "q4_0", "cache-type-v": "q4_0"}},
              "batch-128": {"flags": {"batch-size": 128, "ubatch-size": 128}}}
SGLANG_CANDIDATES = {"no-radix": {"flags": {"disable-radix-cache": True}},
                     "chunked-512": {"flags": {"chunked-prefill-size": 512}},
                     "mrr-8": {"flags": {"max-running-requests": 8}},
                     "lpm": {"flags": {"schedule-policy": "lpm"}}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["llama-server", "sglang"], default="llama-server")
    ap.add_argument("--candidates", type=int, default=3, help="candidates besides the reference (at most 4)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=16)
    a = ap.parse_args()
    small = {"concurrency": [1, 2], "requests_per_level": a.requests, "turns": 1, "input_len": 64, "output_len": a.output_len,
             "slo_search": False, "guard": {"identity_prompts": 2, "identity_max_tokens": 16, "recall_lengths": [256],
                                            "toolcall": False}}
    with tempfile.TemporaryDirectory() as d:
        if a.engine == "sglang":
            cands = dict(list(SGLANG_CANDIDATES.items())[:a.candidates])
            path = write_sglang_spec(Path(d) / "tiny-sglang.yaml", ports.free_port(), candidates=cands, **small)
        else:
            exe, model = demo.build_llama_server(), demo.tiny_model()
            cands = dict(list(CANDIDATES.items())[:a.candidates])
            path = write_spec(Path(d) / "tiny.yaml", exe, model, ports.free_port(), candidates=cands, **small)
        rep = stage.evaluate(spec_mod.load(path), stage.TuneOptions(archive=d))
    rows = [r for r in rep.rows if r["status"] == "done"]
    print(f"{'candidate':<11} {'pre-check':>9} {'ready':>7} {'bench':>7} {'guard':>7} {'teardown':>8} {'total':>7} {'overhead':>9} "
          f"{'w/o guard':>9}")
    over, core = [], []
    for r in rows:
        o = r["total_s"] + r["precheck_s"] - r["ready_s"] - r["bench_s"]
        over.append(o)
        core.append(o - r["guard_s"])
        print(f"{r['name']:<11} {r['precheck_s']:>8.3f}s {r['ready_s']:>6.2f}s {r['bench_s']:>6.2f}s {r['guard_s']:>6.2f}s "
              f"{r['teardown_s']:>7.2f}s {r['total_s']:>6.2f}s {o:>8.2f}s {o - r['guard_s']:>8.2f}s")
    if rows:
        print(f"median overhead per candidate: {statistics.median(over):.2f} s with the guard, "
              f"{statistics.median(core):.2f} s without it ({len(rows)} candidates)")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
