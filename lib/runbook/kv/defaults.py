"""SGLang 0.5.23's server-argument defaults that move the memory arithmetic.

Speculative decoding parameters and its running-request default, the CUDA-graph batch sizes and
the `mem_fraction_static` heuristic (with the multimodal scaling), page-size and KV-dtype
overrides. Each function names the SGLang file and function it follows; the differential test
(tests/test_kv_vs_sglang.py) checks the figures against SGLang's own resolution.
"""
from __future__ import annotations

from dataclasses import dataclass

from runbook.model import quant_capability
from runbook.model import sglang_names as names
from runbook.model.arch import Arch

# arg_groups/speculative_hook.py _auto_choose_speculative_params: (steps, topk, draft tokens).
_AUTO_SPEC = {"LlamaForCausalLM": (5, 4, 8), "Grok1ForCausalLM": (5, 4, 8), "Grok1VForCausalLM": (5, 4, 8)}
SPEC_RUNNING_REQUESTS = 48          # speculative_hook.py: every algorithm resets an unset --max-running-requests
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP")


@dataclass(frozen=True)
class Speculative:
    algorithm: str                  # resolved: NEXTN is EAGLE
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_kv_layers: int            # layers the draft adds to the target's pool (0: a draft pool not sized here)
    source: str

    @property
    def own_mtp(self) -> bool:
        """EAGLE/NEXTN (a --speculative-draft-model-path is not modelled): the draft is the checkpoint's own MTP layer."""
        return self.algorithm == "EAGLE"

    @property
    def words(self) -> str:
        return f"{self.algorithm} ({self.num_steps} steps, topk {self.eagle_topk}, {self.num_draft_tokens} draft tokens)"


def speculative(arch: Arch, algorithm: str | None, steps: int | None, topk: int | None,
                draft_tokens: int | None, draft_model: bool = False) -> Speculative | None:
    """speculative_hook.py _handle_eagle_family + _auto_choose_speculative_params; the draft KV layers
    follow model_runner_components/spec_aux_hidden_state.py (a path-less NEXTN/MTP draft is the
    checkpoint's own num_nextn_predict_layers)."""
    if not algorithm:
        return None
    alg = str(algorithm).upper()
    alg = "EAGLE" if alg == "NEXTN" else alg
    if steps is None:
        s, k, d = (3, 1, 4) if alg == "STANDALONE" else _AUTO_SPEC.get(arch.architecture, (3, 1, 4))
        src = "SGLang's automatic choice for " + arch.architecture
    else:
        s, k = steps, topk if topk is not None else 1
        d = draft_tokens if draft_tokens is not None else (s + 1 if k == 1 else s * k + 1)
        src = "given"
    # spec_aux_hidden_state.py: a path-less draft is sized off the target config's num_nextn_predict_layers
    # (Qwen3.5's mtp_num_hidden_layers is not that key: its draft adds nothing to the target pool)
    draft_layers = arch.nextn_layers if (alg in _EAGLE_FAMILY and not draft_model) else 0
    return Speculative(alg, s, k, d, draft_layers, src)


# kv_cache_configurator.py mm_runtime_reservation_gb: a VLM keeps SGLANG_VLM_CACHE_SIZE_MB (100) for its
# embedding cache out of the KV budget; Qwen3-VL on Hopper (model_overrides/qwen3_vl.py) drops that cache
# and moves features over CUDA IPC, reserving SGLANG_MM_FEATURE_CACHE_MB (1024) instead.
VLM_CACHE_MIB = 100
MM_FEATURE_CACHE_MIB = 1024


def multimodal_reservation_mib(arch: Arch, cc: str | None) -> int:
    if arch.architecture.startswith("Qwen3VL") and sm_major(cc) == 9:
        return MM_FEATURE_CACHE_MIB
    return VLM_CACHE_MIB


# ---- mem_fraction_static (arg_groups/memory_hook.py handle_gpu_memory_settings) --------------

def capacity_defaults(gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max_bs) by GPU size."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """arg_groups/cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


@dataclass
class MemFraction:
    value: float
    chunked_prefill_size: int
    decode_max_bs: int
    prefill_graph: bool
    reserved_mib: float
    vlm_factor: float
    words: str


