"""Stage 00's contract: one setting of its own over the spec (whether GPUs are required); `evaluate`
checks GPUs, driver, the serving environment and the host."""
from __future__ import annotations

from pydantic import Field

from runbook.core.options import Options
from runbook.core.registry import Stage, register
from runbook.core.spec import Deployment
from runbook.env.check import EnvReport, assess


class EnvOptions(Options):
    require_gpus: bool | None = Field(default=None, description="a missing NVIDIA driver fails the run (default: the "
                                                                "spec's hardware.require_gpus)")


def resolved(spec: Deployment, options: EnvOptions) -> Deployment:
    """The spec as this run checks it: the options' values where they are set."""
    if options.require_gpus is None:
        return spec
    hw = spec.hardware.model_copy(update={"require_gpus": options.require_gpus})
    return spec.model_copy(update={"hardware": hw})


def evaluate(spec: Deployment, options: EnvOptions | None = None) -> EnvReport:
    return assess(resolved(spec, options or EnvOptions()))


STAGE = register(Stage(0, "environment", "env", "GPU, driver, serving-environment and host checks", EnvOptions, evaluate))
