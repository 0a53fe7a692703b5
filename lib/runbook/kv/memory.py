"""KV-cache and hybrid-state memory, per GPU, by SGLang 0.5.23's own rules.

Pure arithmetic over an `arch.Arch`. The rules (with SGLang file:line) are summarised in the
project's reference notes; each function names the rule it implements. The bytes per token and per request that
the pools are made of are cells.py's. Units are in the names: bytes unless a name says gib or mib.
"""
from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.options import ComputeCapability, FiniteFloat, Integer, NonNegInt, PosFloat, PosInt, validate
from runbook.core.settings import Settings, from_spec, internal
from runbook.core.units import GIB, MIB
from runbook.kv import defaults
from runbook.kv.cells import cell_bytes, dsa_indexer_bytes, kv_heads_per_gpu, layout_words, replication, state_bytes_per_request
from runbook.model import sglang_names
from runbook.model.arch import Arch

KV_DTYPES = tuple(sglang_names.KV_DTYPES)
_FLAG_NAMES = ", ".join(c for c in sglang_names.KV_CACHE_DTYPE_CHOICES if c not in ("auto", "bfloat16"))
DEFAULT_CONTEXTS = (8192, 32768, 131072, 262144)


def normalise_dtype(d: str) -> str:
    name = sglang_names.kv_dtype_name(d)
    if name is None:
        raise InputError(f"{{kv_dtype}} {d}: not a KV cache dtype (use one of {_FLAG_NAMES})")
    return name


_SIZE = Field(le=65536)   # a TP, PP, DP or page size above this is a typo, not a plausible size
Size = Annotated[PosInt, _SIZE]


_at = from_spec        # where in the spec a field's value is (core/settings.py); _flag: the spec's SGLang flag --name
_flag = lambda name: from_spec(f"serving.flags.{name}")   # noqa: E731


# arg_groups/serving_hook.py: --mamba-ssm-dtype is passed on as SGLANG_MAMBA_SSM_DTYPE, which wins
_ssm = lambda spec, given: (spec.serving.env.get("SGLANG_MAMBA_SSM_DTYPE") or spec.serving.flags.get("mamba-ssm-dtype")  # noqa: E731
                                  ) if spec else None
_explicit = lambda spec, given: True if given.get("context_len") is not None or (  # noqa: E731
    spec and spec.serving.flags.get("context-length") is not None) else None


