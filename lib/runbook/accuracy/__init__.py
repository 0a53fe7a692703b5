"""Stage 50: KV-quantization error offline (kvquant), long-context recall, greedy identity and
tool calls (`toolcall`) live.
`evaluate(spec, ...)` is the entry point (`runbook accuracy report`, 50_accuracy); `report` holds
its tables and plots."""
from runbook.accuracy.report import kv_table, plot_growth, plot_recall
from runbook.accuracy.stage import STAGE, AccuracyOptions, AccuracyReport, assess, evaluate
from runbook.accuracy.toolcall import ToolCallReport
from runbook.accuracy.toolcall import run as probe_toolcalls

__all__ = ["STAGE", "AccuracyOptions", "AccuracyReport", "assess", "ToolCallReport", "evaluate", "kv_table", "plot_growth", "plot_recall",
           "probe_toolcalls"]
