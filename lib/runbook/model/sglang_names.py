"""Names SGLang 0.5.23 uses, as data: architectures it treats specially (configs/model_config.py) and the
KV-cache dtypes (--kv-cache-dtype, and the torch dtypes its logs print).

In one place so tests/test_kv_vs_sglang.py can check each against SGLang's own lists.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVDtype:
    """One KV-cache element format. `torch`: the dtype the pool is created with, as its "KV Cache is allocated.
    dtype: torch.X" line prints it (mem_cache/kv_cache_dtype.py configure_kv_cache_dtype); `bits`: bits per
    stored element, scales not counted; `block`: elements per scale for block-scaled formats (None: per tensor)."""

    name: str
    flags: tuple[str, ...]
    torch: str
    bits: int
    block: int | None = None

    @property
    def bytes(self) -> float:
        return self.bits / 8


# The runbook's names are the canonical ones; the order is the one a log's torch dtype resolves in (the first
# entry with that torch dtype: mxfp8 logs as float8_e4m3fn, fp4_mx_block16 as float4_e2m1fn_x2).
KV_DTYPES: dict[str, KVDtype] = {d.name: d for d in (
    KVDtype("bfloat16", ("bf16", "bfloat16"), "bfloat16", 16),
    KVDtype("fp8_e4m3", ("fp8_e4m3",), "float8_e4m3fn", 8),
    KVDtype("fp8_e5m2", ("fp8_e5m2",), "float8_e5m2", 8),
    KVDtype("mxfp8", ("mxfp8",), "float8_e4m3fn", 8, block=32),             # plus one E8M0 scale byte per 32
    KVDtype("nvfp4", ("nvfp4",), "float4_e2m1fn_x2", 4, block=16),          # two elements per stored byte
    KVDtype("fp4_mx_block16", ("fp4_mx_block16",), "float4_e2m1fn_x2", 4, block=16),
)}
# `auto` keeps the model's dtype: a float16 or float32 model's KV cache is that dtype (not a flag choice).
MODEL_KV_DTYPES: dict[str, KVDtype] = {d.name: d for d in (
    KVDtype("float16", (), "float16", 16),
    KVDtype("float32", (), "float32", 32),
)}
# server_args' --kv-cache-dtype choices, in SGLang's order (tests/test_kv_vs_sglang.py diffs them)
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
FP8_KV = tuple(n for n, d in KV_DTYPES.items() if d.bits == 8 and d.block is None)   # per-tensor scaled FP8
FP4_KV = tuple(n for n, d in KV_DTYPES.items() if d.bits == 4)

# Other spellings: ROCm's fnuz FP8 (fp8_dtype on HIP) and the short names people write for the model dtypes.
_SPELLINGS = {"float8_e4m3fnuz": "fp8_e4m3", "float8_e5m2fnuz": "fp8_e5m2", "fp16": "float16", "half": "float16",
              "float": "float32", "fp32": "float32"}


def kv_dtype(name: object) -> KVDtype | None:
    """The format a --kv-cache-dtype value, a canonical name or a logged torch dtype ('torch.float8_e4m3fn')
    names; None for `auto`, empty or unknown."""
    s = str(name or "").strip().strip(",").lower().removeprefix("torch.")
    s = _SPELLINGS.get(s, s)
    table = {**KV_DTYPES, **MODEL_KV_DTYPES}
    if s in table:
        return table[s]
    for d in table.values():   # a flag spelling, then a torch dtype: in the table's order
        if s in d.flags:
            return d
    return next((d for d in table.values() if d.torch == s), None)


def kv_dtype_name(name: object) -> str | None:
    """The canonical name ('bf16' -> 'bfloat16', 'torch.float4_e2m1fn_x2' -> 'nvfp4'); None when unknown or auto."""
    d = kv_dtype(name)
    return d.name if d else None


def same_kv_storage(a: object, b: object) -> bool:
    """Whether two names store the KV cache in the same torch dtype: a log cannot tell mxfp8 from fp8_e4m3,
    nor nvfp4 from fp4_mx_block16."""
    da, db = kv_dtype(a), kv_dtype(b)
    return da is not None and db is not None and da.torch == db.torch

# multimodal_model_archs: served as VLMs, so mem_fraction_static is scaled down
MULTIMODAL_ARCHS = frozenset({
    "BailingMM2NativeForConditionalGeneration",
    "BailingMMNativeForConditionalGeneration",
    "BailingMoeV3VLForConditionalGeneration",
    "CLIPModel",
    "Cohere2VisionForConditionalGeneration",
    "Cosmos3EdgeForConditionalGeneration",
    "DeepseekOCRForCausalLM",
    "DeepseekVL2ForCausalLM",
    "DiffusionGemmaForBlockDiffusion",
    "Dots3NoteForCausalLM",
    "DotsOCRForCausalLM",
    "DotsVLMForCausalLM",
    "EmbeddingGemma2Model",
    "Ernie4_5_VLMoeForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "Gemma3nForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
    "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration",
    "Glm5NextForConditionalGeneration",
    "GlmAsrForConditionalGeneration",
    "GlmImageForConditionalGeneration",
    "GlmOcrForConditionalGeneration",
    "Grok1AForCausalLM",
    "Grok1VForCausalLM",
    "InternS1ForConditionalGeneration",
    "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "InternVLChatModel",
    "JetVLMForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
    "KimiVLForConditionalGeneration",
    "Lfm2VlForConditionalGeneration",
    "LightOnOCRForConditionalGeneration",
    "Llama4ForConditionalGeneration",
    "LlavaForConditionalGeneration",
    "LlavaLlamaForCausalLM",
    "LlavaMistralForCausalLM",
    "LlavaQwenForCausalLM",
    "LlavaVidForCausalLM",
    "LocateAnythingForConditionalGeneration",
    "MiDashengLMModel",
    "MiMoV2ASRForCausalLM",
    "MiMoV2ForCausalLM",
    "MiniCPMO",
    "MiniCPMV",
    "MiniMaxM3SparseForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
    "MllamaForConditionalGeneration",
    "MossVLForConditionalGeneration",
    "MultiModalityCausalLM",
    "MuseGlimmerForConditionalGeneration",
    "MuseSparkForConditionalGeneration",
    "NVILAForConditionalGeneration",
    "NVILALiteForConditionalGeneration",
    "NemotronH_Nano_Omni_Reasoning_V3",
    "NemotronH_Nano_VL_V2",
    "NemotronH_Omni_Reasoning_V3",
    "POINTSV15ChatModel",
    "PaddleOCRVLForConditionalGeneration",
    "Phi4MMForCausalLM",
    "PixtralForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ASRForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration",
    "Sarashina2VisionForCausalLM",
    "Step3VLForConditionalGeneration",
    "Step3p7ForConditionalGeneration",
    "StepVLForConditionalGeneration",
    "UnlimitedOCRForCausalLM",
    "VoxtralForConditionalGeneration",
    "WhisperForConditionalGeneration",
})

# multimodal_breakable_cuda_graph_supported_model_archs: VLMs that keep the prefill CUDA graph
MULTIMODAL_BREAKABLE_GRAPH_ARCHS = frozenset({
    "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration",
    "MuseSparkForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration",
})

# ModelConfig's MLA judge is by architecture name, not by kv_lora_rank (PixtralForConditionalGeneration only with a kv_lora_rank)
MLA_ARCHS = frozenset({
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "DotsVLMForCausalLM",
    "Eagle3DeepseekV2ForCausalLM",
    "GigaChat35ForCausalLM",
    "GigaChat35ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM",
    "Glm4MoeLiteForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "KimiK25ForConditionalGeneration",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "MistralLarge3ForCausalLMEagle",
    "PixtralForConditionalGeneration",
    # the later MLA branches of ModelConfig._derive_model_shapes (Kimi-Linear / K3 / VL, Bailing V2.5 / V3, ...)
    "BailingMoeForCausalLMNextN", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration",
    "DeepseekVL2ForCausalLM", "KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM", "KimiLinearForCausalLM",
    "KimiVLForConditionalGeneration", "MiniCPM3ForCausalLM", "SarvamMLAForCausalLM",
})

# is_hybrid_swa_model: sliding layers get their own, smaller pool
HYBRID_SWA_ARCHS = frozenset({
    "BeamForCausalLM",
    "DeepseekV4ForCausalLM",
    "DeepseekV4ForCausalLMDSpark",
    "DeepseekV4ForCausalLMNextN",
    "DiffusionGemmaForBlockDiffusion",
    "EmbeddingGemma2Model",
    "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
    "GptOssForCausalLM",
    "GraniteMoeSWAForCausalLM",
    "GraniteSWAForCausalLM",
    "IQuestQ1ForCausalLM",
    "IQuestQ1MTP",
    "InklingForConditionalGeneration",
    "InklingForConditionalGenerationMTP",
    "LagunaForCausalLM",
    "Llama4ForConditionalGeneration",
    "MellumForCausalLM",
    "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM",
    "MiMoV2MTP",
    "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration",
    "Step3p5ForCausalLM",
    "Step3p5MTP",
    "Step3p7ForConditionalGeneration",
    "UnlimitedOCRForCausalLM",
})

# SWA_SINK_ARCHS: layer split read from layer_types
SWA_SINK_ARCHS = frozenset({
    "GptOssForCausalLM",
    "GraniteMoeSWAForCausalLM",
    "GraniteSWAForCausalLM",
    "IQuestQ1ForCausalLM",
    "IQuestQ1MTP",
})

# configs/hybrid_arch.py mambaish_config (and the linear-attention registry): model types whose config
# class gives SGLang a per-request recurrent-state pool (model/mamba2.py and arch.py size some of them)
STATE_POOL_MODEL_TYPES = frozenset({
    "bailing_hybrid", "falcon_h1", "falcon_mamba", "gigachat3_5", "glm5_next", "granitemoehybrid", "inkling_mm_model",
    "inkling_model", "intern_s2_preview", "jet_nemotron", "jet_vlm", "kimi_linear", "lfm2", "lfm2_moe", "lfm2_vl",
    "mamba", "mamba2", "minicpm_sala", "NemotronH_Nano_VL_V2", "nemotron_h", "qwen3_5", "qwen3_5_moe", "qwen3_next",
    "zaya",
})

# arg_groups/overrides.py _MAMBA_EXTRA_BUFFER_ARCHS: hybrid models whose radix cache keeps extra tracking slots
MAMBA_EXTRA_BUFFER_ARCHS = frozenset({
    "KimiLinearForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM", "Qwen4ExpForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration", "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
    "Glm5NextForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronH_Omni_Reasoning_V3",
    "KimiK3ForConditionalGeneration", "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP",
})

# MIMO_V2_MODEL_ARCHS: layer split read from hybrid_layer_pattern (1 = sliding)
MIMO_V2_ARCHS = frozenset({
    "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM",
})

# is_deepseek_dsa: these archs with an index_topk carry the DSA indexer cache
DSA_ARCHS = frozenset({
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
})

# ModelConfig.__init__ mm_disabled_models: multimodal stays off unless --enable-multimodal
MULTIMODAL_OFF_BY_DEFAULT_ARCHS = frozenset({
    "Gemma3ForConditionalGeneration",
    "InklingForConditionalGeneration",
    "Llama4ForConditionalGeneration",
    "Step3VLForConditionalGeneration",
})
