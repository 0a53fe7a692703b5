"""random: uniformly random token ids; input length drawn from U[L·(1−r), L·(1+r)] (integers, both ends
included; r = range_ratio, default 0 = exactly L). Never judge spec decoding on this workload: drafts on random
tokens say nothing about real prompts, in either direction (`bench --speculation` measures both)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runbook.bench.prompt_text import count_tokens
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LazyRequests, Workload, WorkloadType
from runbook.core.findings import Finding
from runbook.endpoint.records import RequestSpec


class Random(WorkloadType):
    name = "random"
    description = "uniformly random token ids, input length U[L·(1−r), L·(1+r)] (--input-len, --range-ratio)"
    options = ("input_len", "output_len", "range_ratio", "seed", "chat")
    order = 10

    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        import numpy as np  # lazy: numpy only when random prompts are built

        rng = np.random.default_rng(o.seed)
        lo, hi = int(o.input_len * (1 - o.range_ratio)), int(o.input_len * (1 + o.range_ratio))
        lens = rng.integers(max(1, lo), max(1, hi) + 1, size=n)
        tokenizer, output_len, ignore_eos, chat = ctx.tokenizer, o.output_len, ctx.ignore_eos, bool(o.chat)
        vocab = ctx.vocab_size or (tokenizer.get_vocab_size() if tokenizer is not None else None)

        def gen_random() -> Iterator[RequestSpec]:
            for i, L in enumerate(lens):
                if vocab and not chat:
                    ids = rng.integers(10, vocab - 10, size=int(L)).tolist()
                    yield RequestSpec(i, ids, output_len, int(L), ignore_eos)
                elif tokenizer is not None:
                    ids = rng.integers(10, tokenizer.get_vocab_size() - 10, size=int(L)).tolist()
                    txt = tokenizer.decode(ids)
                    yield RequestSpec(i, txt, output_len, count_tokens(tokenizer, txt), ignore_eos)
                else:
                    words = ["".join(chr(c) for c in rng.integers(97, 123, size=3)) for _ in range(int(L))]
                    yield RequestSpec(i, " ".join(words), output_len, None, ignore_eos)
        exact = bool(vocab and not chat)
        return Workload(self.name, LazyRequests(n, gen_random()), exact,
                        f"random token ids, input length U[{lo}, {hi}], output {output_len}", f"random-seed{o.seed}")

    def findings(self, summary_levels: list[dict[str, Any]]) -> list[Finding]:
        return [Finding("bench.workload", "warn", "random-token prompts: speculative decoding cannot be judged on them",
                        detail="Random tokens say nothing about real prompts: a draft model accepts almost nothing on them, "
                               "while a model that loops on them lets n-gram drafting accept more than on real text "
                               "(measured: bench --speculation).",
                        remedy="Use --workload code or prefix, or --speculation, for spec-decoding decisions.")]


WORKLOAD = Random()
