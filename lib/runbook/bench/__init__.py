"""Stage 40: serving benchmarks. `evaluate(spec, options, archive_root)` is the entry point (`runbook
bench`, 40_benchmark): workload from the frozen corpus, sweep, summary, regression check against the
previous archived run. metrics.py is pure arithmetic; report.py holds the tables and plots."""
from runbook.bench.report import (
           frame,
           plot_cdf,
           plot_latency,
           plot_slo_search,
           plot_telemetry,
           plot_throughput,
           plot_turns,
           spec_decoding_frame,
           turns_frame,
)
from runbook.bench.run import (
           BenchOptions,
           BenchResult,
           compare_previous,
           measure,
           options_from,
)
from runbook.bench.stage import STAGE, BenchStageOptions, evaluate

__all__ = ["STAGE", "BenchOptions", "BenchResult", "BenchStageOptions", "measure", "compare_previous", "evaluate", "frame", "options_from",
           "plot_cdf", "plot_latency", "plot_slo_search", "plot_telemetry", "plot_throughput", "plot_turns", "spec_decoding_frame",
           "turns_frame"]
