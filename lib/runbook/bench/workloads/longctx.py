"""longctx: the corpus's code text cut to an exact token length per request, each from another offset."""
from __future__ import annotations

from collections.abc import Iterator

from runbook.bench.prompt_text import count_tokens, exact_ids, text_of_length
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LazyRequests, Workload, WorkloadType
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.corpus import code_text
from runbook.endpoint.records import RequestSpec


class LongContext(WorkloadType):
    name = "longctx"
    description = "the corpus's code text cut to exactly --input-len tokens, no two requests sharing a prefix"
    options = ("input_len", "output_len", "chat")
    order = 30

    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        text = code_text()
        tokenizer, input_len, output_len = ctx.tokenizer, o.input_len, o.output_len

        def gen_long() -> Iterator[RequestSpec]:
            for i in range(n):
                # Different requests start at different offsets so the prefix cache cannot serve them.
                start = (i * 7919) % max(1, len(text) // 2)
                body = text[start:] + text[:start]
                if tokenizer is not None and not bool(o.chat):
                    ids = exact_ids(tokenizer, body, input_len)
                    yield RequestSpec(i, ids, output_len, len(ids), ctx.ignore_eos)
                else:
                    s = text_of_length(tokenizer, body, input_len)
                    yield RequestSpec(i, s, output_len, count_tokens(tokenizer, s), ctx.ignore_eos)
        return Workload(self.name, LazyRequests(n, gen_long()), tokenizer is not None,
                        f"code text cut to {input_len} tokens, output {output_len}", CORPUS_VERSION)


WORKLOAD = LongContext()
