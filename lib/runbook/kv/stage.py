"""Stage 20's contract: its settings (the what-ifs over the spec's flags) and `evaluate`, KV-cache and
state memory per GPU the way SGLang sizes its pools."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from runbook.core.numeric import number
from runbook.core.options import Options, PosFloat
from runbook.core.registry import Stage, register
from runbook.core.settings import options_view
from runbook.core.spec import SLO, Deployment
from runbook.kv.memory import Inputs
from runbook.kv.plan import Plan, assess
from runbook.kv.report import text_table

# The flags and notebook parameters: the memory arithmetic's inputs (kv/memory.py) a user sets, None meaning the
# spec's value; the checkpoint dir and the weights' size are the plan's own (kv/plan.py reads them into the inputs).
KvOptions = options_view(Inputs, "KvOptions", own={
    "model_dir": (str | None, Field(None, description="checkpoint or model-card dir (default: the deployment's model)",
                                    json_schema_extra={"positional": "MODEL_DIR", "spec_less": True})),
    "weights_gib": (PosFloat | None, Field(None, description="weights per GPU (default: from the checkpoint)"))})


def evaluate(spec: Deployment | None, options: Options) -> Plan:
    """The plan for the spec (or MODEL_DIR alone) with the options' what-ifs over its flags."""
    return assess(spec, getattr(options, "model_dir", None), options, weights_gib=getattr(options, "weights_gib", None))


def text(p: Plan) -> str:
    """What `runbook kv` prints above its findings: the notebook's first table."""
    return text_table(p) or ""


def figures(data: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    tokens = number(data.get("max_total_num_tokens"))
    return {"kv_tokens_planned": int(tokens)} if tokens is not None else {}


STAGE = register(Stage(20, "kv_memory", "kv", "KV-cache and state memory per GPU, the way SGLang sizes its pools",
                       KvOptions, evaluate, figures=figures, trends=("kv_tokens_planned",), text=text))
