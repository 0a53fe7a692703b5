"""The one-box flow on the real model, on CPU: record the BF16 reference, then restart the server on the same port
with each candidate KV cache and compare it with the record (`runbook accuracy record`, `accuracy kld --record`).

One SGLang server at a time (runbook.demo.sglang, the real SmolLM2-135M-Instruct checkpoint), as on a host that holds
one copy of the model:
1. BF16 KV: `kldprobe.write_record` scores the windows (top-k per position), measures the noise floor (a second pass
   and the windows --concurrency at once) and writes the record; with --long, a second record of one window as long
   as the server takes (scoring.longest_input: 8,185 of the 8,192 positions; SGLang keeps the rest for output).
2. The same port, restarted: BF16 again (the restart floor), then each --kv dtype; each compared with every record.
Prints per record its size, time and this client's peak memory, and per candidate and record the depth table, the
share of positions above the tail threshold, and the verdict.

    PYTHONPATH=lib RUNBOOK_SERVING_PYTHON=.venv-serving/bin/python .venv/bin/python benchmarks/kld_fp8_kv.py \
        [--windows 4] [--tokens 2048] [--top-k 20] [--chunk 512] [--concurrency 4] [--long] [--kv fp8_e4m3 fp8_e5m2]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import pandas as pd

from runbook.accuracy import kldprobe, report, scoring
from runbook.accuracy.settings import AccuracySettings
from runbook.core import ports
from runbook.demo import realmodel, sglang


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--long", action="store_true", help="also a record of one window as long as the server takes")
    ap.add_argument("--kv", nargs="+", default=["fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--json", type=Path, help="also write every comparison here")
    a = ap.parse_args()
    model = realmodel.hf_dir()
    work = Path(tempfile.mkdtemp(prefix="kld-bench-"))
    port = ports.free_port()
    shapes = {"short": (a.windows, a.tokens)}

    def settings(url: str, **kw) -> AccuracySettings:
        return AccuracySettings.resolve(None, None, url=url, tokenizer=str(model), kld_top_k=a.top_k, kld_chunk=a.chunk,
                                        batch_size=a.concurrency, **kw)

    def server(name: str, flags: dict) -> sglang.SGLangServer:
        dep = sglang.deployment(port, source=realmodel.spec_path(), model_dir=model, flags=flags)
        t = time.monotonic()
        srv = sglang.start(dep, log_path=work / f"{name}.log", relaunch=0)     # the same port, as the unit's
        print(f"# {name}: ready on port {port} in {time.monotonic() - t:.0f} s", flush=True)
        return srv

    records = {}
    with server("bf16-reference", {}) as srv:
        if a.long:
            shapes["long"] = (1, scoring.longest_input(srv.url) or a.tokens)
        for name, (n, tokens) in shapes.items():
            path = work / f"bf16-{name}.safetensors"
            doc, findings = kldprobe.write_record(settings(srv.url, probe="record", record=str(path), kld_windows=n,
                                                           kld_window_tokens=tokens))
            if not doc:
                print(f"# record {name} not written: {[(f.title, f.detail) for f in findings]}")
                return 1
            records[name] = path
            floor = doc["floor"] if doc["floor_used"] == "second_pass" else doc["floor_batch"]
            print(f"# record {name}: {n} × {tokens:,} tokens, {doc['bytes']:,} bytes in {doc['seconds']:.0f} s; floor "
                  f"({doc['floor_used']}) mean KLD {floor['overall']['kld_mean']:.5f}; client peak RSS {peak_rss_mb():.0f} MB",
                  flush=True)
    results = {}
    pd.set_option("display.width", 220)
    for cand, flags in [("bf16 restart", {})] + [(kv, {"kv-cache-dtype": kv}) for kv in a.kv]:
        with server(cand.replace(" ", "-"), flags) as srv:
            for name, path in records.items():
                t = time.monotonic()
                doc, findings = kldprobe.against_record(settings(srv.url, probe="kld", record=str(path)))
                verdict = next(f for f in findings if f.id == "accuracy.kld.verdict")
                results[f"{cand} / {name}"] = doc
                print(f"\n## {cand} against the BF16 record {name} ({time.monotonic() - t:.0f} s; client peak RSS "
                      f"{peak_rss_mb():.0f} MB)")
                print(report.kld_table(doc).to_string())
                print(f"verdict: {verdict.status}: {verdict.title}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=str))
    print(f"\n# records and server logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
