"""The Mamba-2 hybrid families SGLang 0.5.23 sizes a recurrent-state pool for, read from config.json.

configs/hybrid_arch.py mambaish_config names them; each config class's mamba2_cache_params maps its own
fields onto configs/mamba_utils.py Mamba2StateShape.create. This module reads the same fields, with the
same class defaults, for Nemotron-H, Falcon-H1, Granite-4.0-H (granitemoehybrid), LFM2 / LFM2-MoE and
Kimi-Linear's KDA layers.
Qwen3-Next / Qwen3.5's Gated DeltaNet is read in arch.py. Other state-pool families are named in
sglang_names.STATE_POOL_MODEL_TYPES (a warn: not sized here).
"""
from __future__ import annotations

from typing import Any

from runbook.core.errors import InputError
from runbook.core.numeric import is_int

# Defaults of SGLang's config classes for fields a real config.json may leave out.
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "nemotron_h": {"head_dim": 128},                                   # configs/nemotron_h.py NemotronHConfig
}
_NEMOTRON_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _int(cfg: dict[str, Any], key: str, default: int | None, source: str) -> int:
    v = cfg.get(key, default)
    if not is_int(v) or v < 0:
        raise InputError(f"{source}: '{key}' must be a non-negative integer (got {v!r})")
    return v


def _nemotron_blocks(cfg: dict[str, Any], n: int, source: str) -> list[str]:
    """NemotronHConfig._resolve_layers_block_type: layers_block_type, else the hybrid_override_pattern string."""
    blocks = cfg.get("layers_block_type")
    if isinstance(blocks, list) and all(isinstance(b, str) for b in blocks):
        return blocks[:n]
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or any(c not in _NEMOTRON_BLOCKS for c in pattern):
        raise InputError(f"{source}: 'hybrid_override_pattern' must be a string of M, *, - and E (got {pattern!r})")
    return [_NEMOTRON_BLOCKS[c] for c in pattern[:n]]


def _dtype(cfg: dict[str, Any]) -> str:
    """mamba_utils.py mamba2_state_dtype: the config's mamba_ssm_dtype when valid, else float32."""
    v = cfg.get("mamba_ssm_dtype")
    return v if v in ("float32", "bfloat16", "float16") else "float32"


def layers(cfg: dict[str, Any], model_type: str, n: int,
           source: str) -> tuple[list[int], list[int], dict[str, Any]] | None:
    """(full-attention layer ids, state layer ids, arch.LinearAttention fields), or None for other families.
    The fields map Mamba2StateShape.create's (n_groups, num_heads, head_dim, state_size, conv_kernel,
    intermediate_size) onto (num_key_heads, num_value_heads, value_head_dim, key_head_dim, conv_kernel, ...)."""
    if model_type == "nemotron_h":                        # configs/nemotron_h.py mamba2_cache_params
        blocks = _nemotron_blocks(cfg, n, source)
        full = [i for i, b in enumerate(blocks) if b == "attention"]
        state = [i for i, b in enumerate(blocks) if b == "mamba"]
        heads, hd = _int(cfg, "mamba_num_heads", 128, source), _int(cfg, "mamba_head_dim", 64, source)
        shape = dict(num_key_heads=_int(cfg, "n_groups", cfg.get("mamba_n_groups", 8), source), num_value_heads=heads,
                     value_head_dim=hd, key_head_dim=_int(cfg, "ssm_state_size", 128, source),
                     conv_kernel=_int(cfg, "conv_kernel", cfg.get("mamba_d_conv", 4), source), intermediate_size=heads * hd,
                     ssm_dtype=_dtype(cfg))
        return full, state, shape
    if model_type in ("falcon_h1", "granitemoehybrid"):
        hidden = _int(cfg, "hidden_size", None, source)
        if model_type == "falcon_h1":                     # configs/falcon_h1.py: attention and Mamba in every layer
            full = state = list(range(n))
            inter = cfg.get("mamba_d_ssm") or _int(cfg, "mamba_expand", 2, source) * hidden
            heads, groups, d_state, dtype = _int(cfg, "mamba_n_heads", 128, source), 1, 256, _dtype(cfg)
        else:                                             # configs/granitemoehybrid.py: layer_types
            kinds = cfg.get("layer_types")
            if not isinstance(kinds, list):
                raise InputError(f"{source}: 'layer_types' must be a list of 'mamba' / 'attention'")
            full = [i for i, t in enumerate(kinds[:n]) if t == "attention"]
            state = [i for i, t in enumerate(kinds[:n]) if t == "mamba"]
            if not state:
                return None                               # hybrid_arch.mamba2_config: no Mamba layer, no state pool
            inter = _int(cfg, "mamba_expand", 2, source) * hidden
            heads, groups, d_state, dtype = _int(cfg, "mamba_n_heads", 64, source), 1, 128, "float32"
        hd = inter // heads if cfg.get("mamba_d_head") in (None, "auto") else _int(cfg, "mamba_d_head", None, source)
        shape = dict(num_key_heads=_int(cfg, "mamba_n_groups", groups, source), num_value_heads=heads, value_head_dim=hd,
                     key_head_dim=_int(cfg, "mamba_d_state", d_state, source),
                     conv_kernel=_int(cfg, "mamba_d_conv", 4, source), intermediate_size=int(inter), ssm_dtype=dtype)
        return full, state, shape
    if model_type == "kimi_linear":                       # configs/kimi_linear.py, mamba_utils.KimiLinearStateShape
        lac = cfg.get("linear_attn_config")
        if not isinstance(lac, dict):
            raise InputError(f"{source}: 'linear_attn_config' must be an object with kda_layers, num_heads and head_dim")
        kda = lac.get("kda_layers")
        if not isinstance(kda, list) or not all(is_int(i) for i in kda):
            raise InputError(f"{source}: 'linear_attn_config.kda_layers' must be a list of 1-based layer numbers")
        state = [i for i in range(n) if i + 1 in kda]
        full = [i for i in range(n) if i + 1 not in kda]
        heads, hd = _int(lac, "num_heads", None, source), _int(lac, "head_dim", None, source)
        # q, k and v convolved (3 × heads × head_dim); a head_dim² state per head; its dtype ignores the config
        shape = dict(num_key_heads=heads, num_value_heads=heads, value_head_dim=hd, key_head_dim=hd,
                     conv_kernel=_int(lac, "short_conv_kernel_size", 4, source), intermediate_size=heads * hd,
                     ssm_dtype="float32")
        return full, state, shape
    if model_type in ("lfm2", "lfm2_moe"):                # configs/lfm2.py: short-conv state only, no SSM state
        kinds = cfg.get("layer_types")
        if not isinstance(kinds, list):
            raise InputError(f"{source}: 'layer_types' must be a list of 'full_attention' / 'conv'")
        full = [i for i, t in enumerate(kinds[:n]) if t == "full_attention"]
        state = [i for i, t in enumerate(kinds[:n]) if t in ("conv", "short_conv")]
        if not state:
            return None
        hidden = _int(cfg, "hidden_size", None, source)
        shape = dict(num_key_heads=1, num_value_heads=0, value_head_dim=hidden, key_head_dim=0,
                     conv_kernel=_int(cfg, "conv_L_cache", 3, source), intermediate_size=hidden, ssm_dtype=_dtype(cfg))
        return full, state, shape
    return None
