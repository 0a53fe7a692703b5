"""How fast can the benchmark client ingest streamed chunks before it, not the server, is the limit?

Starts a zero-delay SSE server in a separate process (so its CPU is not ours; each response is one
write, so the server costs nothing per chunk), then streams from it at concurrency 64 and 256 with the
project's own client and sweep (standard asyncio loop and uvloop) and with SGLang's own
`sglang.benchmark.serving` (when .venv-serving has it), and prints chunks/s, loop lag and the ratio.

    .venv/bin/python benchmarks/client_ceiling.py [--tokens 256] [--requests-per-stream 4]
    .venv/bin/python benchmarks/client_ceiling.py --lag 20000      # loop lag while ingesting 20k chunks/s
    .venv/bin/python benchmarks/client_ceiling.py --send-overhead  # TTFT at a burst, audited on the server's clock
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook.bench import workers
from runbook.bench.sweep import Level, run_level
from runbook.core.ports import free_port
from runbook.endpoint.client import TRANSPORTS, Client, RequestSpec
from runbook.endpoint.reach import run_sync

BACKLOG = 1024


def serve(port: int, tokens: int, ttft_s: float = 0.0, log: str = "", pace_s: float = 0.0) -> None:
    """`pace_s`: one write per chunk, this far apart (else the whole response in one write). `log`: a file the
    server appends "prompt received first_write" to for every request, on the same monotonic clock as the client
    (perf_counter is CLOCK_MONOTONIC, shared by processes)."""
    from aiohttp import web

    audit = open(log, "a", buffering=1) if log else None  # noqa: SIM115 - written by every request until the server process ends

    chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
    line = f"data: {json.dumps(chunk)}\n\n".encode()
    last = f"data: {json.dumps({'choices': [{'index': 0, 'text': '', 'finish_reason': 'length'}]})}\n\n".encode()
    usage = f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 8, 'completion_tokens': tokens}})}\n\n".encode()
    done = b"data: [DONE]\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read() or b"{}")
        received = time.perf_counter()
        # like a real OpenAI-compatible server: the usage chunk only when stream_options asks for it
        tail = last + (usage if (body.get("stream_options") or {}).get("include_usage") else b"") + done
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if ttft_s:
            await asyncio.sleep(ttft_s)
        if pace_s:
            t = time.perf_counter()
            for _ in range(tokens):
                t += pace_s
                await asyncio.sleep(max(0.0, t - time.perf_counter()))
                await resp.write(line)
            await resp.write(tail)
        else:
            await resp.write(line * tokens + tail)   # the whole response in one write: the server costs nothing per chunk
        if audit:
            audit.write(f"{body.get('prompt')} {received} {time.perf_counter()}\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "zero"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    # backlog: at concurrency 256 every client connects at once; aiohttp's default accept queue (128) drops SYNs, and
    # each dropped one costs its request the kernel's 1 s retransmit, a stall of the server's making in either client
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True, backlog=BACKLOG)


def serve_at_socket(port: int, tokens: int, ttft_s: float, log: str) -> None:
    """The send-overhead audit's server: stamps each request when its first bytes are read from the socket (an
    asyncio protocol over httptools, a few µs per read) and writes the whole response `ttft_s` later, logging
    "prompt received first_write" as `serve` does. aiohttp's handler stamps only after it has parsed every request
    that arrived before: at 32 at once that put the server's own queue, ~1 ms, into the client's error."""
    import httptools

    audit = open(log, "a", buffering=1)  # noqa: SIM115 - written by every request until the server process ends
    chunk = f"data: {json.dumps({'choices': [{'index': 0, 'text': ' tok', 'finish_reason': None}]})}\n\n".encode()
    last = f"data: {json.dumps({'choices': [{'index': 0, 'text': '', 'finish_reason': 'length'}]})}\n\n".encode()
    usage = f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 8, 'completion_tokens': tokens}})}\n\n".encode()

    def response(body: bytes, kind: bytes = b"text/event-stream", status: bytes = b"200 OK") -> bytes:
        return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\n\r\n" + body)

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.parser, self.first, self.body = transport, httptools.HttpRequestParser(self), None, []

        def data_received(self, data: bytes) -> None:
            if self.first is None:
                self.first = time.perf_counter()        # the request's first bytes, read before any parsing
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            received, self.first = self.first or time.perf_counter(), None
            if self.url.startswith(b"/v1/models"):
                self.transport.write(response(b'{"data": [{"id": "zero"}]}', b"application/json"))
                return
            if not self.url.startswith(b"/v1/completions"):      # as aiohttp's router answers what it does not serve
                self.transport.write(response(b'{"error": "not found"}', b"application/json", b"404 Not Found"))
                self.body = []
                return
            req, self.body = json.loads(b"".join(self.body) or b"{}"), []
            tail = last + (usage if (req.get("stream_options") or {}).get("include_usage") else b"") + b"data: [DONE]\n\n"
            out = response(chunk * tokens + tail)

            def write() -> None:
                self.transport.write(out)
                audit.write(f"{req.get('prompt')} {received} {time.perf_counter()}\n")
            asyncio.get_running_loop().call_later(max(0.0, received + ttft_s - time.perf_counter()), write)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", port, backlog=BACKLOG)
        await server.serve_forever()
    asyncio.run(main())


def serve_steps(port: int, tokens: int, step_s: float) -> None:
    """The paced server, shaped like SGLang's decode loop and cheap enough not to compete for the cores:
    every `step_s` one step writes one chunk to every running stream, each its own write (chunked
    encoding), on a bare asyncio protocol, so the CPU per chunk is the client's, not the server's."""
    chunk = b"data: " + json.dumps({"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}).encode() + b"\n\n"
    tail = (b"data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}).encode()
            + b"\n\n" + b"data: [DONE]\n\n")
    frame, end = b"%x\r\n%s\r\n" % (len(chunk), chunk), b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    models = json.dumps({"data": [{"id": "zero"}]}).encode()
    running: dict[Any, int] = {}          # transport -> chunks still to write

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.t, self.buf = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while (i := self.buf.find(b"\r\n\r\n")) >= 0:
                lines = self.buf[:i].split(b"\r\n")
                n = next((int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:])
                          if k.strip().lower() == b"content-length"), 0)
                if len(self.buf) < i + 4 + n:
                    return
                self.buf = self.buf[i + 4 + n:]
                if lines[0].startswith(b"GET"):
                    self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(models), models))
                else:
                    self.t.write(head)
                    running[self.t] = tokens

        def connection_lost(self, exc: Any) -> None:
            running.pop(self.t, None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Conn, "127.0.0.1", port, backlog=1024)
        t = time.perf_counter()
        while True:
            t += step_s
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            for tr in list(running):
                left = running[tr] - 1
                if left > 0:
                    running[tr] = left
                    tr.write(frame)
                else:
                    del running[tr]
                    tr.write(frame + end)

    asyncio.run(main())


def ours(url: str, conc: int, tokens: int, n: int, loop: str, transport: str = "h1") -> tuple[float, Any]:
    """Our client and sweep at one level, on the standard asyncio loop or uvloop, over either HTTP
    transport: (chunks/s, LevelResult)."""
    reqs = [RequestSpec(i, "x", tokens, 8) for i in range(n)]
    w0 = time.perf_counter()
    lr = run_sync(run_level(Client(url, "zero", transport=transport), reqs, Level(f"c{conc}", conc), warmup=0, flush=False),
                  fast_loop=loop == "uvloop")
    wall = time.perf_counter() - w0
    return sum(len(r.chunk_times) for r in lr.records) / wall, lr


def ours_workers(url: str, conc: int, tokens: int, n: int, w: int, ex: Any) -> tuple[float, Any]:
    """The same level split over `w` worker processes (bench --workers), records merged."""
    reqs = [RequestSpec(i, "x", tokens, 8) for i in range(n)]
    w0 = time.perf_counter()
    lr = run_sync(workers.run_level_workers(ex, Client(url, "zero"), None, reqs, Level(f"c{conc}", conc), w, warmup=0,
                                            flush=False), fast_loop=True)
    wall = time.perf_counter() - w0 - workers.START_MARGIN_S
    return sum(len(r.chunk_times) for r in lr.records) / wall, lr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256, help="chunks per request")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--send-overhead", action="store_true",
                    help="instead: TTFT at concurrency 1 and 32 against a scripted 150 ms server, audited on its clock")
    ap.add_argument("--workers", type=int, default=2, help="also run our client split over this many processes (0: not)")
    ap.add_argument("--lag", type=float, default=0, metavar="CHUNKS_PER_S",
                    help="instead: event-loop lag while ingesting this many chunks/s, paced by the server (e.g. 20000)")
    a = ap.parse_args()
    if a.send_overhead:
        return send_overhead()
    if a.lag:
        return lag_at(a.lag, w=a.workers)
    sg = sglang_client_available()
    print("SGLang's client (sglang.benchmark.serving in .venv-serving): " + (sg or "importable"))
    port = free_port()
    p = mp.Process(target=serve, args=(port, a.tokens), daemon=True)
    p.start()
    url = f"http://127.0.0.1:{port}"
    time.sleep(1.0)
    ex = workers.pool(a.workers) if a.workers > 1 else None
    try:
        for conc in (64, 256):
            n = conc * a.requests_per_stream
            rates = {}
            for transport, loop in (("h1", "asyncio"), ("h1", "uvloop"), ("aiohttp", "asyncio"), ("aiohttp", "uvloop")):
                rate, lr = ours(url, conc, a.tokens, n, loop, transport)
                rates[f"{transport}, {loop}"] = rate
                ok = sum(r.ok for r in lr.records)
                print(f"concurrency {conc}, ours ({transport}, {loop}): {ok}/{n} ok, {rate:,.0f} chunks/s (CPU share {lr.cpu_share:.0%}); "
                      f"loop lag p50 {lr.lag_ms['p50']:.2f} ms, p99 {lr.lag_ms['p99']:.2f} ms; client-bound: {lr.client_bound}")
            if ex is not None:
                rate, lr = ours_workers(url, conc, a.tokens, n, a.workers, ex)
                rates[f"{a.workers} workers"] = rate
                print(f"concurrency {conc}, ours on {a.workers} worker processes (h1, uvloop): {sum(r.ok for r in lr.records)}/{n} ok, "
                      f"{rate:,.0f} chunks/s; loop lag p99 {lr.lag_ms['p99']:.2f} ms (all workers)")
            if not sg:
                r = sglang_run(url, conc, a.tokens, n)
                if "failed" in r:
                    print(f"  SGLang's client, same server and level: failed: {r['failed']}")
                else:
                    theirs = r["completed"] * a.tokens / r["duration"]
                    print(f"  SGLang's client, same server and level: {r['completed']}/{n} ok, {theirs:,.0f} chunks/s; "
                          "ratio ours/theirs " + ", ".join(f"{v / theirs:.2f} ({k})" for k, v in rates.items()))
    finally:
        if ex is not None:
            ex.shutdown()
        p.terminate()
        p.join(5)


def lag_at(chunks_per_s: float, conc: int = 64, tokens: int = 256, w: int = 0) -> None:
    """The server writes every chunk on its own, in decode steps (serve_steps), so that `conc` streams
    together deliver `chunks_per_s`; our client's event-loop lag is what it shows while keeping up."""
    port = free_port()
    p = mp.Process(target=serve_steps, args=(port, tokens, conc / chunks_per_s), daemon=True)
    p.start()
    time.sleep(1.0)
    url = f"http://127.0.0.1:{port}"
    try:
        for transport in TRANSPORTS:
            for loop in ("asyncio", "uvloop"):
                rate, lr = ours(url, conc, tokens, conc * 2, loop, transport)
                print(f"paced at {chunks_per_s:,.0f} chunks/s, concurrency {conc}, ours ({transport}, {loop}): ingested "
                      f"{rate:,.0f} chunks/s; loop lag p50 {lr.lag_ms['p50']:.2f} ms, p99 {lr.lag_ms['p99']:.2f} ms; "
                      f"CPU share {lr.cpu_share:.0%}")
        if w > 1:
            ex = workers.pool(w)
            try:
                rate, lr = ours_workers(url, conc, tokens, conc * 2, w, ex)
            finally:
                ex.shutdown()
            print(f"paced at {chunks_per_s:,.0f} chunks/s, concurrency {conc}, ours on {w} worker processes (h1, uvloop): "
                  f"ingested {rate:,.0f} chunks/s; loop lag p50 {lr.lag_ms['p50']:.2f} ms, p99 {lr.lag_ms['p99']:.2f} ms; "
                  f"CPU share (busiest worker) {lr.cpu_share:.0%}")
    finally:
        p.terminate()
        p.join(5)


