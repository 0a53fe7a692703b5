"""code: realistic coding prompts from the frozen corpus (runbook/corpus, written for the project, Apache-2.0)."""
from __future__ import annotations

from runbook.bench.workloads.base import BuildParams, LazyRequests, Workload, WorkloadType
from runbook.bench.workloads.text import _count
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.corpus import code_prompts
from runbook.endpoint.records import RequestSpec


class Code(WorkloadType):
    name = "code"
    description = "the corpus's shipped coding prompts in turn (--output-len)"
    options = ("output_len", "chat")
    order = 20

    def build(self, ref: str, n: int, p: BuildParams) -> Workload:
        ps = code_prompts()
        counts = [_count(p.tokenizer, q) for q in ps]
        reqs = LazyRequests(n, lambda i: RequestSpec(i, ps[i % len(ps)], p.output_len, counts[i % len(ps)], p.ignore_eos))
        return Workload(self.name, reqs, p.tokenizer is not None, f"{len(ps)} shipped coding prompts, output {p.output_len}",
                        CORPUS_VERSION)


WORKLOAD = Code()
