"""Speculative decoding on real text vs random tokens: llama-server with the real model (SmolLM2-135M-Instruct, Q4_1 GGUF).

Starts llama-server one at a time on the real model — speculation off (the baseline), then once per mode — sends
each the study's prompts (bench/speculation_study.py: the corpus's code text, the agentic opening turn, random token ids;
one bucket per context length, one request at a time) and prints acceptance, accept length and the decode speed-up
per mode, kind and context, side by side. `draft-self` drafts with the same GGUF: a draft that always agrees with the
target (up to numerics), so its acceptance is an upper bound and its speed-up a lower one (the draft costs a full
forward pass). Figures from two shared CPU cores: ratios, not a deployment's speed.

    .venv/bin/python benchmarks/speculation_real_vs_random.py [--modes ngram-simple-n3,ngram-simple] (also: ngram-mod,
        ngram-map-k, draft-self) [--contexts 256,1024] [--requests 2] [--output-len 32] [--threads 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.bench import BenchSettings, speculation_study
from runbook.core import tables
from runbook.demo import llama as demo
from runbook.demo import realmodel

# llama.cpp's own defaults for each mode unless said: what `--spec-type X` gives a user
MODES: dict[str, list[str]] = {
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-simple-n3": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "draft-self": ["--model-draft", "{gguf}", "--spec-draft-n-max", "8"],
}
# the GGUF's Q4_1 weights crash llama-server's CPU repack path at start-up (shared reference: real-model.md)
SERVER_ARGS = ["--no-repack", "--jinja"]


def serve(model_dir: Path, threads: int, extra: list[str]) -> demo.LlamaServer:
    return demo.start_llama_server(model_dir=model_dir, parallel=1, ctx=4096, threads=threads, ready_timeout=180,
                                   extra_args=SERVER_ARGS + extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="ngram-simple-n3,ngram-simple")
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write every mode's study here")
    a = ap.parse_args()
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes {','.join(unknown)}: each one of {', '.join(MODES)}")
    gguf, tok = realmodel.gguf_path(), str(realmodel.hf_dir())
    with tempfile.TemporaryDirectory(prefix="spec-bench-") as tmp:
        model_dir = Path(tmp)
        (model_dir / "model.gguf").symlink_to(gguf)       # start_llama_server serves DIR/model.gguf
        o = BenchSettings.resolve(None, speculation=True, speculation_contexts=[int(c) for c in a.contexts.split(",")],
                                  speculation_requests=a.requests, output_len=a.output_len, tokenizer=tok)
        buckets = speculation_study.plan(o)
        srv = serve(model_dir, a.threads, [])
        try:
            base = speculation_study.collect(srv.url, buckets, tokenizer_dir=tok)
        finally:
            srv.stop()
        studies = {}
        for mode in modes:
            srv = serve(model_dir, a.threads, [x.format(gguf=gguf) for x in MODES[mode]])
            try:
                got = speculation_study.collect(srv.url, buckets, tokenizer_dir=tok)
                studies[mode] = speculation_study.summarise(buckets, got, base, mode)
            finally:
                srv.stop()
    import pandas as pd  # lazy: only for the printed table

    rows = [{"mode": m, "kind": b["kind"], "context": b["context_tokens"], "prompt tok": b["prompt_tokens_mean"],
             "n": b["requests"], "drafted": b["drafted"], "accepted": b["accepted"],
             "accept %": None if b["acceptance"] is None else round(100 * b["acceptance"], 1),
             "accept len": b["accept_length"], "tok/pass": b["tokens_per_pass"], "tok/s off": b["tok_s_base"],
             "tok/s spec": b["tok_s"], "speed-up": b["speedup"],
             "95% CI": "—" if not b["speedup_ci"] else f"{b['speedup_ci'][0]:.2f}–{b['speedup_ci'][1]:.2f}"}
            for m, st in studies.items() for b in st.rows]
    print(tables.text(pd.DataFrame(rows).set_index(["mode", "kind", "context"]).round(2)))
    for m, st in studies.items():
        for f in st.findings:
            print(f"[{m}] {f.status}: {f.title}" + (f" — {f.detail}" if f.detail else ""))
    if a.json:
        a.json.write_text(json.dumps({m: st.data() for m, st in studies.items()}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
