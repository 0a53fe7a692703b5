"""agentic: multi-turn coding-agent sessions, built as they run (bench/sessions.py): a level at concurrency
N runs N sessions at once, each turn re-sending the conversation so far plus a tool result."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LevelLoad, Workload, WorkloadType
from runbook.core.errors import InputError
from runbook.corpus import VERSION as CORPUS_VERSION

if TYPE_CHECKING:
    from runbook.bench.sweep import Level, LevelResult



def _engine() -> Any:
    """bench/sessions.py, imported when sessions run (numpy and the HTTP client stay out of `runbook --help`)."""
    from runbook.bench import sessions  # lazy: numpy and the HTTP client only when sessions run

    return sessions

class Agentic(WorkloadType):
    name = "agentic"
    description = ("multi-turn agent sessions over the chat API: --turns, --think-time/--think-dist between turns, "
                   "--tool-result-len tokens of tool output per turn, ~--input-len tokens of repository context")
    options = ("turns", "think_time", "think_dist", "tool_result_len", "input_len", "output_len", "seed", "requests")
    # a session's shape changes the work as much as its lengths do
    regression_key = (*WorkloadType.regression_key, "turns", "think_time_s", "think_dist", "tool_result_len")
    order = 50
    one_process = "agentic sessions"
    paired = False

    def check(self, o: BenchSettings) -> None:
        if o.rates:
            raise InputError("{workload} agentic runs sessions at fixed concurrency (N sessions at once); {rates} is for single requests")

    def start(self, o: BenchSettings, ctx: BuildContext) -> Workload:
        from runbook.model.tokenizer import chat_counter  # lazy: jinja2 only when agentic sessions run

        chat = chat_counter(o.tokenizer, ctx.tokenizer)     # lengths as the model's chat template renders them
        return Workload(self.name, [], False, f"agentic sessions: {o.turns} turns, ~{o.input_len}-token repository "
                        f"context, {o.tool_result_len}-token tool results, output {o.output_len}, think "
                        f"{o.think_time:g} s ({o.think_dist})"
                        + ("; client-side lengths through the model's chat template" if chat is not None else ""),
                        CORPUS_VERSION, context=chat)

    def sessions(self, o: BenchSettings, run: Workload, lv: Level, tokenizer: Any) -> LevelLoad:
        assert lv.concurrency
        # --find-max warm: exactly N sessions at once, each to its last turn (the level is what the cache kept)
        n_sess = lv.concurrency
        if o.requests and o.find_max != "warm":
            n_sess = max(n_sess, -(-o.requests // max(1, o.turns)))
        plan = _engine().SessionPlan(n_sess, o, tokenizer, chat=run.context)
        return LevelLoad(plan.warmup_requests(), True, plan.driver(lv.concurrency))

    def level_summary(self, lr: LevelResult) -> dict[str, Any]:
        return {"turns": _engine().per_turn(lr.sound)}

    def summary(self, o: BenchSettings, run: Workload) -> dict[str, Any]:
        return {"turns": o.turns, "think_time_s": o.think_time, "think_dist": o.think_dist,
                "tool_result_len": o.tool_result_len, "chat": True}


WORKLOAD = Agentic()