class Inputs(Settings):
    """Everything the calculation depends on besides the architecture: SGLang's server args that size memory, and the
    hardware; each with where the spec holds it. Flags and notebook parameters: the fields not internal (kv/stage.py's
    `KvOptions`); kv/plan.py resolves them. Frozen and validated: `but` is the one way to change a value."""

    kv_dtype: str = Field(default="bfloat16", description="auto, bf16, fp8_e4m3, fp8_e5m2, mxfp8, nvfp4, fp4_mx_block16 "
                                                           "(default: the spec's --kv-cache-dtype)")
    tp: Size = Field(default=1, description="tensor parallel size (default: the spec's, else 1)", json_schema_extra=_at("parallelism.tp"))
    pp: Size = Field(default=1, description="pipeline parallel size (default: the spec's, else 1)", json_schema_extra=_at("parallelism.pp"))
    attn_dp: Size = Field(default=1, description="attention data parallel size (default: the spec's, else 1)",
                          json_schema_extra=_at("parallelism.attn_dp"))
    gpu_mem_gib: PosFloat | None = Field(default=None, description="memory per GPU (default: the spec's hardware)",
                                         json_schema_extra=_at("hardware.gpu_memory_gib"))
    weights_bytes_per_gpu: NonNegInt | None = internal(None, "weights per GPU: --weights-gib, else from the checkpoint")
    mem_fraction_static: Annotated[FiniteFloat, Field(gt=0, le=1)] | None = Field(
        default=None, description="default: the spec's flag, else SGLang's heuristic", json_schema_extra=_flag("mem-fraction-static"))
    kv_budget_gib: PosFloat | None = Field(default=None, description="KV+state budget per GPU, skipping the memory arithmetic "
                                                      "(default: from the memory arithmetic)")
    page_size: Size | None = Field(default=None, description="SGLang --page-size (default: the spec's, else the backend's)",
                                    json_schema_extra=_flag("page-size"))
    context_len: PosInt | None = Field(default=None, json_schema_extra=_flag("context-length"),
                                       description="SGLang --context-length (default: the spec's flag, else the model's)")
    contexts: Annotated[list[PosInt], AfterValidator(lambda v: v or list(DEFAULT_CONTEXTS))] = Field(  # []: the defaults
        default_factory=lambda: list(DEFAULT_CONTEXTS), description="request lengths to fit")
    chunked_prefill_size: PosInt | None = internal(None, "--chunked-prefill-size", "serving.flags.chunked-prefill-size")
    max_running_requests: PosInt | None = Field(default=None, json_schema_extra=_flag("max-running-requests"),
                                                 description="SGLang's --max-running-requests (default: the spec's, else SGLang's own cap)")
    max_total_tokens: PosInt | None = internal(None, "--max-total-tokens", "serving.flags.max-total-tokens")
    mamba_full_memory_ratio: FiniteFloat = internal(0.9, "--mamba-full-memory-ratio", "serving.flags.mamba-full-memory-ratio")
    max_mamba_cache_size: Integer | None = internal(None, "--max-mamba-cache-size", "serving.flags.max-mamba-cache-size")
    disable_radix_cache: bool = internal(False, "--disable-radix-cache", "serving.flags.disable-radix-cache")
    swa_full_tokens_ratio: FiniteFloat = internal(0.8, "--swa-full-tokens-ratio", "serving.flags.swa-full-tokens-ratio")
    # speculative decoding (--speculative-*): changes the running-request default, adds draft KV and, on hybrid models, an
    # intermediate SSM state per draft token. Any name SGLang takes: the ones not modelled warn. Keyed spec_* in `kv --json`.
    speculative_algorithm: str | None = Field(
        default=None, serialization_alias="spec_algorithm", json_schema_extra=_flag("speculative-algorithm"),
        description="what-if speculative decoding: EAGLE, EAGLE3, NEXTN (the checkpoint's own MTP layers), STANDALONE "
                    "(default: the spec's)")
    speculative_num_steps: PosInt | None = Field(default=None, serialization_alias="spec_num_steps", json_schema_extra=_flag(
        "speculative-num-steps"), description="SGLang's --speculative-num-steps (default: the spec's, else SGLang's choice)")
    speculative_eagle_topk: PosInt | None = Field(default=None, serialization_alias="spec_eagle_topk", json_schema_extra=_flag(
        "speculative-eagle-topk"), description="SGLang's --speculative-eagle-topk (default: the spec's, else SGLang's choice)")
    speculative_num_draft_tokens: PosInt | None = Field(default=None, serialization_alias="spec_num_draft_tokens", json_schema_extra=_flag(
        "speculative-num-draft-tokens"), description="SGLang's --speculative-num-draft-tokens (default: the spec's, else SGLang's choice)")
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="hybrid models' SSM state dtype (default: the spec's, else the model's)",
        json_schema_extra=from_spec(_ssm, at="serving.flags.mamba-ssm-dtype"))
    compute_capability: ComputeCapability | None = Field(default=None, json_schema_extra=_at("hardware.compute_capability"),
                                                         description="GPU compute capability, e.g. 9.0 (H200), 10.0 (B200), "
                                                                     "12.0 (RTX PRO 6000) (default: the spec's hardware)")
    quantization: str | None = internal(None, "the method SGLang builds (ModelConfig.quantization): its GPU minimum")
    attention_backend: str | None = Field(default=None, json_schema_extra=_flag("attention-backend"),
                                          description="SGLang attention backend (moves the prefill graph reserve and page size) "
                                                      "(default: the spec's, else SGLang's choice)")
    cuda_graph_max_bs: PosInt | None = internal(None, "--cuda-graph-max-bs", "serving.flags.cuda-graph-max-bs")
    disable_cuda_graph: bool = internal(False, "--disable-cuda-graph", "serving.flags.disable-cuda-graph")
    disable_overlap_schedule: bool = internal(False, "--disable-overlap-schedule", "serving.flags.disable-overlap-schedule")
    context_len_explicit: bool = internal(False, "--context-length given (checked against the model's)", _explicit)

    @model_validator(mode="after")
    def _rules(self) -> Inputs:
        if self.tp and self.attn_dp and self.tp % self.attn_dp:     # None: unset (the options)
            raise ValueError(f"{{attn_dp}} {self.attn_dp} must divide {{tp}} {self.tp}")
        return self

    def but(self, **changes: Any) -> Inputs:
        """These inputs with `changes` (None unsets a value: its default), validated as a whole; InputError naming
        the flag when a value or a rule fails."""
        return validate(Inputs, {**self.model_dump(), **changes}, cli=True)

    def to_json(self) -> dict[str, Any]:
        """`kv --json`'s inputs: the spec_* keys it always had."""
        return self.model_dump(by_alias=True)


