"""The streamed requests' HTTP client, behind one interface: `Transport`.

A transport is one level's bounded pool of connections to one origin. `Transport.open` makes the
level's aiohttp session (its flush, /metrics and telemetry go through aiohttp whatever the transport)
with the transport opened on the session's connector, closed with the session. `stream` sends one
request and feeds the response body, each read stamped on arrival, to the request's `Stream` (the SSE
parser and the client's chunk handler, the same for every transport). A transport's whole contract:

- stamp `rec.send_time` when the request has its connection, just before it goes on the wire (the wait
  for a pooled connection before it is the request's queue time, not TTFT; a stamp after the write can
  come after the answer) and set `rec.status` from the status line;
- return whether the stream ended at `[DONE]` (else it ended when the body did);
- raise `Failure(kind, message)` with one of the client's error kinds for what went wrong (connect,
  http_4xx/5xx via `Stream.http_error`, redirect via `Stream.status`, stream_closed, malformed),
  `ReusedConnectionClosed` when a pooled connection turned out closed before any response byte (the
  client retries once), and let `asyncio.TimeoutError` through (the client's `timeout`).

Two: `H1Transport` (endpoint/h1.py: a response's reads go to the parser inside `data_received`, one
wake-up per request; why: h1.py) and `AiohttpTransport`. A third is one subclass and one entry in
`client.TRANSPORT_TABLE` (or `client.register_transport`).
"""
from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from runbook.endpoint.sse import SSEParser, SSETooLarge

if TYPE_CHECKING:
    from runbook.endpoint import h1

if TYPE_CHECKING:
    import aiohttp

DONE_GRACE_S = 2.0               # after [DONE], how long a response may take to end before its connection is dropped

# Client._event: (data, event name, arrival time, record, cumulative counts, text, reasoning) -> True at [DONE]
EventHandler = Callable[[bytes, bytes, float, Any, "list[int | None]", "list[str]", "list[str]"], bool]


class Failure(Exception):
    """This request's own failure, as one of the client's error kinds."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind, self.msg = kind, msg


class ReusedConnectionClosed(Exception):
    """A pooled connection the server had already closed: no response byte came. Not a failed request."""


class Stream:
    """One request's response -> its record: the SSE parser, and the client's chunk handler per event."""
    __slots__ = ("event", "rec", "parser", "cum", "text", "reasoning")

    def __init__(self, event: EventHandler, rec: Any):
        self.event, self.rec = event, rec
        self.parser = SSEParser()
        self.cum: list[int | None] = []     # completion_tokens seen on each output chunk, if any
        self.text: list[str] = []              # joined once at the end: no copy per chunk
        self.reasoning: list[str] = []

    def status(self, status: int, location: str) -> None:
        """The status line: recorded; a redirect is this request's failure (a POST is not re-sent)."""
        self.rec.status = status
        if 300 <= status < 400:
            raise Failure("redirect", f"HTTP {status} to {location[:200]}: a POST is not re-sent to a redirect; "
                                      "give the final URL")

    def http_error(self, body: bytes) -> Failure:
        """An HTTP error status, with the start of its body quoted."""
        status = self.rec.status or 0
        text = body[:300].decode("utf-8", errors="replace")
        return Failure("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: {text}")

    def feed(self, data: bytes, now: float) -> bool:
        """One read of the body, stamped `now` on arrival; True at [DONE]. Raises Failure."""
        try:
            events = self.parser.feed(data)
        except SSETooLarge as e:
            raise Failure("malformed", str(e)) from None
        return self._dispatch(events, now)

    def close(self, now: float) -> bool:
        """The body ended: an event left without its blank line is dispatched; True at [DONE]."""
        return self._dispatch(self.parser.close(), now)

    def _dispatch(self, events: list[tuple[bytes, bytes]], now: float) -> bool:
        event, rec, cum, text, reasoning = self.event, self.rec, self.cum, self.text, self.reasoning
        # a loop, not any() over a generator: a generator per read costs more than the event on this hot path
        for name, data in events:  # noqa: SIM110
            if event(data, name, now, rec, cum, text, reasoning):
                return True
        return False

    def join(self) -> None:
        self.rec.text, self.rec.reasoning_text = "".join(self.text), "".join(self.reasoning)


