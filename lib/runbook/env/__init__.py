"""Stage 00: GPUs, driver, serving environment and host checks. `evaluate(spec)` is the entry point
(`runbook env`, 00_environment); `env_frame` is its table."""
from runbook.env.check import EnvReport, assess
from runbook.env.report import env_frame, gpus_frame, processes_frame, topology_frame
from runbook.env.stage import STAGE, EnvOptions, evaluate

__all__ = ["STAGE", "EnvOptions", "EnvReport", "assess", "env_frame", "evaluate", "gpus_frame", "processes_frame", "topology_frame"]