def prefill_graph_enabled(arch: Arch, pp: int, attention_backend: str | None, disable_cuda_graph: bool,
                          disable_prefill_graph: bool) -> bool:
    """cuda_graph_config.default_prefill_backend (breakable on CUDA) and cuda_graph_hook.py's
    compatibility rules as memory_hook sees them: off under PP and for VLMs outside SGLang's allowlist
    (DeepSeek-V3 on trtllm_mla turns it off only after the memory fraction is set)."""
    if disable_cuda_graph or disable_prefill_graph or pp > 1:
        return False
    if arch.kda and arch.architecture != "Glm5NextForConditionalGeneration":
        return False    # cuda_graph_hook.py disable_breakable_cudagraph_if_incompatible: KDA hybrids stay off
    return not (arch.multimodal and not arch.multimodal_prefill_graph)


def vlm_factor(arch: Arch) -> float:
    """memory_hook.py adjust_mem_fraction_for_vlm: 0.95 × a factor from the vision tower's size
    (num_hidden_layers × hidden_size², 24 and 1024 when the config does not say)."""
    layers = arch.vit_layers or 24
    hidden = arch.vit_hidden or 1024
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def mem_fraction_static(arch: Arch, gpu_mem_gib: float, tp: int, pp: int, attn_dp: int = 1,
                        chunked_prefill_size: int | None = None, max_running_requests: int | None = None,
                        cuda_graph_max_bs: int | None = None, max_total_tokens: int | None = None,
                        attention_backend: str | None = None, disable_cuda_graph: bool = False,
                        disable_prefill_graph: bool = False, language_only: bool = False) -> MemFraction:
    """memory_hook.py handle_gpu_memory_settings + reserve_for_graph_mb (no post-capture sizing, no DeepEP)."""
    mib = gpu_mem_gib * 1024
    cps_default, bs_default = capacity_defaults(mib, tp)
    cps = chunked_prefill_size or cps_default
    bs = cuda_graph_max_bs or bs_default
    if cuda_graph_max_bs is None and max_running_requests is not None and bs > max_running_requests:
        # a smaller --max-running-requests caps the default decode graph (speculative decoding's 48 is set
        # later in the resolution and does not)
        bs = max_running_requests
    prefill = prefill_graph_enabled(arch, pp, attention_backend, disable_cuda_graph, disable_prefill_graph)
    graph: float = 0 if disable_cuda_graph else 2 * bs
    if attn_dp > 1:
        graph += bs * attn_dp * 3 + (bs * attn_dp * 1.5 if bs > 300 else 0)
    if prefill:
        if arch.mla:
            graph += 1536
        else:
            pmax = min(cps, max_total_tokens) if max_total_tokens else cps
            graph += 8 * len(prefill_capture_sizes(pmax))
    reserved = 512 + max(cps, 2048) * 1.5 + tp * pp / 8 * 1024 + graph
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    frac = round((mib - reserved) / mib, 3)
    factor = 1.0
    if arch.multimodal and arch.has_vision_config and not language_only:
        factor = vlm_factor(arch)
        frac = frac * factor
    words = (f"SGLang default for {gpu_mem_gib:g} GiB, TP {tp}, PP {pp}, chunked prefill {cps}, decode graph up to {bs}"
             f"{', prefill graph' if prefill else ''}: reserve {reserved:.0f} MiB → {round((mib - reserved) / mib, 3)}"
             + (f" × {factor:.4f} for the vision tower = {frac:.4f}" if factor != 1.0 else ""))
    return MemFraction(frac, cps, bs, prefill, reserved, factor, words)


# ---- attention backend and page size (arg_groups/model_override_base.py get_default_attn_backend,
# arg_groups/model_overrides/*, arg_groups/overrides.py _mla_backend_page_constraints) ------------