@dataclass
class PipelineStage:
    """One pipeline-parallel rank's layers (`--pp-size`): their KV and state bytes (the results' `stages`)."""
    index: int
    start_layer: int
    end_layer: int
    kv_layers: int
    full_layers: int
    swa_layers: int
    linear_layers: int
    cell_bytes: float
    state_bytes_per_request: int


@dataclass
class Result:
    kv_dtype: str
    kv_bytes_per_token_per_gpu: int
    kv_layers: int
    kv_heads_per_gpu: int
    kv_head_replication: float
    state_bytes_per_request_per_gpu: int
    state_slots_per_request: int
    max_state_slots: int | None
    kv_budget_bytes_per_gpu: int | None
    max_total_num_tokens: int | None
    max_running_requests: int | None
    requests_at_context: dict[str, int | None]
    mem_fraction_static: float | None = None
    mem_fraction_source: str = ""
    weights_bytes_per_gpu: int | None = None
    state_pool_bytes_per_gpu: int = 0
    kv_pool_bytes_per_gpu: int | None = None
    reserved_bytes_per_gpu: int | None = None
    swa_tokens: int | None = None
    context_len: int | None = None
    kv_limited_requests_at_context: dict[str, int | None] = field(default_factory=dict)
    layout: str = ""
    stages: list[dict[str, Any]] = field(default_factory=list)
    speculative: str | None = None              # e.g. "EAGLE (3 steps, topk 1, 4 draft tokens)"
    draft_kv_bytes_per_token_per_gpu: int = 0      # the draft worker's own KV pool, per token (what its log line shows)
    draft_kv_budget_bytes_per_token_per_gpu: int = 0   # the draft's share of kv_bytes_per_token_per_gpu (the budget's cell)
    draft_kv_pool_bytes_per_gpu: int | None = None     # a draft pool allocated after the target's, outside the KV budget
    spec_state_bytes_per_gpu: int = 0              # intermediate SSM state for draft tokens (hybrid)
    page_size: int = 1
    attention_backend: str | None = None
    nvfp4_scale_layouts: int = 1                   # NVFP4 block-scale layouts the backends keep (1 for other dtypes)
    mem_fraction_detail: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["findings"] = [f.to_dict() for f in self.findings]
        return d


# ---- per GPU (the cells themselves: cells.py) -----------------------------------------------

def attn_tp(inp: Inputs) -> int:
    """runtime_context.py:73-76: attention TP = tp // attn_dp (context parallel not modelled)."""
    return inp.tp // inp.attn_dp


def pp_stages(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """distributed/utils.py:110-150: remainder layers go to the last stages."""
    base, rem = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s >= pp - rem else 0)
        out.append((start, start + n))
        start += n
    return out


# ---- budget --------------------------------------------------------------------------------

def slots_per_request(arch: Arch, disable_radix_cache: bool, overlap: bool = True) -> int:
    """kv_cache_configurator.py KVCacheConfigurator._calculate_mamba_ratio: 1 without radix cache; else 3
    + the extra_buffer tracking slots (mem_cache/allocation_sizing.py get_mamba_tracking_slots): 2 with
    the overlap scheduler, 1 without it (PP > 1 or --disable-overlap-schedule), for the architectures
    arg_groups/overrides.py lets use the extra buffer (_MAMBA_EXTRA_BUFFER_ARCHS; LFM2 is not one)."""
    if arch.linear is None:
        return 0
    if disable_radix_cache:
        return 1
    return 3 + ((2 if overlap else 1) if arch.architecture in sglang_names.MAMBA_EXTRA_BUFFER_ARCHS else 0)


def held_at_context(tokens: int, page: int, context: int) -> int:
    """How many requests (or idle agent sessions) of `context` tokens a pool of `tokens` holds at once: each one
    takes whole pages (SGLang allocates KV in pages of `page` tokens)."""
    return tokens // (math.ceil(context / page) * page)


