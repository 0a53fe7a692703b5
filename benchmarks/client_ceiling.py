"""How fast can the benchmark client ingest streamed chunks before it, not the server, is the limit?

Starts a zero-delay SSE server in a separate process (so its CPU is not ours), then streams from it at
concurrency 64 and 256 with the project's own client and sweep, and prints chunks/s ingested, client
CPU seconds per million chunks, and event-loop lag p50/p99.

    .venv/bin/python benchmarks/client_ceiling.py [--tokens 256] [--requests-per-stream 4]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.bench.sweep import Level, run_level  # noqa: E402
from runbook.endpoint.client import Client, RequestSpec  # noqa: E402


def serve(port: int, tokens: int, ttft_s: float = 0.0) -> None:
    from aiohttp import web

    chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
    line = f"data: {json.dumps(chunk)}\n\n".encode()
    last = f"data: {json.dumps({'choices': [{'index': 0, 'text': '', 'finish_reason': 'length'}]})}\n\n".encode()
    usage = f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 8, 'completion_tokens': tokens}})}\n\n".encode()
    done = b"data: [DONE]\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read() or b"{}")
        # like a real OpenAI-compatible server: the usage chunk only when stream_options asks for it
        tail = last + (usage if (body.get("stream_options") or {}).get("include_usage") else b"") + done
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if ttft_s:
            await asyncio.sleep(ttft_s)
        for _ in range(tokens):
            await resp.write(line)     # no delay: as fast as the socket takes it
        await resp.write(tail)
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "zero"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256, help="chunks per request")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--send-overhead", action="store_true",
                    help="instead: TTFT p50 minus the server's scripted 150 ms at concurrency 1 and 32 (send overhead)")
    a = ap.parse_args()
    if a.send_overhead:
        return send_overhead()
    sg = sglang_client_available()
    print("SGLang's client (sglang.benchmark.serving in .venv-serving): " + (sg or "importable"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = mp.Process(target=serve, args=(port, a.tokens), daemon=True)
    p.start()
    url = f"http://127.0.0.1:{port}"
    time.sleep(1.0)
    try:
        for conc in (64, 256):
            reqs = [RequestSpec(i, "x", a.tokens, 8) for i in range(conc * a.requests_per_stream)]
            c0, w0 = time.process_time(), time.perf_counter()
            lr = asyncio.run(run_level(Client(url, "zero"), reqs, Level(f"c{conc}", conc), warmup=0, flush=False))
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            chunks = sum(len(r.chunk_times) for r in lr.records)
            ok = sum(r.ok for r in lr.records)
            print(f"concurrency {conc}: {ok}/{len(reqs)} ok, {chunks:,} chunks in {wall:.2f} s = {chunks / wall:,.0f} chunks/s; "
                  f"client CPU {cpu / chunks * 1e6:.1f} s per million chunks (CPU share {lr.cpu_share:.0%}); "
                  f"loop lag p50 {lr.lag_ms['p50']:.2f} ms, p99 {lr.lag_ms['p99']:.2f} ms; client-bound: {lr.client_bound}")
            if not sg:
                theirs = sglang_ceiling(url, conc, a.tokens, len(reqs))
                print(f"  SGLang's client, same server and level: {theirs}"
                      + (f"; ratio ours/theirs {chunks / wall / float(theirs.split('= ')[1].split()[0].replace(',', '')):.2f}"
                         if "chunks/s" in theirs else ""))
    finally:
        p.terminate()
        p.join(5)


_SGLANG_WRAPPER = ("import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); import sglang_env; sglang_env.install(); "
                   "sys.argv[0] = 'serving'; runpy.run_module('sglang.benchmark.serving', run_name='__main__')")


def sglang_ceiling(url: str, conc: int, tokens: int, n: int) -> str:
    """SGLang's own Python client (sglang.benchmark.serving, sglang-oai backend) on the same server:
    chunks/s = completed requests × chunks per request / its measured duration."""
    import os
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    py, tok = root / ".venv-serving" / "bin" / "python", root / ".cache" / "tiny-llama-v1"
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "sharegpt.json"   # its random dataset samples text from a ShareGPT file: a local one, offline
        data.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Explain this function. " * 8},
                                                       {"from": "gpt", "value": "It reads a file. " * 8}]}] * max(n, 64)))
        out = Path(d) / "out.jsonl"
        cp = subprocess.run([str(py), "-c", _SGLANG_WRAPPER, str(root / "tests" / "oracle"), "--backend", "sglang-oai",
                             "--base-url", url, "--model", "zero", "--tokenizer", str(tok), "--dataset-name", "random",
                             "--dataset-path", str(data), "--random-input-len", "8", "--random-output-len", str(tokens),
                             "--num-prompts", str(n), "--max-concurrency", str(conc), "--warmup-requests", "1",
                             "--disable-tqdm", "--output-file", str(out)],
                            capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if cp.returncode != 0 or not out.exists():
            return "failed: " + (cp.stderr.strip().splitlines() or ["?"])[-1][:200]
        r = json.loads(out.read_text().splitlines()[-1])
        rate = r["completed"] * tokens / r["duration"]
        return f"{r['completed']}/{n} ok in {r['duration']:.2f} s = {rate:,.0f} chunks/s"


def sglang_client_available() -> str:
    """'' when .venv-serving can import SGLang's benchmark client, else why not."""
    import subprocess

    py = Path(__file__).resolve().parents[1] / ".venv-serving" / "bin" / "python"
    if not py.is_file():
        return "not run: no .venv-serving"
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import sglang_env; sglang_env.install(); "
             "import sglang.benchmark.serving")
    cp = subprocess.run([str(py), "-c", probe, str(py.parents[2] / "tests" / "oracle")], capture_output=True, text=True,
                        timeout=120)
    return "" if cp.returncode == 0 else "not run: " + (cp.stderr.strip().splitlines() or ["import failed"])[-1]


def send_overhead(ttft_s: float = 0.150, tokens: int = 8) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = mp.Process(target=serve, args=(port, tokens, ttft_s), daemon=True)
    p.start()
    time.sleep(1.0)
    try:
        import numpy as np

        from runbook.bench import metrics

        for conc in (1, 32):
            reqs = [RequestSpec(i, "x", tokens, 8) for i in range(conc * 4)]
            lr = asyncio.run(run_level(Client(f"http://127.0.0.1:{port}", "zero"), reqs, Level(f"c{conc}", conc), warmup=conc, flush=False))
            ttft = [metrics.ttft_s(r) for r in lr.records if r.ok]
            q = [r.queue_s for r in lr.records]
            print(f"concurrency {conc}: TTFT p50 {np.median(ttft) * 1000:.2f} ms (scripted {ttft_s * 1000:.0f} ms): "
                  f"overhead {(np.median(ttft) - ttft_s) * 1000:+.2f} ms; client queue p50 {np.median(q) * 1000:.2f} ms")
    finally:
        p.terminate()
        p.join(5)


if __name__ == "__main__":
    main()