_QWEN_HYBRID = ("Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                "InternS2PreviewForConditionalGeneration", "InternS2MobiusForConditionalGeneration")
_TRTLLM_MLA_ON_SM100 = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")   # deepseek_v2.py, kimi overrides
_PER_MODEL = {"Gemma4": {10: "trtllm_mha"}, "GptOss": {10: "trtllm_mha", 9: "fa3"}, "Llama4": {10: "trtllm_mha", 9: "fa3"}}


_SM100_HYBRID = {"FalconH1ForCausalLM": "triton", "JetNemotronForCausalLM": "triton", "JetVLMForConditionalGeneration": "triton",
                 "Lfm2ForCausalLM": "flashinfer", "Lfm2MoeForCausalLM": "flashinfer", "GraniteMoeHybridForCausalLM": "flashinfer"}
_NO_TRITON = ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM")   # model_hook.py: the first layer may not be attention


def sm_major(cc: str | None) -> int | None:
    return int(str(cc).split(".")[0]) if cc else None


def override_backend(arch: Arch, cc: str | None, spec: Speculative | None = None) -> str | None:
    """The backend a model override sets before the KV hooks run (arg_groups/model_overrides/*); None: the
    generic default is chosen later, so the KV hooks see no backend."""
    major = sm_major(cc)
    if major is None:
        return None
    if arch.dsa:
        return "dsa"                                   # model_overrides/deepseek_v2.py
    if arch.mla:
        return "trtllm_mla" if major == 10 and arch.architecture in _TRTLLM_MLA_ON_SM100 else None
    for prefix, by_sm in _PER_MODEL.items():           # model_overrides/gemma4.py, gpt_oss.py, llama4.py
        if arch.architecture.startswith(prefix):
            return by_sm.get(major, "triton")
    if arch.architecture in names.MIMO_V2_ARCHS and major == 10:
        return "fa4"                                   # model_overrides/mimo_v2.py
    if major == 10 and arch.architecture in _SM100_HYBRID:
        return _SM100_HYBRID[arch.architecture]        # model_overrides/falcon_h1.py, lfm2.py, granitemoehybrid.py
    if arch.architecture in _QWEN_HYBRID and major == 10:
        # model_overrides/qwen3_5.py: triton, unless speculative decoding lets trtllm_mha run (page 64)
        return "trtllm_mha" if spec is not None and spec.eagle_topk <= 1 else "triton"
    return None


def attention_backend(arch: Arch, cc: str | None, given: str | None = None,
                      spec: Speculative | None = None) -> str | None:
    """The backend SGLang picks when --attention-backend is not given; None when the GPU is unknown."""
    if given:
        return given
    major = sm_major(cc)
    chosen = override_backend(arch, cc, spec)
    if major is None or chosen:
        return chosen
    if arch.mla:
        return {9: "fa3", 10: "flashinfer"}.get(major, "triton")
    topk_one = spec is None or spec.eagle_topk <= 1
    if major == 9 and topk_one:
        return "fa3"
    if major == 10 and topk_one:
        return "fa4" if arch.head_dim != arch.v_head_dim else "trtllm_mha"
    return "triton" if arch.attention_sinks else "flashinfer"      # FlashInfer has no attention sinks


def page_size(arch: Arch, backend: str | None, given: int | None, kv_dtype: str, cc: str | None) -> tuple[int, str]:
    """The page size SGLang runs with, and why, when the backend or the model forces one."""
    major = sm_major(cc)
    if given is None and arch.dsa:
        return 64, "DeepSeek DSA runs with page size 64 (model_overrides/deepseek_v2.py)"
    page = given or 1
    decode = backend
    if kv_dtype == "nvfp4" and major in (10, 12):
        decode = "trtllm_mha"   # arg_groups/kv_cache_hook.py: NVFP4 KV decodes on trtllm_mha, MLA too
    if backend == "flashmla":
        return 64, "FlashMLA only supports page size 64"
    if backend in ("trtllm_mla", "cutedsl_mla") and page not in (32, 64):
        return 64, f"{backend} only supports page size 32 or 64"
    if (backend == "trtllm_mha" or decode == "trtllm_mha") and page not in (16, 32, 64, 128):
        return 64, "trtllm_mha only supports page size 16, 32, 64 or 128"
    if backend == "fa4" and not arch.mla and major == 10:
        return 128, "FA4 only supports page size 128 for non-MLA models"
    return page, ""


def nvfp4_prefill(explicit: str | None, cc: str | None) -> str:
    """arg_groups/kv_cache_hook.py handle_nvfp4_prefill_kv_dequant_dtype: the NVFP4 prefill backend (decode is
    always trtllm_mha): FlashInfer over an FP8 workspace when flashinfer is given or, none given, below SM100;
    else trtllm_mha reading NVFP4 natively."""
    return "flashinfer" if explicit == "flashinfer" or (explicit is None and sm_major(cc) != 10) else "trtllm_mha"


def fp4_recipe(kv_dtype: str, explicit: str | None, cc: str | None) -> tuple[int, int]:
    """(scale layouts, dequant-workspace bytes per element) of an FP4 KV recipe, as compute_cell_size sizes it
    for the accesses the resolved (prefill, decode) backends select (fp4_kv_cache_quant_method.py).
    fp4_mx_block16: plain reads on every backend, one scale layout, no workspace. nvfp4: token-linear scales
    serve FlashInfer's FP8 workspace and SM120's native reads, SM100's native reads keep their own layout
    (both when FlashInfer prefills on SM100). `explicit`: the backend given or set by a model override."""
    if kv_dtype != "nvfp4":
        return 1, 0
    sm100 = sm_major(cc) == 10
    workspace = nvfp4_prefill(explicit, cc) == "flashinfer"
    return int(workspace or not sm100) + int(sm100), 1 if workspace else 0


_BACKENDS_ALLOWED = {"Gemma4": ("trtllm_mha", "triton", "fa4", "ascend", "intel_xpu", "intel_amx", "aiter"),
                     "GptOss": ("triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu", "aiter"),
                     "Llama4": ("fa3", "aiter", "triton", "ascend", "trtllm_mha", "intel_xpu")}
_NVFP4_PREFILL = ("flashinfer", "trtllm_mha")


def refusals(arch: Arch, kv_dtype: str, backend: str | None, cc: str | None,
             explicit: str | None = None, quantization: str | None = None) -> list[tuple[str, str, str]]:
    """Start-up refusals SGLang raises for this model, KV dtype, backend, GPU and quantization method: (condition,
    where, fix). `backend`: the one it runs; `explicit`: the one given or set by a model override (what the KV hooks
    see); `quantization`: the method SGLang builds for the weights."""
    out = []
    below = quant_capability.refusal(quantization, cc)
    if below is not None:
        out.append((below[0], "model_loader/loader.py _get_quantization_config (get_min_capability)", below[1]))
    if arch.dsa and kv_dtype not in ("bfloat16", "fp8_e4m3"):
        out.append((f"DeepSeek DSA supports only bf16 or fp8_e4m3 KV, not {kv_dtype}",
                    "arg_groups/model_overrides/deepseek_v2.py", "Use --kv-cache-dtype fp8_e4m3 or bf16."))
    out += fp4_refusals(arch, kv_dtype, backend, cc, explicit)
    if kv_dtype in ("mxfp8", "nvfp4", "fp4_mx_block16") and backend == "trtllm_mla" and not arch.dsa:
        out.append((f"the TensorRT-LLM MLA backend supports only fp8_e4m3, bf16 or auto KV, not {kv_dtype}",
                    "layers/attention/trtllm_mla_backend.py", "Use --kv-cache-dtype fp8_e4m3."))
    if arch.architecture in _NO_TRITON and backend == "triton":
        out.append((f"{arch.architecture} does not run on the triton attention backend (its first layer may not be "
                    "attention)", "arg_groups/model_hook.py", "Use --attention-backend flashinfer."))
    for prefix, allowed in _BACKENDS_ALLOWED.items():
        if arch.architecture.startswith(prefix) and backend is not None and backend not in allowed:
            out.append((f"{arch.architecture} does not run on the {backend} attention backend (allowed: {', '.join(allowed)})",
                        f"arg_groups/model_overrides/{prefix.lower()}", f"Use --attention-backend {allowed[0]}."))
    return out


def tp_refusal(arch: Arch, a_tp: int) -> tuple[str, str, str] | None:
    """layers/linear.py QKVParallelLinear (and the models' own asserts, e.g. llama.py, deepseek_v2.py): attention
    TP must divide the attention heads, and divide the KV heads or be a multiple of them; else SGLang's
    `divide` asserts "<n> is not divisible by <tp>" while loading the model."""
    kv = None if arch.mla else arch.num_kv_heads

    def ok(t: int) -> bool:
        return arch.num_attention_heads % t == 0 and (kv is None or (kv % t == 0 if t < kv else t % kv == 0))

    if ok(a_tp):
        return None
    valid = [t for t in range(1, min(arch.num_attention_heads, 256) + 1) if ok(t)]
    heads = f"{arch.num_attention_heads} attention heads" + (f" and {kv} KV heads" if kv is not None else "")
    if arch.num_attention_heads % a_tp or kv is None:
        said = f"{arch.num_attention_heads} is not divisible by {a_tp}"
    else:   # more GPUs than KV heads: each head is replicated tp / kv times
        said = f"{a_tp} is not divisible by {kv}" if a_tp >= kv else f"{kv} is not divisible by {a_tp}"
    sizes = ", ".join(map(str, valid))
    return (f"attention TP {a_tp} does not fit {heads} (\"{said}\"); valid: {sizes}",
            "layers/linear.py QKVParallelLinear asserts while loading the model",
            f"Use an attention TP (--tp / --attn-dp) of {sizes}.")


_KV4_MLA = ("flashinfer", "trtllm_mla")
_KV4_MHA = ("triton", "torch_native", "flex_attention", "trtllm_mha")


def fp4_refusals(arch: Arch, kv_dtype: str, backend: str | None, cc: str | None,
                 explicit: str | None) -> list[tuple[str, str, str]]:
    """arg_groups/kv_cache_hook.py: handle_nvfp4_prefill_kv_dequant_dtype, then handle_kv4_compatibility (one
    backend for prefill and decode must be one FP4 KV reads on; NVFP4's FlashInfer-prefill/trtllm_mha-decode
    pair is the supported mixed recipe, MLA included)."""
    major = sm_major(cc)
    if kv_dtype not in ("nvfp4", "fp4_mx_block16") or major is None or arch.dsa:
        return []
    where = "arg_groups/kv_cache_hook.py"
    if kv_dtype == "nvfp4":
        if major not in (10, 12):
            return [(f"--kv-cache-dtype nvfp4 needs Blackwell SM100 or SM120 (this GPU is SM {cc})", where,
                     "Use fp8_e4m3 (or fp4_mx_block16 for the block-16 FP4 recipe).")]
        if explicit is not None and explicit not in _NVFP4_PREFILL:
            return [(f"NVFP4 prefill needs an FP8 workspace or native NVFP4, and the {explicit} backend provides neither",
                     where, "Use --attention-backend flashinfer or trtllm_mha, or another KV dtype.")]
        if explicit == "trtllm_mha" and major != 10:
            return [(f"native NVFP4 prefill (--attention-backend trtllm_mha) needs SM100 (this GPU is SM {cc})", where,
                     "Use --attention-backend flashinfer (FP8 prefill workspace), or leave the backend unset.")]
        if arch.mla and nvfp4_prefill(explicit, cc) == "trtllm_mha":
            return [("NVFP4 on MLA prefills and decodes on trtllm_mha here, and FP4 KV on MLA needs flashinfer or "
                     "trtllm_mla", where, "Use --attention-backend flashinfer (FP8 prefill workspace, trtllm_mha decode).")]
        return []
    allowed = _KV4_MLA if arch.mla else _KV4_MHA
    if backend == "fa4":   # FA4 prefills; it cannot also decode FP4 KV
        return [("FP4 KV with FA4 prefill needs another decode backend, and fa4 decodes here too", where,
                 f"Use --attention-backend {allowed[0]}.")]
    if backend is not None and backend not in allowed:
        return [(f"FP4 KV on {'MLA' if arch.mla else 'MHA'} needs the attention backend to be one of "
                 f"{', '.join(allowed)}, not {backend}", where, f"Use --attention-backend {allowed[0]}.")]
    return []


def dsa_raw_layout(arch: Arch, cc: str | None) -> bool:
    """arg_groups/overrides.py _dsa_split_backend_resolution: FP8 DSA runs the trtllm kernels (raw MLA rows)
    from SM100, flashmla_kv (scaled rows) on Hopper, and flashinfer_sparse_mla (scaled) for GLM on SM120."""
    major = sm_major(cc) or 0
    return arch.dsa and major >= 10 and not (arch.architecture == "GlmMoeDsaForCausalLM" and major == 12)
