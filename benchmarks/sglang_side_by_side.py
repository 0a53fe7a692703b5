"""Our benchmark beside SGLang's own, on one SGLang server: output tok/s of our client and of
`sglang.benchmark.serving` per concurrency (alone, alternating A B B A; and together, both at once), our TTFT/TPOT beside the server's own
histograms (`--enable-metrics`), and prefix-cache hits per agentic turn from SGLang's cached_tokens.

Starts the demo's SGLang on CPU (runbook.demo.sglang, the tiny random-weight model; `make serving-env` first) unless
--url names a running server started with --enable-metrics and --enable-cache-report (then give --tokenizer).
The tiny CPU model's figures say nothing about a deployment's speed; the ratios say whether two clients agree.

    .venv/bin/python benchmarks/sglang_side_by_side.py [--concurrency 1,2,4,8] [--requests 16]
    .venv/bin/python benchmarks/sglang_side_by_side.py --url http://127.0.0.1:30000 --tokenizer /models/x
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.bench import reference, server_side
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings


def _ms(v: float | None) -> str:
    return "   n/a" if v is None else f"{v:6.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running SGLang server (default: start the demo's on CPU)")
    ap.add_argument("--tokenizer", help="the served model's directory (default: the demo's tiny model)")
    ap.add_argument("--serving-python", help="an interpreter with SGLang (default: the demo spec's .venv-serving)")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=16, help="per run; four runs per concurrency")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args()
    from runbook.demo import sglang as demo

    srv = None
    if a.url:
        url, tok = a.url, a.tokenizer
        if not tok:
            ap.error("--url needs --tokenizer (the served model's directory)")
    else:
        t0 = time.monotonic()
        srv = demo.start()
        url, tok = srv.url, str(srv.model_dir)
        print(f"SGLang {url} ready in {time.monotonic() - t0:.0f} s (log {srv.log})")
    try:
        levels = [int(c) for c in a.concurrency.split(",")]
        t0 = time.monotonic()
        with reference.SGLangClient(a.serving_python or demo.serving_python()) as sg:
            print(f"sglang.benchmark.serving imported in its interpreter in {time.monotonic() - t0:.0f} s")
            alone = reference.side_by_side(sg, url, tok, levels, a.requests, a.input_len, a.output_len)
            together = reference.side_by_side(sg, url, tok, levels, a.requests, a.input_len, a.output_len, together=True)
        print(f"\nOutput tok/s, {a.requests} requests of {a.input_len} + {a.output_len} tokens per run.")
        print("Alone: ours, SGLang's, SGLang's, ours, one after another (pooled: tokens over summed windows).")
        print(" conc   ours tok/s  SGLang tok/s  ratio   per run (ours | SGLang's)")
        for r in alone:
            row = r.row()
            print(f" {r.concurrency:4d}  {row['ours_output_tok_s']:10.1f}  {row['sglang_output_tok_s']:12.1f}  {row['ratio']:5.2f}   "
                  + " ".join(f"{x:.1f}" for x in row["ours_runs_tok_s"]) + " | "
                  + " ".join(f"{x:.1f}" for x in row["sglang_runs_tok_s"]))
        print("Together: both clients at once, each at the concurrency (the server runs twice it); the machine's load "
              "falls on both alike.")
        print(" conc   ours tok/s  SGLang tok/s  ratio   ours window s  SGLang's duration s")
        for r in together:
            print(f" {r.concurrency:4d}  {r.ours_tok_s():10.1f}  {r.theirs_tok_s():12.1f}  {r.ratio():5.2f}   "
                  f"{r.ours[0]['window_s']:13.2f}  {r.theirs[0]['duration']:19.2f}")
        rows = alone
        print("\nOur TTFT/TPOT beside SGLang's own histograms (mean exact; p50/p99 interpolated in its buckets), first of our runs alone:")
        print(" conc  metric   ours mean  server mean  ratio   ours p50  server p50   ours p99  server p99   n")
        for r in rows:
            for b in server_side.beside(r.ours[0]):
                if b["metric"] in ("TTFT", "TPOT"):
                    print(f" {r.concurrency:4d}  {b['metric']:6s}  {_ms(b['ours_mean_ms'])}     {_ms(b['server_mean_ms'])}   "
                          f"{b['ratio_mean']:5.2f}    {_ms(b['ours_p50_ms'])}      {_ms(b['server_p50_ms'])}     "
                          f"{_ms(b['ours_p99_ms'])}      {_ms(b['server_p99_ms'])}  {b['server_n']}")
        res = bench.run(BenchSettings(url=url, concurrency=[2], requests=8, workload="agentic", turns=4, input_len=256,
                                      output_len=16, tool_result_len=64, tokenizer=tok, flush_cache=True, warmup=1))
        (s,) = res.summary["levels"]
        print(f"\nAgentic sessions (2 at once, 4 turns, cache flushed first): prefix-cache hits per turn from SGLang's "
              f"cached_tokens (source: {s['cache_hit_source']}); SGLang's cached_tokens_total over the level: "
              f"{(s.get('server_side') or {}).get('cached_tokens')}")
        print(" turn  requests  input tokens (mean)  cached tokens (mean)  hit rate  TTFT p50 ms")
        for t in s["turns"]:
            hit = t["cache_hit_rate"]
            print(f" {t['turn']:4d}  {t['requests']:8d}  {t['input_tokens']['mean'] or 0:19.0f}  {t['cached_tokens']['mean'] or 0:20.0f}  "
                  f"{'n/a' if hit is None else f'{hit:8.0%}'}  {_ms(t['ttft_ms']['p50'])}")
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
