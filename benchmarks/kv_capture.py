"""What the KV study's capture of a real decoder's K and V costs (docs/accuracy.md, "The K and V a decoder caches").

Runs `kvcapture.capture` on a checkpoint (default: the real model, `make real-model`) into a fresh cache folder,
then again from that cache, and prints the capture's parts (model load, forward, statistics) and the cached rerun.
Figures from a shared host vary with its load; the load average is printed beside them.

    .venv/bin/python benchmarks/kv_capture.py [--model DIR] [--windows 4] [--tokens 1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.accuracy import kvcapture
from runbook.demo import realmodel, sglang


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF checkpoint dir (default: the real model's hf/)")
    ap.add_argument("--windows", type=int, default=kvcapture.WINDOWS)
    ap.add_argument("--tokens", type=int, default=kvcapture.WINDOW_TOKENS)
    a = ap.parse_args()
    if not a.model:
        realmodel.build()                      # once; cached under .cache/
    model = a.model or str(realmodel.hf_dir())
    py = str(sglang.serving_python())
    with tempfile.TemporaryDirectory(prefix="kv-capture-bench-") as tmp:
        os.environ["RUNBOOK_CACHE"] = tmp
        t0 = time.perf_counter()
        first = kvcapture.capture(model, py, n=a.windows, tokens=a.tokens)
        cold = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = kvcapture.capture(model, py, n=a.windows, tokens=a.tokens)
        warm = time.perf_counter() - t1
    m = first.meta
    print(f"model {model}: {m['layers']} layers × {m['kv_heads']} KV heads × {m['head_dim']}, "
          f"{a.windows} windows × {m['window_tokens']} tokens, torch threads {m['threads']}")
    print(f"capture (subprocess) {m['capture_s']:.1f} s: model load {m['load_s']:.1f} s, forward {m['forward_s']:.1f} s; "
          f"statistics {m['stats_s']:.1f} s; whole call {cold:.1f} s")
    print(f"cached rerun {warm:.2f} s (cached={again.cached}; hashing the checkpoint included)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
