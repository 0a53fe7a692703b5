"""Stage 00's contract: no settings of its own beyond the spec; `evaluate` checks GPUs, driver, the
serving environment and the host."""
from __future__ import annotations

from runbook.core.options import Options
from runbook.core.registry import Stage, register
from runbook.core.spec import Deployment
from runbook.env.check import EnvReport, check


class EnvOptions(Options):
    """Stage 00 reads everything from the spec and the host."""


def evaluate(spec: Deployment, options: EnvOptions | None = None) -> EnvReport:
    return check(spec)


STAGE = register(Stage(0, "environment", "env", "GPU, driver, serving-environment and host checks", EnvOptions, evaluate))