def estimate_max_running(tokens: int, context_len: int) -> int:
    """resolve_max_num_reqs: clamp(tokens / context_len * 512, 2048, 4096)."""
    return min(max(int(tokens / context_len * 512), 2048), 4096)


# ---- the whole calculation -----------------------------------------------------------------

def compute(arch: Arch, inp: Inputs) -> Result:
    kv_dtype = normalise_dtype(inp.kv_dtype)
    a_tp = attn_tp(inp)
    findings: list[Finding] = []
    spec = defaults.speculative(arch, inp.speculative_algorithm, inp.speculative_num_steps, inp.speculative_eagle_topk,
                                 inp.speculative_num_draft_tokens)
    ssm_dtype = inp.mamba_ssm_dtype
    backend = defaults.attention_backend(arch, inp.compute_capability, inp.attention_backend, spec)
    heads_why = defaults.tp_refusal(arch, a_tp)
    explicit = inp.attention_backend or defaults.override_backend(arch, inp.compute_capability, spec)
    refused = defaults.refusals(arch, kv_dtype, backend, inp.compute_capability, explicit, inp.quantization)
    fp4 = defaults.fp4_recipe(kv_dtype, explicit, inp.compute_capability)
    for why in refused + ([heads_why] if heads_why else []):
        findings.append(Finding("kv.refused", "fail", "SGLang refuses to start: " + why[0], detail=why[1], remedy=why[2]))
    stages: list[PipelineStage] = []
    draft_bytes = draft_budget = 0
    full, swa, lin = set(arch.full_layer_ids), set(arch.swa_layer_ids), set(arch.linear_layer_ids)
    for i, (s, e) in enumerate(pp_stages(arch.num_layers, inp.pp)):
        nf = sum(1 for x in range(s, e) if x in full)
        ns = sum(1 for x in range(s, e) if x in swa)
        nl = sum(1 for x in range(s, e) if x in lin)
        cell = cell_bytes(arch, kv_dtype, a_tp, nf, ns, inp.swa_full_tokens_ratio, *fp4,
                          raw_dsa_layout=defaults.dsa_raw_layout(arch, inp.compute_capability))
        if spec is not None and spec.draft_kv_layers and nf + ns and not arch.hybrid_swa:
            # pool_configurator.py DefaultPoolConfigurator: the EAGLE/MTP draft shares the target's per-layer KV size
            if arch.dsa:
                target_kv = cell - dsa_indexer_bytes(arch, nf + ns)
                extra = int(target_kv * spec.draft_kv_layers / (nf + ns)) + dsa_indexer_bytes(arch, spec.draft_kv_layers)
            else:
                extra = int(cell * spec.draft_kv_layers / (nf + ns))
            cell += extra
            draft_budget = draft_bytes = max(draft_budget, extra)
        stages.append(PipelineStage(i, s, e, nf + ns, nf, ns, nl, cell, state_bytes_per_request(arch, a_tp, nl, ssm_dtype)))
    if spec is not None and spec.own_mtp and arch.linear is not None:
        draft_bytes = _own_draft_pool_bytes(arch, kv_dtype, a_tp, spec.draft_kv_layers or 1, fp4)
    heads = kv_heads_per_gpu(arch, a_tp)
    ctx = inp.context_len or arch.max_context or 2048
    overlap = inp.pp == 1 and not inp.disable_overlap_schedule
    slots = slots_per_request(arch, inp.disable_radix_cache, overlap)
    per_slot = _stage_state_bytes(arch, a_tp, stages, ssm_dtype)   # the budget's charge; slot_bytes: what a slot holds
    slot_bytes = max(st.state_bytes_per_request for st in stages) if stages else 0
    page, page_why = defaults.page_size(arch, backend, inp.page_size, kv_dtype, inp.compute_capability)
    res = Result(kv_dtype=kv_dtype, kv_bytes_per_token_per_gpu=0, kv_layers=0, kv_heads_per_gpu=heads,
                 kv_head_replication=replication(arch, a_tp), state_bytes_per_request_per_gpu=slot_bytes,
                 state_slots_per_request=slots, max_state_slots=None, kv_budget_bytes_per_gpu=None,
                 max_total_num_tokens=None, max_running_requests=None, requests_at_context={}, context_len=ctx,
                 weights_bytes_per_gpu=inp.weights_bytes_per_gpu, layout=layout_words(arch, a_tp),
                 stages=[asdict(s) for s in stages], speculative=spec.words if spec else None,
                 draft_kv_bytes_per_token_per_gpu=draft_bytes, draft_kv_budget_bytes_per_token_per_gpu=draft_budget,
                 page_size=page, attention_backend=backend, nvfp4_scale_layouts=fp4[0])
    if page_why:
        findings.append(Finding("kv.page_size", "info", f"page size {page}", detail=page_why))
    if slots == 3 and (inp.page_size not in (None, 1) or explicit == "trtllm_mha"):
        # arg_groups/mamba_hook.py validate_mamba_no_buffer: a radix cache without the extra buffer (it runs before
        # the KV-dtype hooks force a page size, so only a given page size or backend counts)
        findings.append(Finding("kv.refused", "fail", "SGLang refuses to start: " + (
            f"{arch.architecture}'s state cache (no extra buffer) needs page size 1, not {inp.page_size}"
            if inp.page_size not in (None, 1) else
            f"{arch.architecture}'s state cache (no extra buffer) does not run on trtllm_mha"),
            detail="arg_groups/mamba_hook.py validate_mamba_no_buffer",
            remedy="Leave --page-size unset and use another attention backend, or --disable-radix-cache."))
    binding = max(stages, key=lambda s: s.cell_bytes)
    res.kv_bytes_per_token_per_gpu = math.ceil(binding.cell_bytes)
    res.kv_layers = binding.kv_layers
    if inp.context_len_explicit and inp.context_len and arch.max_context and inp.context_len > arch.max_context:
        # configs/model_config.py ModelConfig._derive_context_length raises ValueError
        findings.append(Finding("kv.context", "fail", f"SGLang refuses to start: --context-length {inp.context_len:,} is above "
                                                      f"the model's derived context length {arch.max_context:,}",
                                detail=f"derived from {arch.context_source}; SGLang raises unless "
                                       "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is set",
                                remedy=f"Lower --context-length to at most {arch.max_context:,}, or set "
                                       "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in serving.env if the model really extrapolates."))
    mrr_arg = inp.max_running_requests
    if mrr_arg is None and spec is not None:
        mrr_arg = defaults.SPEC_RUNNING_REQUESTS
    budget = _budget(arch, inp, res, findings, mrr_arg, backend)
    if budget is not None:
        _pools(arch, inp, res, stages, budget, ctx, slots, per_slot, findings, spec, mrr_arg)
    res.findings = findings + _findings(arch, inp, res)
    return res


