"""One streamed OpenAI-compatible request -> a RequestRecord. No argparse, no metrics.

- Requests go out through the client's transport (endpoint/transport.py: h1 or aiohttp, one interface),
  held by the level's session (`Client.session`).
- Send time: stamped when the request's headers are on the wire, so waiting for a pooled connection is
  not in TTFT; that wait is recorded apart as `queue_s`. Bodies can be encoded before a level starts (`Client.encode`).
- The stream is parsed per the SSE specification from raw bytes (endpoint/sse.py): `data:` lines (one optional space
  after the colon, several lines joined by a newline) make up an event, dispatched at a blank line;
  `event:`, `id:`, `retry:` and comment lines are allowed; an `event: error` or a JSON chunk with an
  `"error"` member (SGLang's mid-stream error) is the request's failure (`server_error`). Every read
  is stamped with the clock on arrival, before it is parsed.
- Anything wrong with one request (wrong-shape JSON, a redirect, a closed stream, a timeout) is that
  request's own `error_kind`; a level never aborts because of one response.
- Tokens per chunk (for per-token ITL) come from the server's usage: continuous usage credits each
  chunk its own delta (`usage`); a count that arrives late (only on the last chunk, or only in the
  trailing usage chunk) is spread evenly over the chunks it covers (`usage_spread`). Without usage:
  the local tokenizer's count of the whole text (`tokenizer`), else under ignore_eos with
  finish_reason "length" the requested count (`requested`), else one token per chunk (`chunks`).
  `count_source` says which; only `usage` is exact. The client's own count (`client_tokens`, beside the server's
  final usage): under `usage` the last per-chunk count the stream carried, else the local tokenizer's count of the
  text, else the chunks.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from runbook.core.numeric import is_int
from runbook.endpoint.records import RequestRecord, RequestSpec
from runbook.endpoint.transport import AiohttpTransport, Failure, H1Transport, ReusedConnectionClosed, Stream, Transport

if TYPE_CHECKING:
    import aiohttp

EXACT_SOURCES = ("usage",)
# the streamed requests' HTTP client by name (--transport, the summary's client.transport); endpoint/h1.py: why two
TRANSPORT_TABLE: dict[str, type[Transport]] = {t.name: t for t in (H1Transport, AiohttpTransport)}
TRANSPORTS = tuple(TRANSPORT_TABLE)
DEFAULT_TRANSPORT = "h1"
_loads = orjson.loads            # the hot path: several times faster than json on small chunks


def _server_error(msg: dict[str, Any]) -> Failure:
    """An error object sent mid-stream (`error`, or `object: error` with a `message`), as this request's Failure."""
    err = msg.get("error") if msg.get("error") else msg.get("message")
    if isinstance(err, dict):
        err = err.get("message") or err
    return Failure("server_error", f"server error mid-stream: {str(err)[:200]}")


def spread(total: int, n: int) -> list[int]:
    """`total` tokens over `n` chunks as evenly as integers allow (extra tokens on the later chunks)."""
    if n <= 0:
        return []
    base, extra = divmod(max(0, total), n)
    return [base + (1 if i >= n - extra else 0) for i in range(n)]


def register_transport(cls: type[Transport]) -> type[Transport]:
    """Another transport under `cls.name`: accepted by Client and by --transport from now on."""
    global TRANSPORTS
    TRANSPORT_TABLE[cls.name] = cls
    TRANSPORTS = tuple(TRANSPORT_TABLE)
    return cls


def _draft_counters(timings: Any, rec: RequestRecord) -> None:
    """llama-server's per-request draft counters (its final chunk's `timings`) as the acceptance length:
    tokens per target forward pass, each accepted draft token having saved one. The object itself is kept as sent
    (`timings`): bench/speculation.py judges its counters."""
    if isinstance(timings, dict):
        rec.timings = timings
    if isinstance(timings, dict) and type(timings.get("draft_n")) is int and type(timings.get("predicted_n")) is int:
        accepted, made = timings.get("draft_n_accepted"), timings["predicted_n"]
        if type(accepted) is int and 0 <= accepted < made:
            rec.spec_accept_length = made / (made - accepted)


