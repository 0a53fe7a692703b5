"""Stage 00: GPUs, driver, serving environment and host checks. `evaluate(spec)` is the entry point
(`runbook env`, 00_environment); `env_frame` is its table."""
from runbook.env.check import EnvReport
from runbook.env.check import check as evaluate
from runbook.env.report import env_frame

__all__ = ["EnvReport", "env_frame", "evaluate"]
