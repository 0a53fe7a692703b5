"""The SSE parser's fast path gives exactly the events the specification defines, however the stream
is cut into reads: checked against a plain reference that reads the whole stream at once."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.endpoint.sse import MAX_EVENT_BYTES, SSEParser, SSETooLarge


def reference(stream: bytes) -> list[tuple[bytes, bytes]]:
    """The specification's algorithm, line by line over the whole stream (CRLF, CR or LF end a line;
    an event not ended by a blank line before the end is dropped)."""
    lines = re.split(rb"\r\n|\r|\n", stream)
    lines.pop()                                   # the last, unterminated line is not a line
    out, data, event = [], [], b""
    for line in lines:
        if not line:
            if data:
                out.append((event, b"\n".join(data)))
            data, event = [], b""
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value
    return out


def parse(pieces: list[bytes]) -> list[tuple[bytes, bytes]]:
    p = SSEParser()
    out = []
    for piece in pieces:
        out += p.feed(piece)
    return out + p.close()


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    pts = sorted({min(len(stream), x) for x in points})
    return [stream[a:b] for a, b in zip([0] + pts, pts + [len(stream)], strict=True)]


_text = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))
_eol = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r"])
_line = st.one_of(
    st.builds(lambda v: b"data: " + v, _text),
    st.builds(lambda v: b"data:" + v, _text),
    st.builds(lambda v: b"event: " + v, _text),
    st.builds(lambda v: b": " + v, _text),
    st.builds(lambda v: b"id: " + v, _text),
    st.just(b"data"),
    st.just(b""),
    st.just(b"data: [DONE]"),
)


@st.composite
def streams(draw: st.DrawFn, lf_only: bool = False) -> bytes:
    lines = draw(st.lists(st.tuples(_line, st.just(b"\n") if lf_only else _eol), max_size=30))
    return b"".join(a + b for a, b in lines) + draw(_text)


@settings(max_examples=400, deadline=None)
@given(streams(), st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_stream_cut_anywhere_gives_the_specified_events(stream: bytes, points: list[int]) -> None:
    assert parse(cut(stream, points)) == reference(stream)


@settings(max_examples=400, deadline=None)
@given(streams(lf_only=True), st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_lf_only_streams_the_fast_path_takes_cut_anywhere(stream: bytes, points: list[int]) -> None:
    assert parse(cut(stream, points)) == reference(stream)


def test_an_event_of_several_data_lines_in_one_read() -> None:
    assert parse([b"data: a\ndata: b\n\ndata: c\n\n"]) == [(b"", b"a\nb"), (b"", b"c")]


@settings(max_examples=200, deadline=None)
@given(st.lists(_text, min_size=1, max_size=40), st.lists(st.integers(min_value=0, max_value=600), max_size=8))
def test_the_servers_own_form_cut_anywhere(payloads: list[bytes], points: list[int]) -> None:
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    assert parse(cut(stream, points)) == reference(stream) == [(b"", p) for p in payloads] + [(b"", b"[DONE]")]


def test_one_read_of_many_events_is_split_without_looking_at_lines() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: {"a"') == [(b"", b'{"a":1}'), (b"", b'{"a":2}')]
    assert p.feed(b':3}\n\n') == [(b"", b'{"a":3}')]
    assert p.pending is None


def test_an_error_event_keeps_its_name() -> None:
    assert parse([b"event: error\ndata: overloaded\n\n"]) == [(b"error", b"overloaded")]


def test_a_line_that_never_ends_is_refused_without_holding_more_than_the_limit() -> None:
    p = SSEParser()
    block = b"x" * (1 << 20)
    with pytest.raises(SSETooLarge):
        for _ in range(MAX_EVENT_BYTES // len(block) + 2):
            p.feed(block)


def test_an_event_of_endless_data_lines_is_refused() -> None:
    p = SSEParser()
    line = b"data: " + b"y" * (1 << 20) + b"\n"
    with pytest.raises(SSETooLarge):
        for _ in range(MAX_EVENT_BYTES // len(line) + 2):
            p.feed(line)
