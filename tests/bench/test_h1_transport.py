"""The h1 transport (endpoint/h1.py) beside aiohttp, differentially: the same bytes from a real TCP server,
the same request record from both, for well-formed streams cut anywhere and for every way HTTP breaks."""
import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tcpserver import tcp_server

from runbook.endpoint import h1
from runbook.endpoint import transport as transport_mod
from runbook.endpoint.client import TRANSPORTS, Client, RequestSpec

Handler = Callable[[socket.socket, int], bool]     # (conn, request index on this connection) -> keep the connection


def _read_request(conn: socket.socket, buf: bytes) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        got = conn.recv(65536)
        if not got:
            return None
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        got = conn.recv(65536)
        if not got:
            return None
        rest += got
    return rest[n:]


def tcp(handler: Handler) -> AbstractContextManager[str]:
    """A loopback server writing exactly what `handler` writes, request after request on a connection."""
    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf: bytes | None = b""
        k = 0
        while True:
            buf = _read_request(conn, buf or b"")
            if buf is None or not handler(conn, k):
                return
            k += 1
    return tcp_server(serve)


def events(n: int = 4, done: bool = True) -> list[bytes]:
    out = [b"data: " + json.dumps({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": i + 1}}).encode() + b"\n\n"
           for i in range(n)]
    out.append(b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}\n\n')
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def chunked(parts: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in parts]


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def writes(*parts: bytes, gap: float = 0.002, keep: bool = True) -> Handler:
    def h(conn: socket.socket, _k: int) -> bool:
        for p in parts:
            conn.sendall(p)
            time.sleep(gap)
        return keep
    return h


def send(url: str, transport: str, n: int = 1, conc: int = 1, max_tokens: int = 4, **kw):
    async def go():
        c = Client(url, "m", transport=transport, **kw)
        async with c.session(limit=conc) as s:
            return [await c.send(s, RequestSpec(i, "x", max_tokens)) for i in range(n)]
    return asyncio.run(go())


def view(r) -> tuple:
    return (r.ok, r.error_kind, r.status, r.text, len(r.chunk_times), sum(r.chunk_tokens), r.finish_reason)


def both(url: str, **kw) -> list:
    """Both transports' records for the same requests; they must agree field by field."""
    got = {t: [view(r) for r in send(url, t, **kw)] for t in TRANSPORTS}
    assert got["h1"] == got["aiohttp"], got
    return got["h1"]


# -- well-formed streams ------------------------------------------------------------------------------

def test_chunked_stream_one_write_per_event_and_keep_alive():
    with tcp(writes(HEAD_CHUNKED, *chunked(events()), b"0\r\n\r\n")) as url:
        recs = both(url, n=3)
    assert all(r[0] and r[3] == " t0 t1 t2 t3" and r[4] == 4 and r[5] == 4 for r in recs)


def test_the_whole_response_in_one_write():
    with tcp(writes(HEAD_CHUNKED + b"".join(chunked([b"".join(events())])) + b"0\r\n\r\n")) as url:
        [r] = both(url)
    assert r[0] and r[4] == 4


def test_content_length_and_close_delimited_bodies():
    body = b"".join(events())
    cl = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
    with tcp(writes(cl, body)) as url:
        assert both(url, n=2)[1][0]
    eof = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    with tcp(writes(eof, *events(done=False), keep=False)) as url:     # the body ends when the server closes
        recs = both(url, n=2)
    assert all(r[0] and r[6] == "length" for r in recs)


def test_interim_1xx_responses_are_skipped_like_aiohttp_does():
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    with tcp(writes(interim, HEAD_CHUNKED, *chunked(events()), b"0\r\n\r\n")) as url:
        recs = both(url, n=2)
    assert all(r[0] and r[3] == " t0 t1 t2 t3" for r in recs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, 400), max_size=12))
def test_property_a_stream_cut_anywhere_reads_the_same(cuts):
    wire = HEAD_CHUNKED + b"".join(chunked(events())) + b"0\r\n\r\n"
    points = sorted({c % len(wire) for c in cuts} - {0})
    pieces = [wire[a:b] for a, b in zip([0] + points, points + [len(wire)], strict=True)]
    with tcp(writes(*pieces, gap=0.0005)) as url:
        [r] = both(url)
    assert r[0] and r[3] == " t0 t1 t2 t3" and r[5] == 4


