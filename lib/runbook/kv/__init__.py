"""Stage 20: KV-cache and state memory per GPU, the way SGLang sizes its pools. `evaluate(spec, ...)`
is the entry point (`runbook kv`, 20_kv_memory); `memory` holds the pure arithmetic, `report` the
tables, plots and the what-if panel."""
from runbook.core.lazy import exports
from runbook.kv.stage import STAGE, KvOptions, evaluate

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"Plan": "plan", "plan_pools": "plan:plan", "plan_for_rank": "plan",
    "compute_pools": "memory:compute", "candidates_frame": "report", "memory_frame": "report", "topology_frame": "report",
    "ranks_frame": "report", "panel": "report", "plot_capacity": "report", "plot_concurrency": "report",
    "plot_memory": "report", "scenarios_frame": "report", "selected_frame": "report", "story": "report",
    "story_frame": "report", "text_table": "report", "what_if": "report"})

__all__ = ["STAGE", "KvOptions", "Plan", "candidates_frame", "compute_pools", "evaluate", "memory_frame", "panel",
           "plan_for_rank", "plan_pools", "plot_capacity", "plot_concurrency", "plot_memory", "ranks_frame", "scenarios_frame",
           "selected_frame", "story", "story_frame", "text_table", "topology_frame", "what_if"]