def _own_draft_pool_bytes(arch: Arch, kv_dtype: str, a_tp: int, layers: int, fp4_recipe: tuple[int, int]) -> int:
    """The MTP draft worker's own pool on a hybrid linear-attention model, per token, with the target's token count:
    one full-attention layer ([0]: kv_cache_configurator.py _build_hybrid_linear_kv_pool), or the config's
    num_nextn_predict_layers where the draft has no linear layers (Nemotron-H's "*E" MTP: a plain MHA pool). Without
    that key in the target's config (Qwen3-Next, Qwen3.5) the budget's cell holds no draft share
    (spec_aux_hidden_state.py): the pool is allocated after the target's, out of the memory left. An FP4 pool has its
    own dequant workspace, so it is not the budget's share even where there is one."""
    layouts, workspace_esz = fp4_recipe
    return math.ceil(cell_bytes(arch, kv_dtype, a_tp, layers, nvfp4_layouts=layouts, dequant_workspace_esz=workspace_esz))


def _stage_state_bytes(arch: Arch, a_tp: int, stages: list[PipelineStage], ssm_dtype: str | None) -> int:
    """kv_cache_configurator.py:3233-3260 _handle_max_mamba_cache: every rank is charged the largest stage share, as
    int(all layers' bytes × (largest stage's layers / all layers)) — SGLang's float, truncated, so a byte below what
    one slot of that stage's pool holds where the float lands under the whole number (Qwen3.5-397B PP2 TP4:
    48,015,360 × 23/45 = 24,541,183.99…). The pool itself allocates only the stage's layers
    (kv_cache_configurator.py:1603-1610, memory_pool.py:722-751): the largest stage's state_bytes_per_request."""
    n_all = len(arch.linear_layer_ids)
    if len(stages) == 1 or not n_all:
        return stages[0].state_bytes_per_request if stages else 0
    scale = max(st.linear_layers for st in stages) / n_all
    return int(state_bytes_per_request(arch, a_tp, n_all, ssm_dtype) * scale)


