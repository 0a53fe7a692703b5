"""Stage 60's settings, declared once: `TuneOptions` (the CLI's flags, the notebook's parameters) and
`TuneSettings`, the same options resolved against the spec — the frozen object the run reads."""
from __future__ import annotations

import re

from pydantic import Field, field_validator

from runbook.core import paths
from runbook.core.options import Options, PosFloat
from runbook.core.spec import Deployment

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")   # a tune run's folder name


class TuneOptions(Options):
    candidates: list[str] | None = Field(None, description="only these candidates, e.g. mtp,fp8-kv (the reference always runs; "
                                                                       "default: all)")
    plan_only: bool = Field(False, description="pre-check only: launch nothing; the table of predicted tokens and "
                                               "running-request caps", json_schema_extra={"switch": True})
    yes: bool = Field(False, description="stop the production unit when it is active (restored at the end); "
                                         "without it tune makes a safety stop (exit 77)", json_schema_extra={"switch": True})
    resume: str | None = Field(None, description="continue this tune run (a folder under DIR/tune/), skipping its "
                                                 "finished candidates (default: a new run)", json_schema_extra={"metavar": "RUN_ID"})
    budget_s: PosFloat | None = Field(None, description="the whole run's time bound, seconds (default: the spec's tune.budget_s)")
    archive: str | None = Field(None, description="archive root; runs go to DIR/tune/<run id>/ (default: outputs/)",
                                json_schema_extra={"metavar": "DIR"})

    @field_validator("candidates")
    @classmethod
    def _names(cls, v: list[str] | None) -> list[str] | None:
        names = [n.strip() for n in v or [] if n.strip()]
        if v is not None and not names:
            raise ValueError("must name at least one candidate")
        return names or None

    @field_validator("resume")
    @classmethod
    def _run_id(cls, v: str | None) -> str | None:
        if v is not None and not RUN_ID.match(v):
            raise ValueError("must be a run id: a folder name under the archive's tune/ (letters, digits, . _ -)")
        return v


class TuneSettings(TuneOptions):
    """The options with the spec's values where they were unset: what these fields hold after `resolve`."""

    budget_s: PosFloat
    archive: str

    @classmethod
    def resolve(cls, spec: Deployment, options: TuneOptions) -> TuneSettings:
        unset = {"budget_s": spec.tune.budget_s, "archive": str(paths.outputs_dir())}
        return cls.model_validate({k: unset[k] if v is None and k in unset else v for k, v in options.model_dump().items()})
