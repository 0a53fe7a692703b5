"""Stage 40: serving benchmarks. `evaluate(spec, options)` is the entry point (`runbook
bench`, 40_benchmark): workload from the frozen corpus, sweep, summary, regression check against the
previous archived run. settings.py declares every setting once (BenchSettings; the options are its view);
metrics.py is pure arithmetic; report.py holds the tables and plots."""
from runbook.bench.ab import sign_flip_interval
from runbook.bench.failover import run_with_stop
from runbook.bench.metrics import e2e_s, stats, tpot_s, ttft_s
from runbook.bench.policies import compare_policies
from runbook.bench.regression import compare_previous
from runbook.bench.report import (
                                  frame,
                                  frames,
                                  headline,
                                  level_plots,
                                  load_plots,
                                  plot_cdf,
                                  plot_latency,
                                  plot_slo_search,
                                  plot_speculation,
                                  plot_telemetry,
                                  plot_throughput,
                                  plot_turns,
                                  plot_warm,
                                  queue_frame,
                                  replicas_frame,
                                  server_frame,
                                  spec_decoding_frame,
                                  speculation_frame,
                                  speculation_headline,
                                  speculation_plot,
                                  text_table,
                                  turns_frame,
                                  warm_frame,
)
from runbook.bench.run import BenchResult, assess
from runbook.bench.settings import BenchSettings
from runbook.bench.stage import STAGE, BenchStageOptions, evaluate

__all__ = ["STAGE", "BenchResult", "BenchSettings", "BenchStageOptions", "assess", "compare_previous", "e2e_s",
           "evaluate", "frame", "frames", "plot_cdf", "plot_latency", "plot_slo_search", "plot_telemetry",
           "plot_throughput", "plot_turns", "queue_frame", "replicas_frame", "compare_policies", "run_with_stop",
           "server_frame", "sign_flip_interval", "spec_decoding_frame", "speculation_frame", "plot_speculation",
           "speculation_headline", "stats", "text_table", "tpot_s", "ttft_s", "turns_frame", "headline",
           "level_plots", "load_plots", "speculation_plot", "plot_warm", "warm_frame"]