def _budget(arch: Arch, inp: Inputs, res: Result, findings: list[Finding], mrr_arg: int | None,
            backend: str | None) -> float | None:
    """The KV+state budget per GPU in GiB (a float, as SGLang carries it), or None."""
    if inp.kv_budget_gib is not None:
        res.mem_fraction_source = "KV+state budget given directly"
        return float(inp.kv_budget_gib)
    if inp.gpu_mem_gib is None or inp.weights_bytes_per_gpu is None:
        missing = " and ".join(n for n, v in (("GPU memory", inp.gpu_mem_gib), ("weights per GPU", inp.weights_bytes_per_gpu)) if v is None)
        findings.append(Finding("kv.budget", "skip", f"capacity not computed: {missing} unknown",
                                detail="Bytes per token are exact; token capacity needs the memory left after the weights.",
                                remedy="Give --gpu-mem-gib and --weights-gib (or put the checkpoint here), or --kv-budget-gib."))
        return None
    if inp.mem_fraction_static is None:
        mf = defaults.mem_fraction_static(arch, inp.gpu_mem_gib, inp.tp, inp.pp, inp.attn_dp, inp.chunked_prefill_size,
                                          inp.max_running_requests,
                                          inp.cuda_graph_max_bs, inp.max_total_tokens, backend, inp.disable_cuda_graph)
        frac, how = mf.value, mf.words
        res.mem_fraction_detail = asdict(mf)
    else:
        frac, how = inp.mem_fraction_static, "given (--mem-fraction-static)"
    res.mem_fraction_static, res.mem_fraction_source = frac, how
    total = inp.gpu_mem_gib * GIB
    res.reserved_bytes_per_gpu = int(total * (1 - frac))
    rest_gib = budget_gib(inp.gpu_mem_gib, inp.weights_bytes_per_gpu, frac,
                          defaults.multimodal_reservation_mib(arch, inp.compute_capability) if arch.multimodal else 0,
                          world_size=inp.tp * inp.pp)
    if rest_gib <= 0:
        findings.append(Finding("kv.budget", "fail", "no memory left for the KV cache",
                                detail=f"{inp.gpu_mem_gib:g} GiB × {frac} = {total * frac / GIB:.1f} GiB static, but weights take "
                                       f"{inp.weights_bytes_per_gpu / GIB:.1f} GiB per GPU",
                                remedy="Raise TP/PP, use a smaller quantization, or raise --mem-fraction-static."))
        return None
    return rest_gib


def free_gib(free_bytes: float, world_size: int = 1) -> float:
    """utils/common.py:569-576 get_available_gpu_memory: with more than one rank the free bytes are all-reduced
    (MIN) as a float32 tensor, which keeps 24 bits (a 100 GiB figure moves by up to 4 KiB), then divided by 2**30."""
    if world_size > 1:
        free_bytes = struct.unpack("f", struct.pack("f", free_bytes))[0]
    return free_bytes / GIB


def budget_gib(gpu_mem_gib: float, weights_bytes: int, fraction: float, reserved_mib: float = 0,
               world_size: int = 1) -> float:
    """kv_cache_configurator.py:2990-3060 _profile_available_bytes, in SGLang's own GiB floats: free memory after
    the weights minus pre_load_free × (1 − fraction) minus the multimodal reservation, both free figures measured
    as `free_gib` does over the launch world (tp × pp; bootstrap.py:207-212, kv_cache_configurator.py:3000-3004).
    The caller truncates `× 2**30` to bytes as SGLang does (rounding first would land a byte above its budget)."""
    # torch.cuda.mem_get_info counts whole bytes: a GiB figure like 140.4 is 150,752,040,550.4 of them, and the
    # fraction of a byte would surface as one more byte of budget
    total = int(gpu_mem_gib * GIB)
    pre_load = free_gib(total, world_size)
    return free_gib(total - weights_bytes, world_size) - pre_load * (1 - fraction) - reserved_mib / 1024


