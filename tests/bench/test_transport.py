"""One transport interface (endpoint/transport.py): every transport in the table gives the same records
for the same scripted bytes, and a third transport is one class plus one table entry."""
import asyncio
import socket

import pytest

from bench.rawsse import Reply, completion_stream
from bench.test_h1_transport import HEAD_CHUNKED, chunked, events, send, tcp, writes
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.endpoint import client as client_mod
from runbook.endpoint.client import TRANSPORT_TABLE, TRANSPORTS, Client, RequestSpec
from runbook.endpoint.transport import H1Transport, Stream, Transport

TIMES = ("send_time", "end_time", "chunk_times", "queue_s")      # the clock's readings: differ run to run


def record(r) -> dict:
    """Everything in the record but the clock's readings, which are checked for shape instead."""
    d = r.to_dict()
    assert d["send_time"] > 0 and d["queue_s"] >= 0 and d["end_time"] is not None, d
    assert all(r.send_time <= t <= r.end_time for t in r.chunk_times), d
    d["chunks"] = len(d["chunk_times"])
    for k in TIMES:
        del d[k]
    return d


def refused() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


WIRES = {
    "stream": (HEAD_CHUNKED + b"".join(chunked(events())) + b"0\r\n\r\n", None),
    "cut": (HEAD_CHUNKED + b"".join(chunked(events()[:2])), "stream_closed"),          # closed mid-response
    "http_500": (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 17\r\n\r\n{\"error\": \"oom\"}\n", "http_5xx"),
}


@pytest.mark.parametrize("scenario", [*WIRES, "refused"])
def test_every_transport_gives_the_same_records(scenario):
    if scenario == "refused":
        url, kind = refused(), "connect"
        got = {t: [record(r) for r in send(url, t)] for t in TRANSPORTS}
    else:
        wire, kind = WIRES[scenario]
        n = 2 if kind is None else 1        # after an error the server closes: a second request's retry would race it
        with tcp(writes(wire, keep=kind is None)) as url:
            got = {t: [record(r) for r in send(url, t, n=n)] for t in TRANSPORTS}
    assert len(got) == len(TRANSPORT_TABLE) >= 2
    for recs in got.values():
        assert all(r["error_kind"] == kind for r in recs), recs
        for r in recs:
            if kind in ("stream_closed", "connect"):
                assert r.pop("error")          # the transport's own words for the same failure
    first, *rest = got.values()
    assert all(other == first for other in rest), got
    if scenario == "stream":
        assert first[0]["text"] == " t0 t1 t2 t3" and first[0]["chunks"] == 4 and first[0]["count_source"] == "usage"
    if scenario == "http_500":
        assert first[0]["status"] == 500 and "oom" in first[0]["error"]


def test_the_table_holds_transports_under_their_names():
    assert TRANSPORTS == ("h1", "aiohttp") and client_mod.DEFAULT_TRANSPORT in TRANSPORTS
    for name, cls in TRANSPORT_TABLE.items():
        assert issubclass(cls, Transport) and cls.name == name

    class NoStream(Transport):                 # the interface is enforced: a transport must stream and close
        name = "partial"

        def close(self) -> None:
            pass
    with pytest.raises(TypeError, match="stream"):
        NoStream("http://127.0.0.1:9", 1, lambda: 0.0, None)   # type: ignore[abstract, arg-type]


def test_each_session_holds_one_transport_closed_with_it():
    async def go():
        kinds = {}
        for t in TRANSPORTS:
            s = Client("http://127.0.0.1:9", transport=t).session(limit=3)
            tr = Transport.of(s, "http://127.0.0.1:9", lambda: 0.0)
            kinds[t] = (type(tr).name, tr.limit)
            await s.close()
        return kinds
    assert asyncio.run(go()) == {t: (t, 3) for t in TRANSPORTS}


class Tally(H1Transport):
    """A third transport: h1, counting what it streamed."""
    name = "tally"
    sent = 0

    async def stream(self, url: str, headers: dict[str, str], payload: bytes, st: Stream) -> bool:
        type(self).sent += 1
        return await super().stream(url, headers, payload, st)


def test_a_third_transport_is_one_class_and_one_table_entry(monkeypatch, raw, tmp_path):
    monkeypatch.setattr(client_mod, "TRANSPORT_TABLE", dict(TRANSPORT_TABLE))     # restored after the test
    monkeypatch.setattr(client_mod, "TRANSPORTS", TRANSPORTS)
    monkeypatch.setattr(Tally, "sent", 0)
    with pytest.raises(ValueError, match="one of h1, aiohttp$"):
        Client("http://x", transport="tally")
    client_mod.register_transport(Tally)
    assert client_mod.TRANSPORTS == ("h1", "aiohttp", "tally")
    with tcp(writes(WIRES["stream"][0])) as url:
        got = {t: [record(r) for r in send(url, t, n=2)] for t in ("h1", "tally")}
    assert got["tally"] == got["h1"] and Tally.sent == 2

    srv = raw(lambda b: Reply(completion_stream(int(b.get("max_tokens", 2)), 0.005, 0.001)))
    o = BenchSettings(url=srv.url, model="raw", concurrency=[2], requests=4, output_len=3, workload="random",
                      input_len=8, warmup=0, telemetry=False, timeout=30.0, out=tmp_path, transport="tally")  # accepted now
    res = bench.run(o)
    assert res.summary["levels"][0]["completed"] == 4 and res.summary["client"]["transport"] == "tally"
    assert Tally.sent == 2 + 4


def test_a_session_of_the_callers_own_streams_through_aiohttp_on_it(raw):
    srv = raw(lambda b: Reply(completion_stream(2, 0.01, 0.005)))

    async def go():
        import aiohttp
        async with aiohttp.ClientSession() as s:
            tr = Transport.of(s, srv.url, lambda: 0.0)
            r = await Client(srv.url, "raw", transport="h1").send(s, RequestSpec(0, "x", 2))
        return type(tr).name, r
    name, r = asyncio.run(go())
    assert name == "aiohttp" and r.ok and r.text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_send_stamp_comes_before_the_write(transport, monkeypatch):
    """The request's send time is read before its bytes go to the socket: a stall right after the write (the GIL
    handed to another thread, the CPU lost) would otherwise stamp the send after the server answered — the first
    token "0.16 ms after sending" that a real SGLang level showed on a loaded host. Each write here stalls the
    clock by a second; the send stamp must be the time before the first write, and TTFT then holds the stall."""
    from asyncio import selector_events

    now, wrote = [1000.0], []
    real = selector_events._SelectorSocketTransport.write

    def stalling(self, data):
        wrote.append(now[0])
        real(self, data)
        now[0] += 1.0

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", stalling)
    with tcp(writes(HEAD_CHUNKED + b"".join(chunked(events())) + b"0\r\n\r\n")) as url:
        (r,) = send(url, transport, clock=lambda: now[0])
    assert r.ok and r.send_time <= wrote[0] < r.chunk_times[0], (r.send_time, wrote, r.chunk_times)
