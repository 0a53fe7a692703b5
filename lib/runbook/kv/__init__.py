"""Stage 20: KV-cache and state memory per GPU, the way SGLang sizes its pools. `evaluate(spec, ...)`
is the entry point (`runbook kv`, 20_kv_memory); `memory` holds the pure arithmetic, `report` the
tables, plots and the what-if panel."""
from runbook.kv.memory import compute as compute_pools
from runbook.kv.memory import held_at_context
from runbook.kv.plan import Plan, assess, plan_for_rank
from runbook.kv.report import (
                               candidates_frame,
                               memory_frame,
                               panel,
                               plot_capacity,
                               plot_concurrency,
                               plot_memory,
                               ranks_frame,
                               scenarios_frame,
                               selected_frame,
                               story,
                               story_frame,
                               text_table,
                               topology_frame,
                               warm_sessions_frame,
                               what_if,
)
from runbook.kv.stage import STAGE, KvOptions, evaluate

__all__ = ["STAGE", "KvOptions", "Plan", "assess", "candidates_frame", "compute_pools", "evaluate",
           "held_at_context", "memory_frame", "panel", "plan_for_rank", "plot_capacity", "plot_concurrency",
           "plot_memory", "ranks_frame", "scenarios_frame", "selected_frame", "story_frame", "text_table",
           "topology_frame", "story", "warm_sessions_frame", "what_if"]
