"""A scripted OpenAI-style SSE server whose timings are known, for asserting metric arithmetic.

Each request follows `Script`: TTFT delay, then chunks of `tokens_per_chunk` tokens every `gap_s`.
With a VirtualClock the server sets the clock to each chunk's scripted time just before writing it,
so a client reading that clock on arrival measures exactly the script (plus nothing).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass, field

from aiohttp import web


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Script:
    ttft_s: float = 0.2
    gap_s: float = 0.05
    tokens: int = 10
    tokens_per_chunk: int = 1
    continuous_usage: bool = True
    final_usage: bool = True
    usage_gap_s: float = 0.25          # the trailing usage-only chunk comes this long after the last token
    chat: bool = False
    reasoning_chunks: int = 0          # chat: the first N chunks are reasoning_content
    fault: str | None = None        # http500 | stall | close | malformed
    close_after: bool = False          # drop the connection after each response, like llama-server
    real_sleep_s: float = 0.01         # with a VirtualClock: real pause between writes
    prompt_tokens: int = 7
    metrics_text: str = "# TYPE demo_generation_tokens_total counter\ndemo_generation_tokens_total 0\n"
    served: list = field(default_factory=list)


class ThreadedApp:
    """An aiohttp app on 127.0.0.1:<free port> in its own thread and event loop: `start()` returns self with
    `url` set, `stop()` cancels the in-flight handlers and joins. Subclasses add their routes in `routes()`."""

    backlog = 128

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def start(self):
        self._ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            app = web.Application()
            self.routes(app)
            self.runner = web.AppRunner(app, handle_signals=False)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0, backlog=self.backlog)
            self.loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            self._ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        async def _stop() -> None:
            me = asyncio.current_task()
            for t in asyncio.all_tasks():
                if t is not me:
                    t.cancel()
            await self.runner.cleanup()

        with contextlib.suppress(Exception):  # a handler cancelled mid-write is fine at shutdown
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class ScriptedServer(ThreadedApp):
    def __init__(self, script: Script, clock: VirtualClock | None = None):
        self.script, self.clock = script, clock
        self.generated = 0
        self.url = ""
        self._ready = threading.Event()

    async def _pause(self, virtual_t: float, real: float) -> None:
        if self.clock is not None:
            await asyncio.sleep(self.script.real_sleep_s)
            self.clock.now = virtual_t
        else:
            await asyncio.sleep(real)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        s = self.script
        body = await request.json()
        s.served.append(body)
        if s.fault == "http500":
            return web.json_response({"error": "boom"}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        t0 = self.clock.now if self.clock else 0.0
        n = int(body.get("max_tokens", s.tokens)) if body.get("ignore_eos") else s.tokens
        chunks = [s.tokens_per_chunk] * (n // s.tokens_per_chunk) + ([n % s.tokens_per_chunk] if n % s.tokens_per_chunk else [])
        done_tokens = 0
        t = t0 + s.ttft_s
        for k, c in enumerate(chunks):
            await self._pause(t, s.ttft_s if k == 0 else s.gap_s)
            if s.fault == "stall" and k == 1:
                await asyncio.sleep(3600)
            if s.fault == "close" and k == 2:
                request.transport.close()
                return resp
            if s.fault == "malformed" and k == 1:
                await resp.write(b"data: {not json\n\n")
                continue
            done_tokens += c
            self.generated += c
            text = "".join(f" t{done_tokens - c + j}" for j in range(c))
            if s.chat:
                key = "reasoning_content" if k < s.reasoning_chunks else "content"
                choice = {"index": 0, "delta": {key: text}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "finish_reason": None}
            msg = {"choices": [choice]}
            if s.continuous_usage:
                msg["usage"] = {"prompt_tokens": s.prompt_tokens, "completion_tokens": done_tokens}
            await resp.write(f"data: {json.dumps(msg)}\n\n".encode())
            t += s.gap_s
        t_last = t - s.gap_s
        fin = {"choices": [{"index": 0, "text": "", "delta": {}, "finish_reason": "length"}]}
        await resp.write(f"data: {json.dumps(fin)}\n\n".encode())
        if s.final_usage:
            await self._pause(t_last + s.usage_gap_s, s.usage_gap_s)
            usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": done_tokens}
            if s.reasoning_chunks:
                usage["completion_tokens_details"] = {"reasoning_tokens": s.reasoning_chunks * s.tokens_per_chunk}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        if s.close_after:
            request.transport.close()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "scripted"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        text = self.script.metrics_text.replace("demo_generation_tokens_total 0", f"demo_generation_tokens_total {self.generated}")
        return web.Response(text=text, content_type="text/plain")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
