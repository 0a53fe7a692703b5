"""Server-sent events from raw bytes, per the SSE specification, fast on what servers actually send.

`SSEParser.feed(piece)` takes bytes as they arrive and returns the events completed by them, each as
`(event name, data)`. An event is made of its `data:` lines (one optional space after the colon; several
lines joined by a newline) and is dispatched at a blank line; `event:` names it; `id:`, `retry:`,
unknown fields and comment lines (`:`) are ignored; a line ends at LF, CRLF or CR.

Fast path: SGLang, vLLM and llama-server send every event as one `data: …` line followed by a blank
line, LF only. Those are cut out of the buffer with one `split(b"\\n\\n")` per read and never looked at
line by line; any other event (several lines, an `event:` field, comments), a read that ends inside an
event's lines, and a stream that ever carries a CR (from then on) go through the line parser. Only the
last partial line is ever held, so a hostile stream costs no re-copying. Both paths give the same events
(tests/bench/test_sse_parser.py checks them against each other on random streams cut at random points).
"""
from __future__ import annotations

MAX_EVENT_BYTES = 64 << 20       # a pending event larger than this is not a chunk

Event = tuple[bytes, bytes]      # (event name, data)


class SSETooLarge(ValueError):
    pass


class SSEParser:
    __slots__ = ("_buf", "_parts", "_size", "_lines", "_data", "_event")

    def __init__(self) -> None:
        self._buf = b""
        self._parts: list[bytes] = []        # pieces with no LF, held unjoined (a long line costs no re-copying)
        self._size = 0
        self._lines = False                  # True once a CR was seen: line by line from then on
        self._data: list[bytes] = []         # line parser: the pending event's data lines
        self._event = b""

    def feed(self, piece: bytes) -> list[Event]:
        if b"\n" not in piece and b"\r" not in piece:
            self._parts.append(piece)
            self._size += len(piece)
            if len(self._buf) + self._size > MAX_EVENT_BYTES:
                raise SSETooLarge(f"an SSE line longer than {MAX_EVENT_BYTES:,} bytes")
            return []
        if self._parts:
            piece = b"".join(self._parts) + piece
            self._parts, self._size = [], 0
        buf = self._buf + piece if self._buf else piece
        if not self._lines and b"\r" in piece:
            self._lines = True
        end = -1 if (self._lines or self._data or self._event) else buf.rfind(b"\n\n")
        if end < 0:       # an event under way, or a CR seen: line by line (holds only the last partial line)
            return self._feed_lines(buf)
        self._buf = buf[end + 2:]
        out: list[Event] = []
        for ev in buf[:end].split(b"\n\n"):
            if ev[:6] == b"data: " and b"\n" not in ev:
                out.append((b"", ev[6:]))
            elif ev:
                self._block(ev.split(b"\n"), out)
                self._dispatch(out)           # the "\n\n" after it ends it
        self._check()
        return out

    def _check(self) -> None:
        if len(self._buf) > MAX_EVENT_BYTES:
            raise SSETooLarge(f"an SSE line or event longer than {MAX_EVENT_BYTES:,} bytes")

    def _feed_lines(self, buf: bytes) -> list[Event]:
        hold = b""
        if self._lines:                       # CRLF, CR or LF end a line; a CR last may be half of a CRLF
            if buf[-1:] == b"\r":
                buf, hold = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop() + hold
        out: list[Event] = []
        self._block(lines, out)
        self._check()
        if sum(map(len, self._data)) > MAX_EVENT_BYTES:
            raise SSETooLarge(f"an SSE event longer than {MAX_EVENT_BYTES:,} bytes")
        return out

    def _block(self, lines: list[bytes], out: list[Event]) -> None:
        for line in lines:
            if not line:
                self._dispatch(out)
                continue
            if line[:1] == b":":
                continue                                   # comment / keep-alive
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value
            # id, retry and unknown fields: ignored, as the specification says

    def _dispatch(self, out: list[Event]) -> None:
        if self._data:
            d = self._data
            out.append((self._event, d[0] if len(d) == 1 else b"\n".join(d)))
            self._data = []
        self._event = b""

    def close(self) -> list[Event]:
        """At the end of the stream: a CR held back (it might have been half of a CRLF) ends its line.
        An event not ended by a blank line is dropped, as the specification says."""
        if self._lines and self._buf[-1:] == b"\r":
            return self._feed_lines(self._buf[:-1] + b"\n")
        return []

    @property
    def pending(self) -> bytes | None:
        """Bytes of an event not yet ended by a blank line (None when there are none)."""
        rest = self._buf + b"".join(self._parts)
        return rest or (b"\n".join(self._data) if self._data else None)
