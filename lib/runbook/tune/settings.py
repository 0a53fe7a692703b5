"""Stage 60's settings, declared once: `TuneSettings`, the frozen object the run reads, and `TuneOptions`, its view as
the CLI's flags and the notebook's parameters (None: unset); `TuneSettings.resolve` (core/settings.py's one merge)
takes the spec's tune.budget_s where the options leave it unset."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from runbook.core import paths
from runbook.core.options import PosFloat
from runbook.core.settings import Settings, from_spec, options_view
from runbook.core.tunespec import Tune

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")   # a tune run's folder name


def _names(v: list[str]) -> list[str]:
    names = [n.strip() for n in v if n.strip()]
    if not names:
        raise ValueError("must name at least one candidate")
    return names


def _run_id(v: str) -> str:
    if not RUN_ID.match(v):
        raise ValueError("must be a run id: a folder name under the archive's tune/ (letters, digits, . _ -)")
    return v


class TuneSettings(Settings):
    candidates: Annotated[list[str], AfterValidator(_names)] | None = Field(
        None, description="only these candidates, e.g. mtp,fp8-kv (the reference always runs; default: all)")
    plan_only: bool = Field(False, description="pre-check only: launch nothing; the table of predicted tokens and "
                                               "running-request caps", json_schema_extra={"switch": True})
    yes: bool = Field(False, description="stop the production unit when it is active (restored at the end); "
                                         "without it tune makes a safety stop (exit 77)", json_schema_extra={"switch": True})
    resume: Annotated[str, AfterValidator(_run_id)] | None = Field(
        None, description="continue this tune run (a folder under DIR/tune/), skipping its finished candidates (default: a new run)",
        json_schema_extra={"metavar": "RUN_ID"})
    record: str | None = Field(
        None, description="a recorded reference (runbook accuracy record) that every candidate's KL divergence is judged "
                          "against, the reference's own launch included: for a reference configuration this host cannot "
                          "run (default: the reference's live scores)", json_schema_extra={"metavar": "FILE"})
    budget_s: PosFloat = Field(Tune.model_fields["budget_s"].default, json_schema_extra=from_spec("tune.budget_s"),
                               description="the whole run's time bound, seconds (default: the spec's tune.budget_s)")
    archive_root: str = Field(default_factory=lambda: str(paths.outputs_dir()), alias="archive",
                              description="archive root; runs go to DIR/tune/<run id>/ (default: outputs/)",
                              json_schema_extra={"metavar": "DIR"})


# The flags and notebook parameters: every setting, None meaning unset (the spec's value, else the default above).
TuneOptions = options_view(TuneSettings, "TuneOptions")
