"""Architecture facts from config.json, read the way SGLang 0.5.23 reads them.

Which layers hold per-token KV (full attention, sliding window) and which hold a per-request
recurrent state (linear attention), KV heads, head dims, MLA latent sizes. Anything assumed
rather than read is listed in `assumptions`, so callers can turn it into a warn finding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runbook.core.errors import InputError
from runbook.core.numeric import is_int, is_number
from runbook.model import mamba2
from runbook.model import sglang_names as names

# Gemma-2/3 force disable_hybrid_swa_memory: every layer keeps full-length KV.
_NO_SWA_SAVING = ("Gemma2", "Gemma3")
# utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS: the first one present wins.
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
# When config.json has none of them, transformers' config class default applies (SGLang reads the
# loaded class, not the file). model_type -> max_position_embeddings default of transformers 5.19.
HF_CONTEXT_DEFAULTS = {"gemma3_text": 131072, "gemma2": 8192, "llama": 2048, "mistral": 131072,
                       "qwen2": 32768, "qwen3": 32768, "qwen3_moe": 32768, "deepseek_v3": 4096, "gpt_oss": 131072}
# model_types SGLang reads with its own config class (utils/hf_transformers _CONFIG_REGISTRY), whose default wins
SGLANG_CONTEXT_DEFAULTS = {"kimi_linear": 4096}        # configs/kimi_linear.py KimiLinearConfig
# Architectures whose SWA split SGLang does not size the way arch.py can (compressed SWA pools,
# per-layer head dims): figures for them carry a warn finding.
_SWA_NOT_MODELLED = ("Step3p", "Inkling", "DeepseekV4", "EmbeddingGemma2", "DiffusionGemma", "MuseGlimmer")
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16",
           "float32": "float32", "fp32": "float32", "float": "float32"}


@dataclass(frozen=True)
class LinearAttention:
    """A Mamba2-shaped recurrent state per request (configs/mamba_utils.py Mamba2StateShape.create): Gated-DeltaNet
    linear attention (Qwen3-Next / Qwen3.5: key heads = groups, key head dim = state size) and Mamba-2 mixers
    (Nemotron-H, Falcon-H1, Granite-4.0-H; LFM2's short convolutions with no SSM state)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str = "float32"
    conv_dtype: str = "bfloat16"
    intermediate_size: int | None = None   # the conv's value width; None: num_value_heads × value_head_dim


@dataclass
class Arch:
    architecture: str
    model_type: str
    num_layers: int
    full_layer_ids: list[int]
    swa_layer_ids: list[int]
    linear_layer_ids: list[int]
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: str
    max_context: int | None
    mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    hybrid_swa: bool = False          # SGLang sizes SWA layers with their own, smaller pool
    swa_num_kv_heads: int | None = None   # sliding layers' own KV heads / head dims (Gemma-4, MiMo), else the full ones
    swa_head_dim: int | None = None
    swa_v_head_dim: int | None = None
    linear: LinearAttention | None = None
    mtp_layers: int = 0               # MTP/NextN layers shipped with the checkpoint (either config key)
    nextn_layers: int = 0             # num_nextn_predict_layers: the draft layers SGLang adds to the target pool
    multimodal: bool = False          # SGLang serves it as a VLM (model_config.is_multimodal)
    multimodal_prefill_graph: bool = False   # a VLM allowed to keep the breakable prefill CUDA graph
    has_vision_config: bool = False   # SGLang scales mem_fraction_static only when there is one
    vit_layers: int | None = None
    vit_hidden: int | None = None
    kda: bool = False                 # Kimi Delta Attention layers (model_config.uses_kda_attention)
    attention_sinks: bool = False     # learned attention sinks (model_config._detect_attention_sinks): no FlashInfer default
    dsa: bool = False                 # DeepSeek sparse attention: an FP8 indexer cache per layer too
    index_head_dim: int = 0
    context_source: str = ""
    assumptions: list[str] = field(default_factory=list)

    @property
    def kv_layer_ids(self) -> list[int]:
        """Layers holding per-token KV: full attention plus sliding window."""
        return sorted(self.full_layer_ids + self.swa_layer_ids)

    @property
    def family(self) -> str:
        if self.mla:
            return "MLA"
        if self.linear is not None:
            return "hybrid linear attention"
        if self.hybrid_swa:
            return "hybrid sliding window"
        return "MHA" if self.num_kv_heads == self.num_attention_heads else "GQA"


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: nested text_config for multimodal wrappers, else the top level."""
    tc = config.get("text_config")
    if isinstance(tc, dict) and tc.get("num_hidden_layers"):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(tc)
        return merged
    return config


def _int(cfg: dict[str, Any], key: str, source: str) -> int:
    v = cfg.get(key)
    if not is_int(v) or v <= 0:
        raise InputError(f"{source}: '{key}' must be a positive integer (got {v!r})")
    return v


def model_dtype(cfg: dict[str, Any], assumptions: list[str] | None = None) -> str:
    raw = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(raw, str) and raw.lower().removeprefix("torch.") in _DTYPES:
        d = _DTYPES[raw.lower().removeprefix("torch.")]
        # SGLang serves float32 checkpoints in half precision unless --dtype says otherwise.
        return "bfloat16" if d == "float32" else d
    if assumptions is not None:
        assumptions.append("no torch_dtype/dtype in config.json: assumed bfloat16")
    return "bfloat16"


def from_config(config: dict[str, Any], source: str = "config.json") -> Arch:
    """Parse a config.json dict; raises InputError naming the missing field."""
    top = config
    cfg = text_config(config)
    archs = top.get("architectures") or cfg.get("architectures") or []
    arch_name = archs[0] if archs else "?"
    model_type = str(cfg.get("model_type") or top.get("model_type") or "")
    nested = cfg is not top
    cfg = {**mamba2.CLASS_DEFAULTS.get(model_type, {}), **cfg}
    assumptions: list[str] = []
    n = _int(cfg, "num_hidden_layers", source)
    n_heads, kv_heads, head_dim = _heads(cfg, source, assumptions)
    # model_config.py _derive_model_shapes: the config's v_head_dim when set (MiMo-V2: 192 / 128), else head_dim
    v = cfg.get("v_head_dim")
    v_head_dim = v if is_int(v) and v > 0 and not arch_name.startswith("DeepseekV4") \
        else head_dim
    mla, kv_lora, rope = _mla(cfg, arch_name, bool(archs), source, assumptions)
    nextn = _nonneg(cfg.get("num_nextn_predict_layers") or 0, "num_nextn_predict_layers", source)
    mtp = nextn or _nonneg(cfg.get("mtp_num_hidden_layers") or 0, "mtp_num_hidden_layers", source)
    dsa = arch_name in names.DSA_ARCHS and cfg.get("index_topk") is not None and mla
    index_head_dim = _int(cfg, "index_head_dim", source) if dsa else 0

    full, swa, linear_ids, linear = _layer_kinds(cfg, n, source, assumptions, model_type)
    full, swa = _layers_by_architecture(cfg, arch_name, n, full, swa)
    window = cfg.get("sliding_window") if isinstance(cfg.get("sliding_window"), int) else None
    full, swa, hybrid_swa = _hybrid_swa(cfg, arch_name, full, swa, assumptions)
    if not archs:
        assumptions.append(f"no 'architectures' in {source}: standard attention formula assumed")
    max_context, context_source = _context_len(cfg, model_type, source, assumptions)
    kv_heads, head_dim, v_head_dim, swa_heads, swa_hd, swa_vhd = _swa_shape(cfg, arch_name, hybrid_swa, kv_heads, head_dim,
                                                                            v_head_dim, source)
    vision = top.get("vision_config")
    # ModelConfig: a multimodal architecture (or a nested text_config), unless SGLang keeps it text-only by default
    multimodal = (arch_name in names.MULTIMODAL_ARCHS or nested) and arch_name not in names.MULTIMODAL_OFF_BY_DEFAULT_ARCHS

    return Arch(
        architecture=arch_name, model_type=model_type, num_layers=n, full_layer_ids=full, swa_layer_ids=swa,
        linear_layer_ids=linear_ids, num_attention_heads=n_heads, num_kv_heads=int(kv_heads), head_dim=int(head_dim),
        v_head_dim=int(v_head_dim), dtype=model_dtype(cfg, assumptions),
        max_context=max_context, context_source=context_source,
        mla=mla, kv_lora_rank=kv_lora, qk_rope_head_dim=rope, sliding_window=window, hybrid_swa=hybrid_swa,
        swa_num_kv_heads=swa_heads, swa_head_dim=swa_hd, swa_v_head_dim=swa_vhd,
        linear=linear, mtp_layers=mtp, nextn_layers=nextn, multimodal=multimodal,
        multimodal_prefill_graph=arch_name in names.MULTIMODAL_BREAKABLE_GRAPH_ARCHS,
        has_vision_config=isinstance(vision, dict),
        vit_layers=_opt_int(vision, ("num_hidden_layers", "vt_num_hidden_layers")) if isinstance(vision, dict) else None,
        vit_hidden=_opt_int(vision, ("hidden_size", "vt_hidden_size")) if isinstance(vision, dict) else None,
        kda=isinstance(cfg.get("linear_attn_config"), dict) and bool(cfg["linear_attn_config"].get("kda_layers")),
        attention_sinks=_attention_sinks(cfg, arch_name), dsa=dsa, index_head_dim=index_head_dim, assumptions=assumptions)


def _attention_sinks(cfg: dict[str, Any], arch_name: str) -> bool:
    """configs/model_config.py _detect_attention_sinks: SWA_SINK_ARCHS always; MiMo-V2 when its config adds the
    sink biases; else the config's learnable_sink."""
    if arch_name in names.SWA_SINK_ARCHS:
        return True
    if arch_name in names.MIMO_V2_ARCHS:
        return bool(cfg.get("add_swa_attention_sink_bias") or cfg.get("add_full_attention_sink_bias"))
    return bool(cfg.get("learnable_sink"))


def _heads(cfg: dict[str, Any], source: str, assumptions: list[str]) -> tuple[int, int, int]:
    """Attention heads, KV heads (MHA when the config names none) and the head dim."""
    n_heads = _int(cfg, "num_attention_heads", source)
    kv_heads = next((cfg[k] for k in _KV_HEAD_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0), None)
    if kv_heads is None:
        kv_heads = n_heads
        assumptions.append(f"no KV head count in {source}: assumed MHA with {n_heads} KV heads")
    head_dim = cfg.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0:
        hidden = _int(cfg, "hidden_size", source)
        head_dim = hidden // n_heads
        if head_dim == 0:
            # SGLang's ModelConfig derives the same 0 and builds zero-width attention
            raise InputError(f"{source}: 'hidden_size' {hidden} is smaller than 'num_attention_heads' {n_heads}, so the "
                             "derived head_dim is 0; set 'head_dim' or fix those fields")
    return n_heads, kv_heads, head_dim


def _mla(cfg: dict[str, Any], arch_name: str, named: bool, source: str, assumptions: list[str]) -> tuple[bool, int, int]:
    """(MLA?, kv_lora_rank, qk_rope_head_dim): SGLang's MLA judge is by architecture name
    (model_config.py, ModelConfig._derive_model_shapes), not by the presence of kv_lora_rank alone."""
    has_latent = isinstance(cfg.get("kv_lora_rank"), int) and cfg["kv_lora_rank"] > 0
    mla = has_latent and (arch_name in names.MLA_ARCHS or not named)
    if has_latent and not mla:
        assumptions.append(f"{arch_name} has kv_lora_rank but is not one of SGLang's MLA architectures: sized as MHA, "
                           "the way SGLang would")
    if not mla:
        return False, 0, 0
    return True, cfg["kv_lora_rank"], _int(cfg, "qk_rope_head_dim", source)


def _layer_kinds(cfg: dict[str, Any], n: int, source: str, assumptions: list[str],
                 model_type: str = "") -> tuple[list[int], list[int], list[int], LinearAttention | None]:
    """Full, sliding-window and linear-attention layer ids from the config's layout fields (all full when it has none)."""
    mamba = mamba2.layers(cfg, model_type, n, source)
    if mamba is not None:
        return mamba[0], [], mamba[1], LinearAttention(**mamba[2])
    if model_type in names.STATE_POOL_MODEL_TYPES and "linear_num_value_heads" not in cfg:
        assumptions.append(f"SGLang keeps a per-request recurrent-state pool for {model_type} models that is not sized "
                           "here: tokens and running requests are too high")
    full, swa, linear_ids = list(range(n)), [], []
    linear: LinearAttention | None = None
    layer_types = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and "linear_num_value_heads" in cfg:
        # Qwen3-Next / Qwen3.5: SGLang derives the split from the interval, not from layer_types.
        full = [i for i in range(n) if (i + 1) % interval == 0]
        linear_ids = [i for i in range(n) if (i + 1) % interval != 0]
        linear = LinearAttention(
            num_key_heads=_int(cfg, "linear_num_key_heads", source), num_value_heads=_int(cfg, "linear_num_value_heads", source),
            key_head_dim=_int(cfg, "linear_key_head_dim", source), value_head_dim=_int(cfg, "linear_value_head_dim", source),
            conv_kernel=_int(cfg, "linear_conv_kernel_dim", source),
            ssm_dtype=_DTYPES.get(str(cfg.get("mamba_ssm_dtype", "float32")).lower(), "float32"))
    elif isinstance(layer_types, list) and len(layer_types) >= n:
        kinds = [str(t) for t in layer_types[:n]]
        full = [i for i, t in enumerate(kinds) if t in ("full_attention", "attention", "global")]
        swa = [i for i, t in enumerate(kinds) if t in ("sliding_attention", "sliding_window", "local")]
        linear_ids = [i for i, t in enumerate(kinds) if t in ("linear_attention", "mamba", "conv")]
        unknown = sorted(set(kinds) - {"full_attention", "attention", "global", "sliding_attention", "sliding_window",
                                       "local", "linear_attention", "mamba", "conv"})
        if unknown:
            full += [i for i, t in enumerate(kinds) if t in unknown]
            full.sort()
            assumptions.append(f"layer types {unknown} not recognised: counted as full attention")
        if linear_ids:
            assumptions.append("linear-attention layers found without Qwen3-Next fields: their recurrent state is not sized")
    return full, swa, linear_ids, linear


def _layers_by_architecture(cfg: dict[str, Any], arch_name: str, n: int, full: list[int],
                            swa: list[int]) -> tuple[list[int], list[int]]:
    """Architectures whose full/sliding split SGLang fixes itself, whatever the config's layer fields say."""
    if arch_name.startswith("Llama4"):
        # model_config.get_hybrid_layer_ids: every 4th layer is full attention, whatever layer_types says.
        return [i for i in range(n) if (i + 1) % 4 == 0], [i for i in range(n) if (i + 1) % 4 != 0]
    if arch_name in names.MIMO_V2_ARCHS and isinstance(cfg.get("hybrid_layer_pattern"), list):
        pat = cfg["hybrid_layer_pattern"]
        return ([i for i in range(n) if i < len(pat) and pat[i] == 0],
                [i for i in range(n) if i < len(pat) and pat[i] == 1])
    return full, swa


def _hybrid_swa(cfg: dict[str, Any], arch_name: str, full: list[int], swa: list[int],
                assumptions: list[str]) -> tuple[list[int], list[int], bool]:
    """Whether SGLang keeps a separate sliding-window pool; without one, sliding layers count as full ones."""
    hybrid_swa = bool(swa) and (arch_name in names.HYBRID_SWA_ARCHS or bool(cfg.get("is_hybrid_swa")))
    if hybrid_swa and arch_name.startswith(_SWA_NOT_MODELLED):
        assumptions.append(f"{arch_name}: SGLang sizes its sliding-window layers with per-layer head counts/dims or a "
                           "compressed SWA pool that is not modelled here; the capacity figures are approximate")
    if swa and any(arch_name.startswith(a) for a in _NO_SWA_SAVING):
        hybrid_swa = False
        assumptions.append(f"{arch_name}: SGLang disables the hybrid SWA pool, so sliding layers keep full-length KV")
    if swa and not hybrid_swa:
        full, swa = sorted(full + swa), []
    return full, swa, hybrid_swa


def _swa_shape(cfg: dict[str, Any], arch_name: str, hybrid_swa: bool, kv_heads: int, head_dim: int, v_head_dim: int,
               source: str) -> tuple[int, int, int, int | None, int | None, int | None]:
    """(kv_heads, head_dim, v_head_dim) of the full layers and (heads, head dim, v head dim) of the sliding ones."""
    swa_heads = swa_hd = swa_vhd = None
    if hybrid_swa and arch_name.startswith("Gemma4") and isinstance(cfg.get("global_head_dim"), int):
        # Gemma-4: full-attention layers use global_head_dim and num_global_key_value_heads, sliding ones
        # head_dim and num_key_value_heads (SGLang's Gemma4 config mapping, utils/hf_transformers/config.py)
        swa_heads, swa_hd, swa_vhd = int(kv_heads), int(head_dim), int(v_head_dim)
        kv_heads = cfg.get("num_global_key_value_heads") or kv_heads
        head_dim = v_head_dim = _int(cfg, "global_head_dim", source)
    elif hybrid_swa:
        # model_config.get_swa_num_kv_heads / swa_head_dim / swa_v_head_dim (MiMo-V2 and opt-in configs)
        swa_heads = cfg.get("swa_num_key_value_heads") if isinstance(cfg.get("swa_num_key_value_heads"), int) else None
        swa_hd = cfg.get("swa_head_dim") if isinstance(cfg.get("swa_head_dim"), int) else None
        swa_vhd = cfg.get("swa_v_head_dim") if isinstance(cfg.get("swa_v_head_dim"), int) else swa_hd
    return kv_heads, head_dim, v_head_dim, swa_heads, swa_hd, swa_vhd


def _nonneg(v: Any, key: str, source: str) -> int:
    if not is_int(v) or v < 0:
        raise InputError(f"{source}: '{key}' must be a non-negative integer (got {v!r})")
    return v


def _opt_int(d: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        if is_int(d.get(k)) and d[k] > 0:
            return int(d[k])
    return None


def _context_len(cfg: dict[str, Any], model_type: str, source: str, assumptions: list[str]) -> tuple[int | None, str]:
    """utils/hf_transformers/common.py get_context_length: the first CONTEXT_LENGTH_KEYS entry, times the
    rope scaling factor unless the scaling keeps original_max_position_embeddings or is llama3."""
    rope = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else None
    factor: float = 1
    if rope:
        f = rope.get("factor", 1)
        factor = f if is_number(f) and f > 0 else 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in _CONTEXT_KEYS:
        v = cfg.get(key)
        if v is not None:
            if not is_number(v) or v <= 0:
                raise InputError(f"{source}: '{key}' must be a positive integer (got {v!r})")
            return int(factor * v), f"{key} in config.json" + (f" × rope factor {factor:g}" if factor != 1 else "")
    if model_type in SGLANG_CONTEXT_DEFAULTS:
        return SGLANG_CONTEXT_DEFAULTS[model_type], f"SGLang's {model_type} config class default (config.json has no length)"
    if model_type in HF_CONTEXT_DEFAULTS:
        return HF_CONTEXT_DEFAULTS[model_type], f"transformers' {model_type} config default (config.json has no length)"
    assumptions.append(f"no context length in {source} and no known default for model_type {model_type!r}: SGLang's 2048 assumed")
    return 2048, "SGLang's fallback 2048 (config.json has no length)"


def auto_kv_override(a: Arch, compute_capability: str | None) -> tuple[str, str] | None:
    """arg_groups/overrides.py: DeepSeek DSA models override `--kv-cache-dtype auto` before the checkpoint is
    read — fp8_e4m3 on SM100 and newer, bfloat16 below — whatever hf_quant_config says. (dtype, why) or None."""
    if not a.dsa:
        return None
    if not compute_capability:
        return "bfloat16", ("DSA model: SGLang picks bfloat16 below SM100 and fp8_e4m3 from SM100; no "
                            "compute_capability in the spec, bfloat16 assumed")
    major = int(str(compute_capability).split(".")[0])
    return ("fp8_e4m3" if major >= 10 else "bfloat16"), f"DSA model on SM {compute_capability}: SGLang overrides auto"
