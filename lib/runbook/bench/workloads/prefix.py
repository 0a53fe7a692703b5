"""prefix: an agentic shape — one long shared system prompt plus repository context, reused by every
request, followed by a different coding question each turn (exercises the prefix cache)."""
from __future__ import annotations

from typing import Any

from runbook.bench.prompt_text import count_tokens, text_of_length
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LazyRequests, Workload, WorkloadType
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.corpus import code_prompts, code_text
from runbook.endpoint.records import RequestSpec


class SharedPrefix(WorkloadType):
    name = "prefix"
    description = "one shared ~0.9 × --input-len token system prompt, then a different coding question per request"
    options = ("input_len", "output_len", "chat")
    order = 40

    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        tokenizer = ctx.tokenizer
        shared = ("You are a senior engineer working in this repository. Answer with code.\n\n# Repository context\n"
                  + text_of_length(tokenizer, code_text(), max(1, int(o.input_len * 0.9))))
        ps = code_prompts()
        pcounts = [count_tokens(tokenizer, shared + q) for q in ps]

        def one_prefix(i: int) -> RequestSpec:
            q = ps[i % len(ps)]
            prompt: Any = ([{"role": "system", "content": shared}, {"role": "user", "content": q}] if bool(o.chat)
                           else shared + "\n\n# Task\n" + q)
            return RequestSpec(i, prompt, o.output_len, pcounts[i % len(ps)], ctx.ignore_eos, {"shared_prefix": True})
        return Workload(self.name, LazyRequests(n, one_prefix), tokenizer is not None,
                        f"shared ~{int(o.input_len * 0.9)}-token system prompt + a question per turn", CORPUS_VERSION)


WORKLOAD = SharedPrefix()