def _state_pool(inp: Inputs, rest_gib: float, slots: int, per_slot: int, spec: defaults.Speculative | None,
                mrr_arg: int | None) -> tuple[int, int]:
    """kv_cache_configurator.py KVCacheConfigurator._handle_max_mamba_cache: (max_mamba_cache_size, bytes
    of intermediate SSM state for draft tokens). Speculative decoding solves state and draft state jointly."""
    dp = inp.attn_dp
    d = spec.num_draft_tokens if spec is not None else 0
    reqs = max(1, (mrr_arg or 1) // dp)
    if inp.max_mamba_cache_size is not None:
        k = inp.max_mamba_cache_size // dp
        inter = per_slot * (min(reqs, k // slots) + 1) * d if d else 0
    elif inp.disable_radix_cache and inp.max_running_requests:
        k = max(1, inp.max_running_requests // dp)
        inter = per_slot * (k + 1) * d if d else 0
    else:
        r = inp.mamba_full_memory_ratio
        budget = rest_gib * r / (1 + r) * GIB
        if d:
            k = int((budget - per_slot * (1 + d)) // (per_slot * (1 + d / slots)))
            inter = per_slot * (min(reqs, k // slots) + 1) * d
        else:
            k = int((budget - per_slot) // per_slot)
            inter = 0
    return k, inter


def _pools(arch: Arch, inp: Inputs, res: Result, stages: list[PipelineStage], rest_gib: float, ctx: int, slots: int, per_slot: int,
           findings: list[Finding], spec: defaults.Speculative | None, mrr_arg: int | None) -> None:
    res.kv_budget_bytes_per_gpu = kv_avail = int(rest_gib * GIB)
    max_mamba: int | None = None
    if per_slot:
        max_mamba, inter = _state_pool(inp, rest_gib, slots, per_slot, spec, mrr_arg)
        if max_mamba < 1:
            findings.append(Finding("kv.state_pool", "fail", "SGLang refuses to start: the budget cannot hold one request's "
                                                            "linear-attention state",
                                    detail=f"{per_slot / MIB:.1f} MiB per slot"
                                           + (f", plus {spec.num_draft_tokens} draft-token states per request" if spec else ""),
                                    remedy="Raise the KV budget (TP, memory fraction), lower --speculative-num-draft-tokens, "
                                           "or use --mamba-ssm-dtype bfloat16."))
            return
        res.spec_state_bytes_per_gpu = int(inter)
        # the pool holds max_mamba + 1 slots (memory_pool.py:722-751); _handle_max_mamba_cache charges them at per_slot
        # and subtracts both in GiB, the budget truncated to bytes after (kv_cache_configurator.py:3405-3409)
        res.state_pool_bytes_per_gpu = (max_mamba + 1) * res.state_bytes_per_request_per_gpu
        kv_avail = int((rest_gib - inter / GIB - (max_mamba + 1) * per_slot / GIB) * GIB)
        res.max_state_slots = max_mamba
    res.kv_pool_bytes_per_gpu = kv_avail
    page = res.page_size
    tokens = min(int(kv_avail // st.cell_bytes) // page * page for st in stages if st.cell_bytes > 0) if any(
        st.cell_bytes for st in stages) else 0
    if inp.max_total_tokens:
        tokens = min(tokens, inp.max_total_tokens)
    res.max_total_num_tokens = tokens
    if res.draft_kv_bytes_per_token_per_gpu and not res.draft_kv_budget_bytes_per_token_per_gpu:
        res.draft_kv_pool_bytes_per_gpu = (tokens + page) * res.draft_kv_bytes_per_token_per_gpu   # one padding page
    if arch.hybrid_swa:
        res.swa_tokens = int(tokens * inp.swa_full_tokens_ratio) // page * page
    if tokens < 2:
        res.max_running_requests = 0
        return
    # kv_cache_configurator.py KVCacheConfigurator.resolve_max_num_reqs
    est = estimate_max_running(tokens, ctx)
    mrr = min(max(1, mrr_arg // inp.attn_dp), tokens // 2) if mrr_arg else min(est, tokens // 2)
    if max_mamba is not None and slots:
        mrr = min(mrr, max_mamba // slots)
    res.max_running_requests = mrr
    for c in inp.contexts:
        fit = held_at_context(tokens, page, c)
        if arch.hybrid_swa and arch.sliding_window:
            swa_need = math.ceil(min(c, arch.sliding_window + page) / page) * page
            fit = min(fit, (res.swa_tokens or 0) // swa_need)
        res.kv_limited_requests_at_context[str(c)] = fit * inp.attn_dp
        res.requests_at_context[str(c)] = min(fit, mrr) * inp.attn_dp


def _findings(arch: Arch, inp: Inputs, res: Result) -> list[Finding]:
    out = [Finding("kv.layout", "info", f"{res.kv_bytes_per_token_per_gpu:,} B of KV per token per GPU ({res.kv_dtype})",
                   detail=f"{res.layout}; {res.kv_layers} of {arch.num_layers} layers hold KV on this GPU"
                          + (f"; PP {inp.pp}: capacity is the minimum over stages" if inp.pp > 1 else "")
                          + (f"; attention DP {inp.attn_dp}: each DP rank has its own pool" if inp.attn_dp > 1 else ""))]
    for a in arch.assumptions:
        out.append(Finding("kv.assumption", "warn", "assumed, not read: " + a,
                           remedy="Check the figures against the server's logged max_total_num_tokens."))
    if res.max_total_num_tokens is None:
        return out
    tok = res.max_total_num_tokens
    ctx = res.context_len or 0
    # _pools() sets both before max_total_num_tokens
    assert res.kv_pool_bytes_per_gpu is not None and res.kv_budget_bytes_per_gpu is not None
    out.append(Finding("kv.capacity", "fail" if tok < ctx else "pass",
                       f"max_total_num_tokens ≈ {tok:,} per pool ({res.kv_pool_bytes_per_gpu / GIB:.1f} GiB of KV per GPU)",
                       detail=f"budget {res.kv_budget_bytes_per_gpu / GIB:.1f} GiB per GPU ({res.mem_fraction_source})"
                              + (f"; state pool {res.state_pool_bytes_per_gpu / GIB:.1f} GiB" if res.state_pool_bytes_per_gpu else ""),
                       remedy="Not even one request at the context length fits: lower "
                              "--context-length or free memory." if tok < ctx else ""))
    if res.draft_kv_pool_bytes_per_gpu is not None:
        reserve = f" ({res.reserved_bytes_per_gpu / GIB:.2f} GiB)" if res.reserved_bytes_per_gpu else ""
        out.append(Finding("kv.draft_pool", "info",
                           f"the MTP draft's own KV pool: {res.draft_kv_bytes_per_token_per_gpu:,} B/token × {tok:,} tokens = "
                           f"{res.draft_kv_pool_bytes_per_gpu / GIB:.2f} GiB per GPU, outside the KV budget",
                           detail="one full-attention layer with the target pool's token count, allocated after the target's "
                                  f"pools out of the memory mem_fraction_static leaves free{reserve}, beside the draft's weights "
                                  "and the CUDA graphs; it does not change max_total_num_tokens"))
    if res.max_state_slots is not None and res.state_slots_per_request:
        cap = res.max_state_slots // res.state_slots_per_request
        bound = [int(c) for c, n in res.kv_limited_requests_at_context.items() if n is not None and n > cap * inp.attn_dp]
        where = (f"at contexts up to {max(bound):,} tokens KV alone would hold more "
                 f"({res.kv_limited_requests_at_context[str(min(bound))]:,} at {min(bound):,}): there the state pool, "
                 "not KV, limits concurrency"
                 if bound else "KV is the tighter limit at every listed context")
        out.append(Finding("kv.state_limit", "warn" if bound else "info",
                           f"the linear-attention state pool caps concurrency at {cap} running requests per DP rank",
                           detail=f"{res.max_state_slots:,} state slots of {res.state_bytes_per_request_per_gpu / MIB:.1f} MiB "
                                  f"({res.state_pool_bytes_per_gpu / GIB:.1f} GiB), {res.state_slots_per_request} per "
                                  f"running request; {where}.",
                           remedy="For more concurrent requests: raise `--mamba-full-memory-ratio` (more state, fewer tokens) or "
                                  "`--max-mamba-cache-size`, or add GPUs." if bound else ""))
    return out


def sweep(arch: Arch, inp: Inputs, dtypes: tuple[str, ...] = ("bfloat16", "fp8_e4m3")) -> list[Result]:
    """The same inputs for several KV dtypes, for side-by-side tables."""
    return [compute(arch, inp.but(kv_dtype=d)) for d in dtypes]
