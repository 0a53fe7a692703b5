"""Stage 50: KV-quantization error offline (kvquant), long-context recall and greedy identity live.
`evaluate(spec, ...)` is the entry point (`runbook accuracy report`, 50_accuracy); `report` holds
its tables and plots."""
from runbook.accuracy.report import kv_table, plot_growth, plot_recall
from runbook.accuracy.stage import AccuracyReport, evaluate

__all__ = ["AccuracyReport", "evaluate", "kv_table", "plot_growth", "plot_recall"]
