"""Stage 10's contract: its one setting and `evaluate`, what SGLang will do with the checkpoint's
weight and KV-cache quantization."""
from __future__ import annotations

from pydantic import Field

from runbook.core.options import Options
from runbook.core.registry import Stage, register
from runbook.core.spec import Deployment
from runbook.model import checkpoint
from runbook.quant.analysis import QuantReport, assess, inspect_checkpoint


class QuantOptions(Options):
    model_dir: str | None = Field(None, description="checkpoint dir or cached HF repo id (default: the deployment's model)",
                                  json_schema_extra={"positional": "MODEL_DIR", "spec_less": True})


def evaluate(spec: Deployment | None, options: QuantOptions) -> QuantReport:
    """The deployment's checkpoint under its flags; without a spec, MODEL_DIR alone (`runbook quant DIR`)."""
    if spec is None:
        return inspect_checkpoint(checkpoint.load(options.model_dir or ""))
    return assess(spec, options.model_dir)


STAGE = register(Stage(10, "quant_config", "quant", "what SGLang will do with a checkpoint's weight and KV-cache quantization",
                       QuantOptions, evaluate))
