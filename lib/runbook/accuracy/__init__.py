"""Stage 50: KV-quantization error offline (kvquant), long-context recall, greedy identity, tool calls (`toolcall`)
and KL divergence against a reference (`kld`) live.
`evaluate(spec, ...)` is the entry point (`runbook accuracy report`, 50_accuracy); `report` holds
its tables and plots."""
from runbook.accuracy.identity import first_difference, greedy_outputs, server_config
from runbook.accuracy.kld import judge as kld_verdict
from runbook.accuracy.kld import verdict as kld_finding
from runbook.accuracy.kldprobe import keep as keep_reference
from runbook.accuracy.kldprobe import measure_candidate, measure_reference
from runbook.accuracy.probes import run_recall
from runbook.accuracy.record import Record, model_identity, server_refusal
from runbook.accuracy.record import read as read_record
from runbook.accuracy.record import refusal as record_refusal
from runbook.accuracy.report import (
                                     growth_plot,
                                     identity_frames,
                                     kld_frame,
                                     kld_plot,
                                     kld_table,
                                     kld_text,
                                     kv_layer_errors,
                                     kv_layer_table,
                                     kv_table,
                                     layers_frame,
                                     layers_plot,
                                     not_measured,
                                     plot_growth,
                                     plot_kld,
                                     plot_layers,
                                     plot_recall,
                                     recall_plots,
                                     study_frame,
                                     study_text,
                                     toolcall_frames,
                                     toolcall_tables,
)
from runbook.accuracy.scoring import windows as kld_windows
from runbook.accuracy.settings import AccuracySettings
from runbook.accuracy.stage import STAGE, AccuracyOptions, AccuracyReport, assess, evaluate
from runbook.accuracy.toolcall import ToolCallReport
from runbook.accuracy.toolcall import run as probe_toolcalls

__all__ = ["STAGE", "AccuracyOptions", "AccuracySettings", "AccuracyReport", "assess", "ToolCallReport", "evaluate",
           "kv_table", "plot_growth", "plot_recall", "kv_layer_table", "kv_layer_errors", "plot_layers",
           "probe_toolcalls", "toolcall_frames", "first_difference", "greedy_outputs", "run_recall", "kld_table",
           "plot_kld", "kld_windows", "measure_reference", "measure_candidate", "kld_verdict", "kld_finding",
           "study_text", "layers_frame", "layers_plot", "study_frame", "growth_plot", "recall_plots",
           "identity_frames", "toolcall_tables", "kld_text", "kld_frame", "kld_plot", "not_measured", "keep_reference",
           "read_record", "Record", "model_identity", "record_refusal", "server_refusal", "server_config"]
