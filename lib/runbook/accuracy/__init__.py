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
    "kv_layer_table": "report", "kv_layer_errors": "report", "plot_layers": "report", "study_text": "report",
    "layers_frame": "report", "layers_plot": "report", "study_frame": "report", "growth_plot": "report",
    "recall_plots": "report", "identity_frames": "report", "toolcall_tables": "report", "kld_text": "report",
    "kld_frame": "report", "kld_plot": "report", "not_measured": "report",
    "kld_windows": "scoring:windows", "measure_reference": "kldprobe", "measure_candidate": "kldprobe",
    "kld_verdict": "kld:judge", "kld_finding": "kld:verdict",
    "AccuracyReport": "stage", "assess": "stage", "ToolCallReport": "toolcall", "probe_toolcalls": "toolcall:run",
    "first_difference": "identity", "greedy_outputs": "identity:outputs", "run_recall": "probes"})

__all__ = ["STAGE", "AccuracyOptions", "AccuracySettings", "AccuracyReport", "assess", "ToolCallReport", "evaluate", "kv_table",
           "plot_growth", "plot_recall", "kv_layer_table", "kv_layer_errors", "plot_layers", "probe_toolcalls", "toolcall_frames",
           "first_difference", "greedy_outputs", "run_recall", "kld_table", "plot_kld", "kld_windows", "measure_reference",
           "measure_candidate", "kld_verdict", "kld_finding", "study_text", "layers_frame", "layers_plot", "study_frame",
           "growth_plot", "recall_plots", "identity_frames", "toolcall_tables", "kld_text", "kld_frame", "kld_plot",
           "not_measured"]
