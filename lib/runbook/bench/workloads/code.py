"""code: realistic coding prompts from the frozen corpus (runbook/corpus, written for the project, Apache-2.0)."""
from __future__ import annotations

from runbook.bench.prompt_text import count_tokens
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LazyRequests, Workload, WorkloadType
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.corpus import code_prompts
from runbook.endpoint.records import RequestSpec


class Code(WorkloadType):
    name = "code"
    description = "the corpus's shipped coding prompts in turn (--output-len)"
    options = ("output_len", "chat")
    order = 20

    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        ps = code_prompts()
        counts = [count_tokens(ctx.tokenizer, q) for q in ps]
        reqs = LazyRequests(n, lambda i: RequestSpec(i, ps[i % len(ps)], o.output_len, counts[i % len(ps)], ctx.ignore_eos))
        return Workload(self.name, reqs, ctx.tokenizer is not None, f"{len(ps)} shipped coding prompts, output {o.output_len}",
                        CORPUS_VERSION)


WORKLOAD = Code()
