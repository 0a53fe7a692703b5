"""HTTP/1.1 streaming for the benchmark's hot path: asyncio protocols over httptools (llhttp, in C).

Why not aiohttp here: when a server writes every chunk on its own, each read in aiohttp wakes a
future, a task and a StreamReader before our code sees the bytes (about 50 µs of CPU per read on the
2-core reference VM, so 20k chunks/s took the whole core and the loop lagged). Here a response's body
goes from the socket's `data_received`, stamped once per read, to the request's sink (SSE parser and
chunk handler) in a callback right after the loop's reads; the request's coroutine wakes once, at the end.
Flush, /metrics, telemetry and the probes still go through aiohttp.

`Pool`: keep-alive connections to one origin (TLS for https), at most `limit` in use (0: no cap; the
wait for one is the request's queue time). A connection goes back only after its response's last
byte, when the server allows keep-alive. Framing (Content-Length, chunked, or until close) and the
status line are llhttp's; a response that breaks HTTP is that request's `malformed`.
"""
from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any, Protocol

import httptools
from yarl import URL


class Sink(Protocol):
    """What a request gives its connection; every method runs inside data_received or connection_lost."""

    def on_headers(self, status: int, headers: dict[str, str]) -> None: ...

    def on_body(self, body: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_lost(self, exc: BaseException | None, got_response: bool, framed: bool) -> None: ...

    def on_error(self, exc: BaseException) -> None: ...


class HeaderError(ValueError):
    """A header value that cannot go on the wire (a line break would start a header of its own)."""


def head(method: str, url: URL, headers: dict[str, str]) -> bytes:
    """The request line and headers, Content-Length excluded (added per body)."""
    host = url.raw_host or ""
    hostport = f"[{host}]" if ":" in host else host
    if not url.is_default_port():
        hostport += f":{url.port}"
    lines = [f"{method} {url.raw_path_qs or '/'} HTTP/1.1", f"Host: {hostport}"]
    for k, v in headers.items():
        if any(c in v or c in k for c in "\r\n\0"):
            raise HeaderError(f"header {k!r} holds a line break or NUL")
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


class Conn(asyncio.Protocol):
    __slots__ = ("pool", "transport", "parser", "sink", "now", "_reads", "abandoned", "lost", "got_response", "framed",
                 "_headers", "_interim", "reused")

    def __init__(self, pool: Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.now = 0.0                      # the read being parsed: its arrival time, on the pool's clock
        self._reads: list[tuple[float, bytes]] = []     # arrived, not yet parsed
        self.abandoned = False              # aborted by us: what is still unparsed is never read
        self.lost = False
        self.got_response = False           # any byte of the current response seen
        self.framed = False                 # Content-Length or chunked (else the body runs until close)
        self._headers: dict[str, str] = {}
        self._interim = False               # a 1xx response (100 Continue, 103 Early Hints): skipped
        self.reused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport          # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Stamped on arrival, parsed once the loop has run every read its poll delivered (call_soon runs after
        # them): under load many connections become readable at once, and a read stamped only after the reads
        # before it were parsed would be late by their parsing (32 at once: about 1.5 ms for the last).
        self._reads.append((self.pool.clock(), data))
        if len(self._reads) == 1:
            asyncio.get_running_loop().call_soon(self._parse)

    def _parse(self) -> None:
        reads, self._reads = self._reads, []
        for now, data in reads:
            if self.abandoned:
                return                      # given up by an earlier read's response: the rest is never read
            self.now = now
            if self.sink is None and self not in self.pool._busy:
                self.abandon()              # bytes nobody asked for on an idle connection: not reusable
                return
            self.got_response = True
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserCallbackError as e:
                self._fail(e.__cause__ or e.__context__ or e)
            except httptools.HttpParserUpgrade:
                self._fail(httptools.HttpParserError("the server switched protocols"))
            except httptools.HttpParserError as e:
                self._fail(e)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._parse()                       # what arrived before the close is the response's, not lost
        self.lost = True
        self.pool.forget(self)
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.on_lost(exc, self.got_response, self.framed)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        k = name.decode("latin-1").lower()
        v = value.decode("latin-1")
        self._headers[k] = f"{self._headers[k]}, {v}" if k in self._headers else v

    def on_headers_complete(self) -> None:
        h = self._headers
        # llhttp ends a 1xx response at its headers and parses the real one next (101 raises Upgrade)
        self._interim = 100 <= self.parser.get_status_code() < 200
        if self._interim:
            return
        self.framed = "content-length" in h or "chunked" in h.get("transfer-encoding", "").lower()
        if self.sink is not None:
            self.sink.on_headers(self.parser.get_status_code(), h)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None and not self._interim:
            self.sink.on_body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        sink, self.sink = self.sink, None
        if sink is None and self not in self.pool._busy:
            self.abandon()                  # a second response in the same read: the server is out of step
            return
        keep = self.parser.should_keep_alive()
        if sink is not None:
            sink.on_end()
        self.pool.release(self, keep)

    # requests
    def start(self, sink: Sink, data: bytes) -> None:
        self.sink, self.got_response, self.framed = sink, False, False
        assert self.transport is not None
        self.transport.write(data)

    def abandon(self, sink: Sink | None = None) -> None:
        """The request gave up (timeout, its own error) or the response never ended after [DONE]: the
        rest of it is never read, so the connection cannot be reused. `sink`: only if still serving it."""
        if sink is not None and self.sink is not sink:
            return
        self.sink = None
        self.abandoned = True
        if self.transport is not None and not self.lost:
            self.transport.abort()
        self.pool.release(self, False)

    def _fail(self, exc: BaseException) -> None:
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.on_error(exc)
        self.abandon()


class Pool:
    """Keep-alive HTTP/1.1 connections to one origin; `clock` stamps every read. `limit` caps requests
    in flight (`acquire` … `done`); a connection is busy until its response's last byte, which can come
    a read after the request is complete ([DONE] before the chunked terminator)."""

    def __init__(self, base_url: str, limit: int, clock: Any, connect_timeout_s: float = 30.0):
        self.url = URL(base_url)
        if self.url.scheme not in ("http", "https") or not self.url.raw_host or self.url.port is None:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host: str = self.url.raw_host
        self.port: int = self.url.port
        self.limit, self.clock, self.connect_timeout_s = limit, clock, connect_timeout_s
        self._idle: deque[Conn] = deque()
        self._open: set[Conn] = set()
        self._busy: set[Conn] = set()
        self._sem: asyncio.Semaphore | None = None
        self._ssl: ssl.SSLContext | None = None
        self.closed = False

    async def acquire(self) -> Conn:
        """A connection for one request; call `done()` when the request is over, however it ended."""
        if self.limit:
            if self._sem is None:
                self._sem = asyncio.Semaphore(self.limit)
            await self._sem.acquire()
        try:
            while self._idle:
                c = self._idle.pop()
                if not c.lost and c.transport is not None and not c.transport.is_closing():
                    c.reused = True
                    self._busy.add(c)
                    return c
            c = await self._connect()
            self._busy.add(c)
            return c
        except BaseException:
            if self._sem is not None:
                self._sem.release()
            raise

    async def _connect(self) -> Conn:
        loop = asyncio.get_running_loop()
        kw: dict[str, Any] = {}
        if self.url.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            kw = {"ssl": self._ssl, "server_hostname": self.host}
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: Conn(self), self.host, self.port, **kw), self.connect_timeout_s)
        self._open.add(proto)
        return proto

    def done(self) -> None:
        if self._sem is not None:
            self._sem.release()

    def release(self, c: Conn, keep: bool) -> None:
        """The connection's response is over: idle for the next request, or closed."""
        if c not in self._busy:
            return
        self._busy.discard(c)
        if keep and not c.lost and not self.closed:
            self._idle.append(c)
        elif not c.lost and c.transport is not None:
            c.transport.close()

    def forget(self, c: Conn) -> None:
        self._open.discard(c)
        if c in self._idle:     # a membership test, not try/except: no exception raised for a busy connection
            self._idle.remove(c)

    def close(self) -> None:
        self.closed = True
        for c in list(self._open):
            if c.transport is not None:
                c.transport.abort() if c in self._busy else c.transport.close()
        self._idle.clear()