_SGLANG_WRAPPER = ("import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); import sglang_env; sglang_env.install(); "
                   "sys.argv[0] = 'serving'; runpy.run_module('sglang.benchmark.serving', run_name='__main__')")


def sglang_run(url: str, conc: int, tokens: int, n: int) -> dict:
    """SGLang's own Python client (sglang.benchmark.serving, sglang-oai backend) on the same server:
    its result line (completed, duration, median_ttft_ms, …), or {"failed": why}."""
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
            return {"failed": (cp.stderr.strip().splitlines() or ["?"])[-1][:200]}
        return json.loads(out.read_text().splitlines()[-1])


def sglang_ceiling(url: str, conc: int, tokens: int, n: int) -> str:
    """chunks/s = completed requests × chunks per request / SGLang's measured duration."""
    r = sglang_run(url, conc, tokens, n)
    if "failed" in r:
        return "failed: " + r["failed"]
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
    sg = sglang_client_available()
    port = free_port()
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as f:
        log = f.name
    p = mp.Process(target=serve_at_socket, args=(port, tokens, ttft_s, log), daemon=True)
    p.start()
    time.sleep(1.0)
    try:
        import numpy as np

        from runbook.bench import metrics

        for conc in (1, 32):
            reqs = [RequestSpec(i, f"c{conc}r{i}", tokens, 8) for i in range(conc * 4)]
            lr = run_sync(run_level(Client(f"http://127.0.0.1:{port}", "zero"), reqs, Level(f"c{conc}", conc), warmup=conc,
                                    flush=False), fast_loop=True)
            ttft = [metrics.ttft_s(r) for r in lr.records if r.ok]
            q = [r.queue_s for r in lr.records]
            ours = float(np.median(ttft)) * 1000
            server = {w[0]: (float(w[1]), float(w[2])) for w in (ln.split() for ln in Path(log).read_text().splitlines()) if len(w) == 3}
            pairs = [(r, server[f"c{conc}r{r.id}"]) for r in lr.records if r.ok and f"c{conc}r{r.id}" in server]
            send_err = np.median([(sv[0] - r.send_time) * 1000 for r, sv in pairs])
            recv_err = np.median([(r.chunk_times[0] - sv[1]) * 1000 for r, sv in pairs])
            truth = np.median([(sv[1] - sv[0]) * 1000 for r, sv in pairs])
            # per request, our TTFT minus the server's own (receipt → first write): the client's error, paired
            err = np.percentile([(metrics.ttft_s(r) - (sv[1] - sv[0])) * 1000 for r, sv in pairs], [50, 90])
            print(f"concurrency {conc}: TTFT p50 {ours:.2f} ms (scripted {ttft_s * 1000:.0f} ms; the server's own receipt → "
                  f"first write p50 {truth:.2f} ms); client queue p50 {np.median(q) * 1000:.2f} ms\n"
                  f"  audited on the server's clock: our send stamp → server receipt p50 {send_err:.2f} ms, "
                  f"server write → our arrival stamp p50 {recv_err:.2f} ms, TTFT above the server's own p50 {ours - truth:+.2f} ms\n"
                  f"  per request, our TTFT minus the server's own: p50 {err[0]:+.2f} ms, p90 {err[1]:+.2f} ms")
            if not sg:
                r = sglang_run(f"http://127.0.0.1:{port}", conc, tokens, len(reqs))
                print("  SGLang's client, same server and level: " + (
                    f"failed: {r['failed']}" if "failed" in r else
                    f"TTFT p50 {r['median_ttft_ms']:.2f} ms; ours minus theirs {ours - r['median_ttft_ms']:+.2f} ms"))
    finally:
        p.terminate()
        p.join(5)
        Path(log).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
