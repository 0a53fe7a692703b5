"""Stage 40: serving benchmarks. `evaluate(spec, options)` is the entry point (`runbook
bench`, 40_benchmark): workload from the frozen corpus, sweep, summary, regression check against the
previous archived run. settings.py declares every setting once (BenchSettings; the options are its view);
metrics.py is pure arithmetic; report.py holds the tables and plots."""
from runbook.bench.settings import BenchSettings
from runbook.bench.stage import STAGE, BenchStageOptions, evaluate
from runbook.core.lazy import exports

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"frame": "report", "frames": "report", "plot_cdf": "report", "plot_latency": "report",
    "plot_slo_search": "report", "plot_telemetry": "report", "plot_throughput": "report", "plot_turns": "report",
    "spec_decoding_frame": "report", "speculation_frame": "report", "plot_speculation": "report", "speculation_headline": "report",
    "text_table": "report", "headline": "report", "level_plots": "report", "load_plots": "report",
    "speculation_plot": "report", "turns_frame": "report", "server_frame": "report", "replicas_frame": "report",
    "compare_policies": "policies", "run_with_stop": "failover", "queue_frame": "report",
    "BenchResult": "run", "compare_previous": "regression", "measure": "run",
    "stats": "metrics", "tpot_s": "metrics", "ttft_s": "metrics", "e2e_s": "metrics", "sign_flip_interval": "ab"})

__all__ = ["STAGE", "BenchResult", "BenchSettings", "BenchStageOptions", "measure", "compare_previous", "e2e_s", "evaluate",
           "frame", "frames", "headline", "level_plots", "load_plots", "plot_cdf", "plot_latency", "plot_slo_search",
           "plot_telemetry", "plot_throughput",
           "plot_turns", "queue_frame", "replicas_frame",
           "compare_policies", "run_with_stop", "server_frame", "sign_flip_interval", "spec_decoding_frame", "speculation_frame",
           "plot_speculation", "speculation_headline", "speculation_plot", "stats", "text_table", "tpot_s", "ttft_s", "turns_frame"]
