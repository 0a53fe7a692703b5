"""Stage 00: GPUs, driver, serving environment and host checks. `evaluate(spec)` is the entry point
(`runbook env`, 00_environment); `report` holds its tables."""
from runbook.core.lazy import exports
from runbook.env.stage import STAGE, EnvOptions, evaluate

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"EnvReport": "check", "env_frame": "report", "gpus_frame": "report",
    "processes_frame": "report", "topology_frame": "report"})

__all__ = ["STAGE", "EnvOptions", "EnvReport", "env_frame", "evaluate", "gpus_frame", "processes_frame", "topology_frame"]
