"""One streamed OpenAI-compatible request -> a RequestRecord. No argparse, no metrics.

Every SSE line is stamped with the clock on arrival, before it is parsed. Token counts per chunk come
from the server's usage deltas when it sends continuous usage, else from the local tokenizer, else
one token per chunk (recorded as `count_source`, so reports can say which).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import aiohttp

ERROR_KINDS = ("connect", "http_4xx", "http_5xx", "timeout", "stream_closed", "malformed", "no_output")


@dataclass
class RequestSpec:
    id: int
    prompt: Any                      # str or list[int] for /v1/completions; list of messages for chat
    max_tokens: int
    prompt_tokens: Optional[int] = None   # client-side count, when known
    ignore_eos: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestRecord:
    id: int
    send_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)    # arrival of each chunk that carried output
    chunk_tokens: list[int] = field(default_factory=list)
    end_time: Optional[float] = None                          # end of stream ([DONE] or close)
    text: str = ""
    reasoning_text: str = ""
    usage: Optional[dict[str, Any]] = None
    count_source: str = "none"                                # usage | tokenizer | chunks
    prompt_tokens_client: Optional[int] = None
    max_tokens: int = 0
    status: Optional[int] = None
    error_kind: Optional[str] = None
    error: Optional[str] = None
    retries: int = 0
    finish_reason: Optional[str] = None
    spec_accept_length: Optional[float] = None
    level: str = ""

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def output_tokens_client(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def output_tokens(self) -> int:
        """Server usage when present (the definition we report), else the client count."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        return self.output_tokens_client

    @property
    def input_tokens(self) -> Optional[int]:
        if self.usage and isinstance(self.usage.get("prompt_tokens"), int):
            return self.usage["prompt_tokens"]
        return self.prompt_tokens_client

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Client:
    """Streams requests to one endpoint. Inject `clock` for tests; share one aiohttp session per level."""

    def __init__(self, base_url: str, model: Optional[str] = None, chat: bool = False, api_key: Optional[str] = None,
                 timeout_s: float = 600.0, tokenizer: Any = None, clock: Callable[[], float] = time.perf_counter,
                 extra_body: Optional[dict[str, Any]] = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.chat = chat
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.tokenizer = tokenizer
        self.clock = clock
        self.extra_body = extra_body or {}

    @property
    def url(self) -> str:
        return self.base_url + ("/v1/chat/completions" if self.chat else "/v1/completions")

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
        b.update(self.extra_body)
        return b

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _count(self, text: str) -> int:
        if self.tokenizer is not None:
            return max(1, len(self.tokenizer.encode(text, add_special_tokens=False).ids))
        return 1

    async def send(self, session: aiohttp.ClientSession, req: RequestSpec, level: str = "") -> RequestRecord:
        rec = RequestRecord(id=req.id, prompt_tokens_client=req.prompt_tokens, max_tokens=req.max_tokens, level=level)
        for _attempt in range(2):
            rec.send_time = self.clock()
            try:
                await asyncio.wait_for(self._stream(session, req, rec), timeout=self.timeout_s)
                return rec
            except _ReusedConnectionClosed:
                # A pooled connection the server had already closed (llama-server closes after every
                # stream): not a failed request. Retry once on a fresh connection.
                rec.retries += 1
                continue
            except asyncio.TimeoutError:
                rec.error_kind, rec.error = "timeout", f"no complete response within {self.timeout_s:.0f} s"
            except aiohttp.ClientConnectorError as e:
                rec.error_kind, rec.error = "connect", str(e)
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError) as e:
                rec.error_kind, rec.error = "stream_closed", f"{type(e).__name__}: {e}"
            except aiohttp.ClientError as e:
                rec.error_kind, rec.error = "connect", f"{type(e).__name__}: {e}"
            rec.end_time = self.clock()
            return rec
        rec.error_kind, rec.error = "stream_closed", "connection closed before a response, twice"
        return rec

    async def _stream(self, session: aiohttp.ClientSession, req: RequestSpec, rec: RequestRecord) -> None:
        got_headers = False
        try:
            async with session.post(self.url, json=self.body(req), headers=self.headers()) as resp:
                got_headers = True
                rec.status = resp.status
                if resp.status >= 400:
                    body = (await resp.text())[:300]
                    rec.error_kind = "http_5xx" if resp.status >= 500 else "http_4xx"
                    rec.error = f"HTTP {resp.status}: {body}"
                    rec.end_time = self.clock()
                    return
                done = False
                prev_completion = 0
                async for raw in resp.content:
                    now = self.clock()            # stamped on arrival, before parsing
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line or line.startswith(":"):
                        continue
                    if not line.startswith("data:"):
                        rec.error_kind, rec.error = "malformed", f"not an SSE data line: {line[:80]!r}"
                        rec.end_time = now
                        return
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        rec.end_time = now
                        break
                    try:
                        msg = json.loads(data)
                    except json.JSONDecodeError:
                        rec.error_kind, rec.error = "malformed", f"chunk is not JSON: {data[:80]!r}"
                        rec.end_time = now
                        return
                    prev_completion = self._chunk(msg, now, rec, prev_completion)
                if rec.end_time is None:
                    rec.end_time = self.clock()
                if not done and rec.finish_reason is None:
                    rec.error_kind, rec.error = "stream_closed", "stream ended without [DONE] or a finish reason"
                elif not rec.chunk_times:
                    rec.error_kind, rec.error = "no_output", "the stream carried no output tokens"
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if not got_headers and not isinstance(e, aiohttp.ClientConnectorError):
                raise _ReusedConnectionClosed() from e
            raise

    def _chunk(self, msg: dict[str, Any], now: float, rec: RequestRecord, prev_completion: int) -> int:
        usage = msg.get("usage")
        if isinstance(usage, dict):
            rec.usage = usage
            details = usage.get("completion_tokens_details") or {}
            if isinstance(details, dict) and details.get("reasoning_tokens") is not None:
                rec.usage["reasoning_tokens"] = details["reasoning_tokens"]
        ext = msg.get("sglext") or {}
        details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
        for src in (ext, details):
            if isinstance(src, dict) and isinstance(src.get("spec_accept_length"), (int, float)):
                rec.spec_accept_length = float(src["spec_accept_length"])
        text, reasoning = "", ""
        for ch in msg.get("choices") or []:
            if self.chat:
                delta = ch.get("delta") or {}
                text += delta.get("content") or ""
                reasoning += delta.get("reasoning_content") or delta.get("reasoning") or ""
            else:
                text += ch.get("text") or ""
            if ch.get("finish_reason"):
                rec.finish_reason = ch["finish_reason"]
        if not (text or reasoning):
            return prev_completion
        rec.text += text
        rec.reasoning_text += reasoning
        rec.chunk_times.append(now)
        completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(completion, int) and completion > prev_completion:
            rec.chunk_tokens.append(completion - prev_completion)
            rec.count_source = "usage"
            return completion
        rec.chunk_tokens.append(self._count(text + reasoning))
        rec.count_source = "tokenizer" if self.tokenizer is not None else "chunks"
        return prev_completion


class _ReusedConnectionClosed(Exception):
    pass