class Transport(ABC):
    """One session's streamed-request client: at most `limit` requests in flight (0: no cap)."""
    name: ClassVar[str]

    def __init__(self, base_url: str, limit: int, clock: Callable[[], float], session: aiohttp.ClientSession):
        self.base_url, self.limit, self.clock, self.session = base_url, limit, clock, session

    @classmethod
    def open(cls, base_url: str, limit: int, clock: Callable[[], float], **kw: Any) -> aiohttp.ClientSession:
        """The level's session, with this transport opened on it; its requests are stamped when their
        headers are written (aiohttp's tracing, for whatever goes through aiohttp)."""
        import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
        conn = _connector()(limit=limit, limit_per_host=limit, keepalive_timeout=30)
        session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None),
                                        trace_configs=[trace_config()], **kw)
        conn.stream_transport = cls(base_url, limit, clock, session)
        return session

    @staticmethod
    def of(session: aiohttp.ClientSession, base_url: str, clock: Callable[[], float]) -> Transport:
        """The transport `session` holds; a session of the caller's own (not from `open`) streams through
        aiohttp on it, its connector the pool (and without tracing, the send stamp is the ask)."""
        t = getattr(session.connector, "stream_transport", None)
        return t if isinstance(t, Transport) else AiohttpTransport(base_url, 0, clock, session)

    @abstractmethod
    async def stream(self, url: str, headers: dict[str, str], payload: bytes, st: Stream) -> bool:
        """Send one POST and feed its body to `st`; True when it ended at [DONE]. See the module docstring."""

    @abstractmethod
    def close(self) -> None:
        """With the session: the transport's own connections are closed."""


@functools.cache
def _connector() -> Callable[..., Any]:
    """aiohttp's connector, holding the session's transport (closed with it): a class made on first use, with aiohttp."""
    import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)

    class Connector(aiohttp.TCPConnector):
        def __init__(self, **kw: Any):
            super().__init__(**kw)
            self.stream_transport: Transport | None = None

        async def close(self, *, abort_ssl: bool = False) -> None:
            if self.stream_transport is not None:
                self.stream_transport.close()
            await super().close(abort_ssl=abort_ssl)

    return Connector


async def _on_connection(session: Any, ctx: Any, params: Any) -> None:
    t = getattr(ctx, "trace_request_ctx", None)
    if isinstance(t, dict) and "rec" in t:
        t["rec"].send_time = t["clock"]()


def trace_config() -> aiohttp.TraceConfig:
    """The send stamp once the request has its connection, before its headers are written (as h1 stamps)."""
    import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
    tc = aiohttp.TraceConfig()
    tc.on_connection_reuseconn.append(_on_connection)
    tc.on_connection_create_end.append(_on_connection)
    return tc


class AiohttpTransport(Transport):
    """Over the session's own aiohttp connector; send time from its request tracing."""
    name = "aiohttp"

    def close(self) -> None:
        pass                                         # its connections are the session's connector's

    async def stream(self, url: str, headers: dict[str, str], payload: bytes, st: Stream) -> bool:
        import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
        got_headers = False
        try:
            async with self.session.post(url, data=payload, headers=headers, allow_redirects=False,
                                         trace_request_ctx={"rec": st.rec, "clock": self.clock}) as resp:
                got_headers = True
                st.status(resp.status, resp.headers.get("Location", "?"))
                if resp.status >= 400:
                    raise st.http_error(await resp.content.read(300))
                clock, feed = self.clock, st.feed
                async for piece in resp.content.iter_any():
                    if feed(piece, clock()):         # stamped on arrival, before parsing
                        return True
                return st.close(clock())
        except asyncio.TimeoutError:
            raise                                    # aiohttp's own timeouts are TimeoutErrors too
        except aiohttp.ClientConnectorError as e:
            raise Failure("connect", str(e)) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if not got_headers:                      # a pooled connection the server had closed
                raise ReusedConnectionClosed() from e
            raise Failure("stream_closed", f"{type(e).__name__}: {e}") from None
        except aiohttp.ClientResponseError as e:     # aiohttp's HTTP parser refused the response
            raise Failure("malformed", f"the response is not valid HTTP/1.1: {e.message}"[:300]) from None
        except (aiohttp.ClientPayloadError, ConnectionResetError) as e:
            raise Failure("stream_closed", f"{type(e).__name__}: {e}") from None
        except aiohttp.ClientError as e:
            raise Failure("connect", f"{type(e).__name__}: {e}") from None


