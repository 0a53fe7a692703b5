"""A scripted HTTP server that writes exactly the bytes a test gives it, for SSE edge cases.

`handler(body) -> Reply`; a Reply is a status, headers and a list of (virtual time, bytes) writes.
With a VirtualClock the server sets the clock to each write's time just before writing it (and
pauses `real_gap_s` for real between writes), so a client reading that clock measures the script.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from sse_server import ThreadedApp


@dataclass
class Reply:
    writes: list[tuple[float, bytes]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold_s: float = 0.0                 # real sleep before the first write


def sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def completion_stream(tokens: int, ttft: float, gap: float, per_chunk: int = 1, usage: str = "continuous",
                      finish: str = "length", prompt_tokens: int = 7, chat: bool = False) -> list[tuple[float, bytes]]:
    """usage: continuous | last_chunk (only on the last content chunk) | final (trailing chunk) | none."""
    out = []
    sizes = [per_chunk] * (tokens // per_chunk) + ([tokens % per_chunk] if tokens % per_chunk else [])
    done = 0
    for k, c in enumerate(sizes):
        done += c
        text = "".join(f" t{done - c + j}" for j in range(c))
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        msg: dict[str, Any] = {"choices": [dict(choice, finish_reason=None)]}
        if usage == "continuous" or (usage == "last_chunk" and k == len(sizes) - 1):
            msg["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": done}
        out.append((ttft + k * gap, sse(msg)))
    t_last = ttft + (len(sizes) - 1) * gap
    out.append((t_last, sse({"choices": [{"index": 0, "text": "", "delta": {}, "finish_reason": finish}]})))
    if usage == "final":
        out.append((t_last + 0.1, sse({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": done}})))
    out.append((t_last + 0.1, b"data: [DONE]\n\n"))
    return out


class RawServer(ThreadedApp):
    backlog = 1024   # open-loop tests put hundreds of connections in flight

    def __init__(self, handler: Callable[[dict], Reply], clock: Any = None, real_gap_s: float = 0.005,
                 metrics: Callable[[], str] | None = None):
        self.handler, self.clock, self.real_gap_s, self.metrics_fn = handler, clock, real_gap_s, metrics
        self.seen: list[tuple[str, str]] = []        # (method, path)
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""
        self._ready = threading.Event()

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path))
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "raw"}]})
        if request.path == "/metrics":
            if self.metrics_fn is None:
                return web.Response(status=404)
            return web.Response(text=self.metrics_fn(), content_type="text/plain")
        if request.method != "POST":
            return web.json_response({"error": "only POST"}, status=405)
        try:
            body = await request.json()
        except Exception:
            body = {}
        self.bodies.append(body)
        reply = self.handler(body)
        if 300 <= reply.status < 400:
            return web.Response(status=reply.status, headers=reply.headers)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(status=reply.status, headers={"Content-Type": "text/event-stream", **reply.headers})
            await resp.prepare(request)
            if reply.hold_s:
                await asyncio.sleep(reply.hold_s)
            t_prev = 0.0
            for t, data in reply.writes:
                if self.clock is not None:
                    await asyncio.sleep(self.real_gap_s)
                    self.clock.now = t
                else:
                    await asyncio.sleep(max(0.0, t - t_prev))
                    t_prev = t
                await resp.write(data)
            await resp.write_eof()
            return resp
        finally:
            self.in_flight -= 1

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._any)
