"""Stage 00's contract: one setting of its own over the spec (whether GPUs are required); `evaluate`
checks GPUs, driver, the serving environment and the host."""
from __future__ import annotations

from pydantic import Field

from runbook.core.options import Options
from runbook.core.registry import Stage, register
from runbook.core.settings import Settings, from_spec, options_view
from runbook.core.spec import Deployment, Hardware
from runbook.env.check import EnvReport, assess


class EnvSettings(Settings):
    require_gpus: bool = Field(default=Hardware.model_fields["require_gpus"].default,
                               description="a missing NVIDIA driver fails the run (default: the spec's hardware.require_gpus)",
                               json_schema_extra=from_spec("hardware.require_gpus"))


# The flag and notebook parameter: None is the spec's value; --no-require-gpus turns the spec's true off.
EnvOptions = options_view(EnvSettings, "EnvOptions")


def resolved(spec: Deployment, options: Options) -> Deployment:
    """The spec as this run checks it: the options' values where they are set."""
    s = EnvSettings.resolve(spec, options)
    if s.require_gpus == spec.hardware.require_gpus:
        return spec
    hw = spec.hardware.model_copy(update={"require_gpus": s.require_gpus})
    return spec.model_copy(update={"hardware": hw})


def evaluate(spec: Deployment, options: Options | None = None) -> EnvReport:
    return assess(resolved(spec, options or EnvOptions()))


STAGE = register(Stage(0, "environment", "env", "GPU, driver, serving-environment and host checks", EnvOptions, evaluate))
