"""What a streamed request is and what was measured of it: plain dataclasses, no HTTP stack, so the
workloads that build requests and the CLI that lists them import nothing heavy."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runbook.core.numeric import is_int


@dataclass
class RequestSpec:
    id: int
    prompt: Any                      # str or list[int] for /v1/completions; list of messages for chat
    max_tokens: int
    prompt_tokens: int | None = None   # client-side count, when known
    ignore_eos: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(repr=False)
class RequestRecord:
    id: int
    send_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)    # arrival of each chunk that carried output
    chunk_tokens: list[int] = field(default_factory=list)     # tokens credited to each chunk (see count_source)
    end_time: float | None = None                          # end of stream ([DONE] or close) or the error's arrival
    text: str = ""
    reasoning_text: str = ""
    usage: dict[str, Any] | None = None
    count_source: str = "none"                                # usage | usage_spread | tokenizer | requested | chunks
    client_tokens: int = 0                                    # the client's own count: per-chunk usage, else tokenizer, else chunks
    prompt_tokens_client: int | None = None
    max_tokens: int = 0
    status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    retries: int = 0
    finish_reason: str | None = None
    spec_accept_length: float | None = None
    timings: dict[str, Any] | None = None                      # llama-server's last `timings` object as sent (draft_n …)
    queue_s: float = 0.0                                      # asked to send → headers on the wire (connection-pool wait)
    level: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    def __repr__(self) -> str:
        # short on purpose: asyncio.run (3.11) repr()s the main task's result on the way out, and a
        # dataclass repr of a level's records costs seconds
        return (f"RequestRecord(id={self.id}, level={self.level!r}, chunks={len(self.chunk_times)}, "
                f"error_kind={self.error_kind!r})")

    @property
    def output_tokens_client(self) -> int:
        return self.client_tokens

    @property
    def output_tokens(self) -> int:
        """Server usage when present (the definition we report), else the attributed client count."""
        if self.usage and is_int(self.usage.get("completion_tokens")):
            return int(self.usage["completion_tokens"])
        return sum(self.chunk_tokens)

    @property
    def input_tokens(self) -> int | None:
        if self.usage and is_int(self.usage.get("prompt_tokens")):
            return int(self.usage["prompt_tokens"])
        return self.prompt_tokens_client

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the server served from its prefix cache, where its usage says so."""
        u = self.usage or {}
        d = u.get("prompt_tokens_details")
        if isinstance(d, dict) and is_int(d.get("cached_tokens")):
            return int(d["cached_tokens"])
        return int(u["cached_tokens"]) if is_int(u.get("cached_tokens")) else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

