"""Multi-turn agentic sessions (`--workload agentic`): how a coding agent loads a server.

A level at concurrency N runs N sessions at once (more in turn when `--requests` asks for more, each
worker taking the next session), each of T turns over the chat API. Turn 1 sends a system prompt
shared by every session, this session's repository context (the frozen corpus's code text from a
session-specific offset, `input_len` tokens) and a coding question; every later turn re-sends the
whole conversation so far — the previous answers as assistant messages — plus a synthetic tool
result (`tool_result_len` tokens of code text, as a user message, since a `tool` message needs a
matching tool call) and the next question. So the context grows turn by turn and the prefix cache
decides TTFT. Between turns the session thinks: `think_time` fixed, or exponential with that mean.
A turn that fails ends its session (the next turn would have nothing to append).

Per turn index the level reports TTFT, TPOT, input tokens and the prefix-cache hit rate: cached
prompt tokens (`usage.prompt_tokens_details.cached_tokens`, or `usage.cached_tokens`) over prompt
tokens, over the requests whose usage says so; `None` where the server does not report it.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runbook.bench import metrics
from runbook.bench.prompt_text import count_tokens, text_of_length
from runbook.bench.settings import BenchSettings
from runbook.bench.sweep import sleep_until
from runbook.corpus import code_prompts, code_text
from runbook.endpoint.client import RequestRecord, RequestSpec

SYSTEM_PROMPT = ("You are a coding agent working in a Python repository. You read files, run the tests and propose "
                 "patches. Think step by step, then answer with the change and a short explanation.")
TOOLS = ("run_tests", "read_file", "grep")


@dataclass
class SessionPlan:
    """`sessions` sessions of the run's shape (`o`: turns, lengths, think time, seed), prompts measured with
    `tokenizer`, lengths through the model's chat template where `chat` (model.tokenizer.ChatCounter) is given."""
    sessions: int
    o: BenchSettings
    tokenizer: Any = None
    chat: Any = None
    ignore_eos: bool = True

    def _slice(self, offset: int, tokens: int) -> str:
        text = code_text()
        start = offset % max(1, len(text) // 2)
        return text_of_length(self.tokenizer, text[start:] + text[:start], max(1, tokens))

    def opening(self, k: int) -> list[dict[str, str]]:
        ctx = self._slice(k * 104729, self.o.input_len)
        return [{"role": "system", "content": SYSTEM_PROMPT + "\n\n# Repository context\n" + ctx},
                {"role": "user", "content": self.question(k, 0)}]

    def question(self, k: int, t: int) -> str:
        ps = code_prompts()
        return ps[(k * self.o.turns + t) % len(ps)]

    def tool_message(self, k: int, t: int) -> dict[str, str]:
        tool = TOOLS[(k + t) % len(TOOLS)]
        out = self._slice(k * 7919 + t * 15485863, self.o.tool_result_len)
        return {"role": "user", "content": f"Tool result ({tool}):\n```\n{out}\n```\n\n{self.question(k, t)}"}

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int | None:
        """The request's prompt tokens by the local tokenizer: through the model's chat template where
        the tokenizer directory has one (what the server counts), else the messages' contents alone."""
        if self.tokenizer is None:
            return None
        if self.chat is not None:
            n = self.chat.count(messages)
            if n is not None:
                return n
        return sum(count_tokens(self.tokenizer, m["content"]) or 0 for m in messages)

    def held_context(self) -> int | None:
        """The context a session's last turn comes back to, before anything ran: the turn before it's prompt by the
        local tokenizer (the answers counted at `output_len` each) plus its answer; None without a tokenizer."""
        msgs = self.opening(0)
        for t in range(1, self.o.turns - 1):
            msgs += [{"role": "assistant", "content": ""}, self.tool_message(0, t)]
        n = self.prompt_tokens(msgs)
        return None if n is None else n + (self.o.turns - 1) * self.o.output_len

    def think(self, rng: np.random.Generator) -> float:
        if self.o.think_time <= 0:
            return 0.0
        return float(rng.exponential(self.o.think_time)) if self.o.think_dist == "exp" else self.o.think_time

    def warmup_requests(self) -> list[RequestSpec]:
        """Warm-up that primes nothing a session will send (its own short question, no context)."""
        return [RequestSpec(-1, [{"role": "user", "content": "Say hello."}], min(16, self.o.output_len), None, self.ignore_eos)]

    def driver(self, width: int) -> Callable[[Callable[..., Awaitable[RequestRecord]], float | None], Awaitable[None]]:
        """The level's load for sweep.run_level: `width` workers (the concurrency), each running sessions in turn."""
        async def drive(send: Callable[..., Awaitable[RequestRecord]], deadline: float | None) -> None:
            nxt = iter(range(self.sessions))
            rid = [0]

            async def session(k: int) -> None:
                rng = np.random.default_rng([self.o.seed, k])
                msgs = self.opening(k)
                for t in range(self.o.turns):
                    if t:
                        pause = self.think(rng)
                        if pause:       # never shorter than drawn (uvloop's timers can fire a millisecond early)
                            await sleep_until(time.perf_counter() + pause)
                        msgs.append(self.tool_message(k, t))
                    if deadline is not None and time.perf_counter() >= deadline:
                        return
                    spec = RequestSpec(rid[0], list(msgs), self.o.output_len, self.prompt_tokens(msgs), self.ignore_eos,
                                       {"session": k, "turn": t + 1})
                    rid[0] += 1
                    rec = await send(spec)
                    if not rec.ok:
                        return
                    msgs.append({"role": "assistant", "content": rec.text})

            async def worker() -> None:
                for k in nxt:
                    if deadline is not None and time.perf_counter() >= deadline:
                        return
                    await session(k)

            await asyncio.gather(*(worker() for _ in range(max(1, width))))
        return drive


def per_turn(records: list[RequestRecord]) -> list[dict[str, Any]]:
    """One row per turn index: requests, failures, TTFT, TPOT, input tokens, prefix-cache hit rate."""
    by: dict[int, list[RequestRecord]] = {}
    for r in records:
        t = r.meta.get("turn")
        if isinstance(t, int):
            by.setdefault(t, []).append(r)
    rows = []
    for t in sorted(by):
        rs = by[t]
        ok = [r for r in rs if r.ok]
        cached = [(r.cached_tokens, r.input_tokens) for r in ok if r.cached_tokens is not None and r.input_tokens]
        hit = sum(c for c, _ in cached) / sum(n or 0 for _, n in cached) if cached else None
        rows.append({"turn": t, "requests": len(rs), "failed": len(rs) - len(ok),
                     "ttft_ms": metrics.stats(metrics.ttft_s(r) for r in ok),
                     "tpot_ms": metrics.stats(metrics.tpot_s(r) for r in ok),
                     "input_tokens": metrics.stats((r.input_tokens for r in ok), scale=1.0),
                     "cached_tokens": metrics.stats((r.cached_tokens for r in ok), scale=1.0),
                     "cache_hit_rate": hit})
    return rows
