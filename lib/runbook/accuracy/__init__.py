"""Stage 50: KV-quantization error offline (kvquant), long-context recall, greedy identity, tool calls (`toolcall`)
and KL divergence against a reference (`kld`) live.
`evaluate(spec, ...)` is the entry point (`runbook accuracy report`, 50_accuracy); `report` holds
its tables and plots."""
from runbook.accuracy.settings import AccuracySettings
from runbook.accuracy.stage import STAGE, AccuracyOptions, evaluate
from runbook.core.lazy import exports

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"kv_table": "report", "toolcall_frames": "report", "plot_growth": "report",
    "plot_recall": "report", "kld_table": "report", "plot_kld": "report",
    "AccuracyReport": "stage", "assess": "stage", "ToolCallReport": "toolcall", "probe_toolcalls": "toolcall:run",
    "first_difference": "identity", "greedy_outputs": "identity:outputs", "run_recall": "probes"})

__all__ = ["STAGE", "AccuracyOptions", "AccuracySettings", "AccuracyReport", "assess", "ToolCallReport", "evaluate", "kv_table",
           "plot_growth", "plot_recall", "probe_toolcalls", "toolcall_frames", "first_difference", "greedy_outputs", "run_recall",
           "kld_table", "plot_kld"]