def test_done_before_the_last_chunk_is_a_success_and_the_connection_is_dropped_after_the_grace(monkeypatch):
    monkeypatch.setattr(transport_mod, "DONE_GRACE_S", 0.2)

    def h(conn: socket.socket, _k: int) -> bool:
        conn.sendall(HEAD_CHUNKED + b"".join(chunked(events())))
        time.sleep(1.0)                      # the terminating chunk never comes
        return False
    with tcp(h) as url:
        recs = both(url, n=2)
    assert all(r[0] for r in recs)


# -- broken HTTP: one record each, never the level ------------------------------------------------------

@pytest.mark.parametrize("wire,kind,status", [
    (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 17\r\n\r\n{\"error\": \"oom\"}\n", "http_5xx", 500),
    (b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}", "http_4xx", 429),
    (b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/v1\r\nContent-Length: 0\r\n\r\n", "redirect", 302),
    (HEAD_CHUNKED + b"".join(chunked(events()[:2])), "stream_closed", 200),          # closed mid-response
    (HEAD_CHUNKED + b"zz\r\nnot a chunk", "malformed", None),                      # broken chunk framing
    (b"HTPT/1.1 200 OK\r\n\r\n", "malformed", None),                                # not an HTTP status line
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello", "malformed", None),
])
def test_broken_responses_are_that_requests_own_error(wire, kind, status):
    with tcp(writes(wire, keep=False)) as url:
        for t in TRANSPORTS:
            [r] = send(url, t)
            assert (r.ok, r.error_kind) == (False, kind), (t, r.error)
            assert r.status == status or status is None, t
    if kind == "http_5xx":
        assert "oom" in r.error


def test_http_error_body_is_quoted_in_the_record():
    with tcp(writes(b"HTTP/1.1 503 Busy\r\nContent-Length: 25\r\n\r\n{\"error\": \"queue full!\"}\n", keep=False)) as url:
        errs = {t: send(url, t)[0].error for t in TRANSPORTS}
    assert errs["h1"] == errs["aiohttp"] and "queue full" in errs["h1"]


def test_unrequested_content_encoding_is_refused():
    wire = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: br\r\nContent-Length: 4\r\n\r\nxxxx")
    with tcp(writes(wire, keep=False)) as url:
        [r] = send(url, "h1")
    assert r.error_kind == "malformed" and "br-encoded" in r.error


def test_headers_then_silence_times_out():
    with tcp(writes(HEAD_CHUNKED, gap=3.0)) as url:
        t0 = time.perf_counter()
        for t in TRANSPORTS:
            [r] = send(url, t, timeout_s=0.4)
            assert r.error_kind == "timeout", t
    assert time.perf_counter() - t0 < 6


def test_nothing_listening_is_connect():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    for t in TRANSPORTS:
        [r] = send(f"http://127.0.0.1:{port}", t)
        assert r.error_kind == "connect", (t, r.error)


def test_server_closing_after_every_response_costs_no_failed_request():
    """llama-server closes the connection after each stream: the pooled one is stale, not a failure."""
    with tcp(writes(HEAD_CHUNKED, *chunked(events()), b"0\r\n\r\n", keep=False)) as url:
        recs = both(url, n=4)
    assert all(r[0] for r in recs)


def test_bytes_after_the_response_do_not_leak_into_the_next_request():
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray"
    with tcp(writes(HEAD_CHUNKED + b"".join(chunked(events())) + b"0\r\n\r\n" + stray)) as url:
        recs = [view(r) for r in send(url, "h1", n=3)]
    assert all(r[0] and r[3] == " t0 t1 t2 t3" for r in recs)


def test_a_line_break_in_a_header_never_reaches_the_wire_nor_the_record():
    seen = []

    def h(conn: socket.socket, _k: int) -> bool:
        seen.append(1)
        return False
    key = "sk-secret\r\nX-Injected: 1"
    with tcp(h) as url:
        for t in TRANSPORTS:
            [r] = send(url, t, api_key=key)
            assert r.error_kind == "client_error" and "sk-secret" not in r.error, (t, r.error)
    assert not seen


def test_the_pool_caps_requests_in_flight():
    box = {"now": 0, "max": 0}
    lock = threading.Lock()

    def h(conn: socket.socket, _k: int) -> bool:
        with lock:
            box["now"] += 1
            box["max"] = max(box["max"], box["now"])
        conn.sendall(HEAD_CHUNKED)
        time.sleep(0.05)
        *body, done = chunked(events())
        for p in body:
            conn.sendall(p)
        with lock:             # before [DONE]: the server's count stays inside the client's slot, no race
            box["now"] -= 1
        conn.sendall(done + b"0\r\n\r\n")
        return True

    async def go(url: str):
        c = Client(url, "m", transport="h1")
        async with c.session(limit=3) as s:
            return await asyncio.gather(*(c.send(s, RequestSpec(i, "x", 4)) for i in range(12)))
    with tcp(h) as url:
        recs = asyncio.run(go(url))
    assert all(r.ok for r in recs) and box["max"] == 3
    assert max(r.queue_s for r in recs) > 0.05                 # the wait for a slot is queue time, not TTFT


def test_head_brackets_ipv6_and_keeps_the_port():
    assert b"Host: [::1]:8080\r\n" in h1.head("POST", h1.URL("http://[::1]:8080/v1/completions"), {})
    assert h1.head("POST", h1.URL("https://example.org/x?y=1"), {}).startswith(b"POST /x?y=1 HTTP/1.1\r\nHost: example.org\r\n")
    with pytest.raises(ValueError):
        h1.Pool("unix:///tmp/sock", 1, time.perf_counter)


def test_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="h1, aiohttp"):
        Client("http://x", transport="h2")


class _Transport:
    """What a Conn asks of its transport, nothing sent anywhere."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None: ...


class _Sink:
    """Records the connection's arrival stamp at each body read, and spends clock ticks parsing (what the
    SSE handler's work does to a wall clock)."""

    def __init__(self, conn: h1.Conn, clock: Callable[[], float]):
        self.conn, self.clock, self.stamps, self.ended, self.lost = conn, clock, [], False, False

    def on_headers(self, status: int, headers: dict[str, str]) -> None: ...

    def on_body(self, body: bytes) -> None:
        self.stamps.append(self.conn.now)
        self.clock()

    def on_end(self) -> None:
        self.ended = True

    def on_lost(self, exc: BaseException | None, got_response: bool, framed: bool) -> None:
        self.lost = True

    def on_error(self, exc: BaseException) -> None:
        raise exc


RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


def _conns(n: int):
    ticks = iter(range(1, 1000))
    clock = lambda: float(next(ticks))  # noqa: E731 - every call is one tick later
    pool = h1.Pool("http://127.0.0.1:9", 0, clock)
    conns = []
    for _ in range(n):
        c = h1.Conn(pool)
        c.connection_made(_Transport())
        c.sink = _Sink(c, clock)
        pool._busy.add(c)
        conns.append(c)
    return conns


def test_reads_of_one_poll_are_stamped_before_any_is_parsed():
    """Two connections readable in the same poll: the second's arrival stamp is taken before the first's read is
    parsed (tick 2), not after it (tick 3, what parsing in data_received gave)."""
    async def go():
        a, b = _conns(2)
        sinks = a.sink, b.sink             # a connection lets go of its sink at the response's end
        a.data_received(RESPONSE)          # tick 1
        b.data_received(RESPONSE)          # tick 2
        await asyncio.sleep(0)             # the parse callbacks: each spends a tick
        return sinks
    sa, sb = asyncio.run(go())
    assert sa.stamps == [1.0] and sb.stamps == [2.0] and sa.ended and sb.ended


def test_a_close_right_after_the_last_bytes_keeps_the_response():
    """The server's last bytes and its close in the same poll: the response is parsed before the loss is reported,
    so it ends, not lost."""
    async def go():
        (c,) = _conns(1)
        sink = c.sink
        c.data_received(RESPONSE)
        c.connection_lost(None)            # before the scheduled parse has run
        await asyncio.sleep(0)
        return sink
    s = asyncio.run(go())
    assert s.ended and not s.lost and s.stamps == [1.0]