class H1Transport(Transport):
    """Over endpoint/h1.py's pool: the body is parsed inside the connection's data_received."""
    name = "h1"

    def __init__(self, base_url: str, limit: int, clock: Callable[[], float], session: aiohttp.ClientSession):
        from runbook.endpoint import h1  # lazy: httptools and yarl only when a request is sent (the CLI's start-up stays light)
        super().__init__(base_url, limit, clock, session)
        self.pool = h1.Pool(base_url, limit, clock)
        self._head: bytes | None = None

    def close(self) -> None:
        self.pool.close()

    async def stream(self, url: str, headers: dict[str, str], payload: bytes, st: Stream) -> bool:
        from runbook.endpoint import h1  # lazy: httptools and yarl only when a request is sent (the CLI's start-up stays light)
        if self._head is None:
            try:
                self._head = h1.head("POST", h1.URL(url), headers)
            except h1.HeaderError as e:
                raise Failure("client_error", str(e)) from None
        pool = self.pool
        try:
            conn = await pool.acquire()
        except (OSError, asyncio.TimeoutError) as e:
            u = pool.url
            raise Failure("connect", f"cannot connect to {u.host}:{u.port}: {type(e).__name__}: {e}"[:300]) from None
        loop = asyncio.get_running_loop()
        sink = _Sink(st, conn, loop.create_future())
        ok = False
        try:
            # Stamped before the write, not after: the write can hand the GIL to another thread or lose the CPU, and a
            # server that answers meanwhile would show a first token "0.2 ms after sending" (seen under load and in
            # tune's runs). From here only the non-blocking write is between the stamp and the wire.
            st.rec.send_time = self.clock()
            conn.start(sink, self._head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
            done = await sink.fut
            ok = True
            return done
        finally:
            pool.done()
            if conn.sink is sink:                    # the response is not over
                if ok:                               # [DONE] came before its last byte: give that a moment
                    loop.call_later(DONE_GRACE_S, conn.abandon, sink)
                else:
                    conn.abandon(sink)


class _Sink:
    """One streamed request on an h1 connection (h1.Sink): its Stream, run inside the connection's
    data_received; `fut` resolves once, at the end."""
    __slots__ = ("st", "conn", "fut", "errbody", "headers_seen")

    def __init__(self, st: Stream, conn: h1.Conn, fut: asyncio.Future[bool]):
        self.st, self.conn, self.fut = st, conn, fut
        self.errbody: bytearray | None = None
        self.headers_seen = False

    def _end(self, exc: BaseException | None = None, done: bool = False) -> None:
        if self.fut.done():
            return
        if exc is None:
            self.fut.set_result(done)
        else:
            self.fut.set_exception(exc)

    def on_headers(self, status: int, headers: dict[str, str]) -> None:
        self.headers_seen = True
        try:
            self.st.status(status, headers.get("location", "?"))
        except Failure as e:
            self._end(e)
            return
        if status >= 400:
            self.errbody = bytearray()
        elif headers.get("content-encoding", "identity").lower() not in ("", "identity"):
            self._end(Failure("malformed", f"the stream is {headers['content-encoding'][:40]}-encoded; "
                                           "it was not asked for (no Accept-Encoding)"))

    def _http_error(self) -> None:
        self._end(self.st.http_error(bytes(self.errbody or b"")))

    def on_body(self, body: bytes) -> None:
        if self.fut.done():
            return
        if self.errbody is not None:
            self.errbody += body
            self._http_error()
            return
        try:
            if self.st.feed(body, self.conn.now):
                self._end(done=True)
        except Exception as e:  # this request's own failure, never the level's
            self._end(e)

    def on_end(self) -> None:
        if self.fut.done():
            return
        if self.errbody is not None:
            self._http_error()
            return
        try:
            done = self.st.close(self.conn.pool.clock())
        except Exception as e:  # this request's own failure, never the level's
            self._end(e)
            return
        self._end(done=done)

    def on_lost(self, exc: BaseException | None, got_response: bool, framed: bool) -> None:
        if self.fut.done():
            return
        if not got_response:
            self._end(ReusedConnectionClosed())
        elif self.errbody is not None:
            self._http_error()
        elif self.headers_seen and not framed:
            self.on_end()            # a body without Content-Length or chunking ends when the connection does
        else:
            why = f" ({type(exc).__name__}: {exc})" if exc else ""
            self._end(Failure("stream_closed", f"connection closed mid-response{why}"))

    def on_error(self, exc: BaseException) -> None:
        from runbook.endpoint import h1  # lazy: httptools and yarl only when a request is sent (the CLI's start-up stays light)
        if isinstance(exc, (Failure, ReusedConnectionClosed)):
            self._end(exc)
        elif isinstance(exc, h1.httptools.HttpParserError):
            self._end(Failure("malformed", f"the response is not valid HTTP/1.1: {str(exc)[:200]}"))
        else:
            self._end(exc)