class Client:
    """Streams requests to one endpoint. Inject `clock` for tests; share one session (`session`) per level."""

    def __init__(self, base_url: str, model: str | None = None, chat: bool = False, api_key: str | None = None,
                 timeout_s: float = 600.0, tokenizer: Any = None, clock: Callable[[], float] = time.perf_counter,
                 extra_body: dict[str, Any] | None = None, transport: str | None = None):
        transport = transport or DEFAULT_TRANSPORT
        if transport not in TRANSPORT_TABLE:
            raise ValueError(f"transport {transport!r}: one of {', '.join(TRANSPORTS)}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.chat = chat
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.tokenizer = tokenizer
        self.clock = clock
        self.extra_body = extra_body or {}
        self.transport = transport                               # its name
        self._transport = TRANSPORT_TABLE[transport]
        self._headers = self.headers()

    @property
    def url(self) -> str:
        return self.base_url + ("/v1/chat/completions" if self.chat else "/v1/completions")

    def session(self, limit: int = 100, **kw: Any) -> aiohttp.ClientSession:
        """The level's session (limit 0: no pool cap); streamed requests go through the transport it holds."""
        return self._transport.open(self.base_url, limit, self.clock, **kw)

    def body(self, req: RequestSpec) -> dict[str, Any]:
        b: dict[str, Any] = {"max_tokens": req.max_tokens, "stream": True, "temperature": 0.0,
                             "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        if self.model:
            b["model"] = self.model
        if self.chat:
            b["messages"] = req.prompt if isinstance(req.prompt, list) else [{"role": "user", "content": req.prompt}]
        else:
            b["prompt"] = req.prompt
        if req.ignore_eos:
            b["ignore_eos"] = True           # SGLang and llama-server both accept it
            b["min_tokens"] = req.max_tokens
        extra = req.meta.get("extra_body") if isinstance(req.meta, dict) else None
        if isinstance(extra, dict):
            b.update(extra)
        b.update(self.extra_body)
        return b

    def encode(self, req: RequestSpec) -> bytes:
        """The request body as bytes: encode before the level so the send path does no JSON work."""
        return json.dumps(self.body(req), separators=(",", ":")).encode()

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _tok_count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    async def send(self, session: aiohttp.ClientSession, req: RequestSpec, level: str = "",
                   body: bytes | None = None) -> RequestRecord:
        rec = RequestRecord(id=req.id, prompt_tokens_client=req.prompt_tokens, max_tokens=req.max_tokens, level=level)
        payload = body if body is not None else self.encode(req)
        transport = Transport.of(session, self.base_url, self.clock)
        for _attempt in range(2):
            asked = self.clock()
            rec.send_time = asked            # replaced when on the wire, by the transport
            st = Stream(self._event, rec)
            try:
                try:
                    done = await asyncio.wait_for(transport.stream(self.url, self._headers, payload, st),
                                                  timeout=self.timeout_s)
                finally:
                    st.join()
                self._finish(rec, req, st.cum, done)
                rec.queue_s = max(0.0, rec.send_time - asked)
                return rec
            except ReusedConnectionClosed:
                # A pooled connection the server had already closed (llama-server closes after every
                # stream): not a failed request. Retry once on a fresh connection.
                rec.retries += 1
                rec.chunk_times, rec.chunk_tokens, rec.text, rec.reasoning_text, rec.usage = [], [], "", "", None
                continue
            except Failure as e:
                rec.error_kind, rec.error = e.kind, e.msg
            except asyncio.TimeoutError:
                rec.error_kind, rec.error = "timeout", f"no complete response within {self.timeout_s:.0f} s"
            except Exception as e:  # one odd response must never abort the level
                rec.error_kind, rec.error = "client_error", f"{type(e).__name__}: {e}"[:300]
            rec.end_time = self.clock()
            rec.queue_s = max(0.0, rec.send_time - asked)
            return rec
        rec.error_kind, rec.error = "stream_closed", "connection closed before a response, twice"
        rec.end_time = self.clock()
        return rec

    def _finish(self, rec: RequestRecord, req: RequestSpec, cum: list[int | None], done: bool) -> None:
        """After the stream: its end, the token attribution and the request's own length checks."""
        rec.end_time = self.clock() if not done else rec.end_time
        if not done and rec.finish_reason is None:
            raise Failure("stream_closed", "stream ended without [DONE] or a finish reason")
        self._attribute(rec, req, cum)
        if not rec.chunk_times:
            counted = (rec.usage or {}).get("completion_tokens")
            if isinstance(counted, int) and counted > 0:
                # the server generated them but streamed no text: special tokens the detokenizer drops
                raise Failure("no_output", f"the server counted {counted} output tokens but streamed no text "
                                         "(tokens that detokenize to nothing, e.g. special tokens)")
            raise Failure("no_output", "the stream carried no output tokens")
        self._check_length(rec, req)

    def _event(self, data: bytes, event: bytes, now: float, rec: RequestRecord, cum: list[int | None],
               text: list[str], reasoning: list[str]) -> bool:
        """One dispatched SSE event; True at [DONE]. Raises Failure for this request's own error."""
        if data == b"[DONE]":
            rec.end_time = now
            return True
        if event == b"error":
            raise Failure("server_error", f"server sent an error event: {data[:200].decode('utf-8', 'replace')}")
        try:
            msg = _loads(data)
        except (ValueError, RecursionError):
            raise Failure("malformed", f"chunk is not JSON: {data[:80]!r}") from None
        if type(msg) is not dict:
            raise Failure("malformed", f"chunk is JSON {type(msg).__name__}, not an object: {data[:80]!r}")
        if msg.get("error") or msg.get("object") == "error":
            raise _server_error(msg)
        usage = msg.get("usage")
        if usage is not None:
            usage = rec.usage = self._usage(usage)
        ext = msg.get("sglext")
        if ext:
            details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
            for src in (ext, details):
                if isinstance(src, dict) and isinstance(src.get("spec_accept_length"), (int, float)):
                    rec.spec_accept_length = float(src["spec_accept_length"])
        _draft_counters(msg.get("timings"), rec)
        choices = msg.get("choices")
        if choices is None:
            return False
        if type(choices) is not list:
            raise Failure("malformed", f"choices is {type(choices).__name__}, not a list")
        got = self._choices(choices, rec, text, reasoning)
        completion = usage.get("completion_tokens") if usage is not None else None
        if got:
            rec.chunk_times.append(now)
            cum.append(completion if type(completion) is int else None)
        elif choices and cum and type(completion) is int:
            # a choice that carried no text (SGLang's finish chunk after a stop string) still counts its tokens:
            # the last output chunk's, as the arrival that brought them to the client
            cum[-1] = completion
        return False

    @staticmethod
    def _usage(usage: Any) -> dict[str, Any]:
        """A chunk's usage object, with reasoning_tokens lifted out of completion_tokens_details."""
        if type(usage) is not dict:
            raise Failure("malformed", f"usage is {type(usage).__name__}, not an object")
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and details.get("reasoning_tokens") is not None:
            usage = {**usage, "reasoning_tokens": details["reasoning_tokens"]}
        return usage

    def _choices(self, choices: list[Any], rec: RequestRecord, text: list[str], reasoning: list[str]) -> bool:
        """Appends each choice's text and reasoning; True when any carried output."""
        got = False
        for ch in choices:
            if type(ch) is not dict:
                raise Failure("malformed", f"a choice is {type(ch).__name__}, not an object")
            if self.chat:
                delta = ch.get("delta")
                if delta:
                    if type(delta) is not dict:
                        raise Failure("malformed", f"delta is {type(delta).__name__}, not an object")
                    t, r = delta.get("content"), delta.get("reasoning_content") or delta.get("reasoning")
                    if r is not None and type(r) is not str:
                        raise Failure("malformed", f"reasoning is {type(r).__name__}, not a string")
                    if r:
                        reasoning.append(r)
                        got = True
                else:
                    t = None
            else:
                t = ch.get("text")
            if t is not None and type(t) is not str:
                raise Failure("malformed", f"content is {type(t).__name__}, not a string")
            if t:
                text.append(t)
                got = True
            fr = ch.get("finish_reason")
            if fr:
                rec.finish_reason = str(fr)
        return got

    def _attribute(self, rec: RequestRecord, req: RequestSpec, cum: list[int | None]) -> None:
        """Tokens per chunk, and the client's own count; see the module docstring."""
        n = len(rec.chunk_times)
        final_raw = (rec.usage or {}).get("completion_tokens")
        final: int | None = final_raw if is_int(final_raw) else None
        if not n:
            rec.chunk_tokens, rec.client_tokens = [], 0
            return
        # the client's own count: the server's per-chunk counts where it sent them for every chunk (exact; the
        # decoded text of arbitrary tokens does not re-tokenize to the same count), else the local tokenizer's
        # count of the text, else the chunks
        rec.client_tokens = self._tok_count(rec.reasoning_text + rec.text) if self.tokenizer is not None else n
        if final is not None:
            counts = [0] * n
            prev_i, prev_c, continuous = -1, 0, True
            for i, c in enumerate(cum):
                if c is None or c < prev_c:
                    continue
                if i - prev_i > 1:
                    continuous = False
                counts[prev_i + 1:i + 1] = spread(c - prev_c, i - prev_i)
                prev_i, prev_c = i, c
            rest = final - prev_c
            if prev_i < n - 1:
                continuous = False
                counts[prev_i + 1:] = spread(rest, n - 1 - prev_i)
            elif rest > 0:
                counts[-1] += rest           # counted but never streamed as text (e.g. a stop token)
            rec.chunk_tokens = counts
            rec.count_source = "usage" if continuous else "usage_spread"
            if continuous:
                rec.client_tokens = prev_c
        elif self.tokenizer is not None:
            rec.chunk_tokens = spread(max(n, rec.client_tokens), n)
            rec.count_source = "tokenizer"
        elif req.ignore_eos and rec.finish_reason == "length":
            rec.chunk_tokens = spread(max(n, req.max_tokens), n)
            rec.count_source = "requested"
        else:
            rec.chunk_tokens = [1] * n
            rec.count_source = "chunks"

    def _check_length(self, rec: RequestRecord, req: RequestSpec) -> None:
        if not req.ignore_eos or req.max_tokens <= 0:
            return
        got_raw = (rec.usage or {}).get("completion_tokens")
        got: int | None = got_raw if is_int(got_raw) else None
        if got is not None and got < req.max_tokens:
            raise Failure("short_output", f"ignore_eos: {got} of max_tokens {req.max_tokens} tokens generated "
                                        f"(finish_reason {rec.finish_reason!r}); the server did not honour ignore_eos")
        if got is None and rec.finish_reason == "stop":
            raise Failure("short_output", f"ignore_eos: the stream stopped (finish_reason 'stop') before max_tokens {req.max_tokens}")
