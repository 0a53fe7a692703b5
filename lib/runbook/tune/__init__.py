"""Stage 60: tune, which finds the configuration to serve (`runbook tune`, 60_tune): every candidate of the
spec's `tune:` section is pre-checked without launching anything (unit, the candidate's own SGLang parser,
the KV plan), then launched one at a time with the production unit paused (`launch`, `production`), its
start-up log read, benchmarked per context-length bucket, guarded for accuracy against the reference, and
taken down (where the spec declares a gateway: its policies, the gateway alone relaunched in front of the
replicas); `report` holds the table, the Pareto plot and the recommendation's text."""
from runbook.tune.report import buckets_frame, frame, frames, launches_frame, plot_pareto, recommendation_text, text_table, turns_frame
from runbook.tune.stage import STAGE, TuneOptions, TuneReport, assess, evaluate

__all__ = ["STAGE", "TuneOptions", "TuneReport", "assess", "buckets_frame", "evaluate", "frame", "frames", "launches_frame", "plot_pareto",
           "recommendation_text", "text_table", "turns_frame"]
