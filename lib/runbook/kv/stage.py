"""Stage 20's contract: its settings (the what-ifs over the spec's flags) and `evaluate`, KV-cache and
state memory per GPU the way SGLang sizes its pools."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from runbook.core.archive import number
from runbook.core.options import ComputeCapability, Options, PosFloat, PosInt
from runbook.core.registry import Stage, register
from runbook.core.spec import SLO, Deployment
from runbook.kv.plan import Plan, plan


class KvOptions(Options):
    model_dir: str | None = Field(None, description="checkpoint or model-card dir (default: the deployment's model)")
    tp: PosInt | None = Field(None, description="tensor parallel size (default: the spec's, else 1)")
    pp: PosInt | None = Field(None, description="pipeline parallel size")
    attn_dp: PosInt | None = Field(None, description="attention data parallel size")
    kv_dtype: str | None = Field(None, description="auto, bf16, fp8_e4m3, fp8_e5m2, mxfp8, nvfp4, fp4_mx_block16 "
                                                      "(default: the spec's --kv-cache-dtype)")
    gpu_mem_gib: PosFloat | None = Field(None, description="memory per GPU (default: the spec's hardware)")
    weights_gib: PosFloat | None = Field(None, description="weights per GPU (default: from the checkpoint)")
    mem_fraction_static: float | None = Field(None, gt=0, le=1,
                                                 description="default: the spec's flag, else SGLang's heuristic")
    kv_budget_gib: PosFloat | None = Field(None, description="KV+state budget per GPU, skipping the memory arithmetic")
    page_size: PosInt | None = Field(None, description="SGLang --page-size")
    context_len: PosInt | None = Field(None, description="SGLang --context-length (default: the spec's flag, else the model's)")
    contexts: list[PosInt] | None = Field(None, description="request lengths to fit, e.g. 8192,32768,131072,262144 (the default)")
    speculative_algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] | None = Field(
        None, description="what-if speculative decoding (NEXTN: the checkpoint's own MTP layers)")
    speculative_num_steps: PosInt | None = None
    speculative_eagle_topk: PosInt | None = None
    speculative_num_draft_tokens: PosInt | None = None
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(None, description="hybrid models' SSM state dtype")
    max_running_requests: PosInt | None = None
    attention_backend: str | None = Field(None, description="SGLang attention backend (moves the prefill graph reserve and page size)")
    compute_capability: ComputeCapability | None = Field(
        None, description="GPU compute capability, e.g. 9.0 (H200), 10.0 (B200), 12.0 (RTX PRO 6000)")


# KvOptions field -> kv.plan's override (the memory arithmetic's own names)
_PLAN_NAMES = {"speculative_algorithm": "spec_algorithm", "speculative_num_steps": "spec_num_steps",
               "speculative_eagle_topk": "spec_eagle_topk", "speculative_num_draft_tokens": "spec_num_draft_tokens"}


def evaluate(spec: Deployment | None, options: KvOptions) -> Plan:
    """The plan for the spec (or MODEL_DIR alone) with the options' what-ifs over its flags."""
    what_if = {_PLAN_NAMES.get(k, k): v for k, v in options.model_dump(exclude={"model_dir"}).items() if v is not None}
    return plan(spec, options.model_dir, **what_if)


def text(p: Plan) -> str:
    """What `runbook kv` prints above its findings: the notebook's first table."""
    from runbook.kv.report import text_table  # lazy: the report module (plots) only when a table is printed

    return text_table(p)


def figures(data: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    tokens = number(data.get("max_total_num_tokens"))
    return {"kv_tokens_planned": int(tokens)} if tokens is not None else {}


STAGE = register(Stage(20, "kv_memory", "kv", "KV-cache and state memory per GPU, the way SGLang sizes its pools",
                       KvOptions, evaluate, figures=figures, trends=("kv_tokens_planned",), text=text))
