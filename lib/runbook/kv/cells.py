"""The bytes one token's KV cell and one request's linear-attention state take on one GPU, by SGLang 0.5.23's own
rules (pool_configurator.py, mamba_utils.py): what kv/memory.py sizes its pools from. Pure arithmetic over an
`arch.Arch`; bytes unless a name says otherwise."""
from __future__ import annotations

from runbook.model import sglang_names
from runbook.model.arch import Arch

# bytes per element of the whole-byte formats: KV dtypes and the linear-attention state's conv/SSM dtypes
_ESZ = {n: int(d.bytes) for n, d in {**sglang_names.KV_DTYPES, **sglang_names.MODEL_KV_DTYPES}.items() if d.bits >= 8}


def kv_heads_per_gpu(arch: Arch, a_tp: int) -> int:
    """model_config.py:1700-1711: max(1, H_kv // attn_tp); fewer heads than GPUs means replication."""
    return 1 if arch.mla else max(1, arch.num_kv_heads // a_tp)


def replication(arch: Arch, a_tp: int) -> float:
    """How many GPUs store each KV head (1.0 = no replication)."""
    if arch.mla:
        return float(a_tp)  # the latent is stored whole on every attention-TP rank
    return a_tp * kv_heads_per_gpu(arch, a_tp) / arch.num_kv_heads


def layout_words(arch: Arch, a_tp: int) -> str:
    if arch.mla:
        return (f"MLA: each GPU stores the full {arch.kv_lora_rank}+{arch.qk_rope_head_dim} latent per layer; "
                f"it is not split by TP (TP {a_tp} stores it {a_tp}×)")
    h = kv_heads_per_gpu(arch, a_tp)
    rep = replication(arch, a_tp)
    s = f"{arch.num_kv_heads} KV heads at attention-TP {a_tp}: each GPU stores {h} head{'s' if h > 1 else ''}"
    if rep > 1:
        s += f"; heads replicated {rep:g}×"
    elif arch.num_kv_heads % a_tp:
        s += f" ({arch.num_kv_heads} is not divisible by {a_tp}: SGLang floors)"
    return s


def cell_bytes(arch: Arch, kv_dtype: str, a_tp: int, full_layers: int, swa_layers: int = 0,
               swa_ratio: float = 0.8, nvfp4_layouts: int = 1, dequant_workspace_esz: int = 1,
               raw_dsa_layout: bool = False) -> float:
    """Bytes of KV per token on one GPU (pool_configurator.py): MHA/GQA, MLA, DSA, FP4 and hybrid SWA.
    `dequant_workspace_esz`: bytes per element of the FP4 dequant workspace (0: the backends need none)."""
    layers = full_layers + swa_layers
    if arch.mla:
        width = arch.kv_lora_rank + arch.qk_rope_head_dim
        if kv_dtype in sglang_names.FP4_KV:  # pool_configurator.py:387-397
            cell: float = width * layers // 2 + width // 16 * layers
        else:
            cell = mla_width_bytes(arch, kv_dtype, raw_dsa_layout) * layers  # mxfp8's scale branch is MHA-only
        return cell + dsa_indexer_bytes(arch, layers)
    h = kv_heads_per_gpu(arch, a_tp)
    dims = arch.head_dim + arch.v_head_dim
    if arch.hybrid_swa and swa_layers:
        # HybridSWAPoolConfigurator (pool_configurator.py): full layers per token plus swa_full_tokens_ratio of the
        # sliding ones; it prices a float4_e2m1fn_x2 element at its storage size (1 byte), mxfp8 with its scales.
        esz = 1 if kv_dtype in sglang_names.FP4_KV else _ESZ[kv_dtype]
        swa_h = max(1, arch.swa_num_kv_heads // a_tp) if arch.swa_num_kv_heads else h
        swa_dims = (arch.swa_head_dim or arch.head_dim) + (arch.swa_v_head_dim or arch.swa_head_dim or arch.v_head_dim)
        per_full: float = h * dims * esz + (h * dims / 32 if kv_dtype == "mxfp8" else 0)
        per_swa: float = swa_h * swa_dims * esz + (swa_h * swa_dims / 32 if kv_dtype == "mxfp8" else 0)
        return per_full * full_layers + swa_ratio * per_swa * swa_layers
    if kv_dtype in sglang_names.FP4_KV:
        # layers/quantization/fp4_kv_cache_quant_method.py compute_cell_size
        layouts = nvfp4_layouts if kv_dtype == "nvfp4" else 1
        data = h * (arch.head_dim // 2) * layers * 2
        scales = h * (arch.head_dim // 16) * layers * 2 * layouts
        workspace = h * arch.head_dim * 2 * dequant_workspace_esz  # per token, shared by all layers
        return data + scales + workspace
    esz = _ESZ[kv_dtype]
    cell = h * dims * esz * layers
    if kv_dtype == "mxfp8":
        cell += h * dims * layers // 32   # one E8M0 scale byte per 32 elements
    return cell


def state_bytes_per_request(arch: Arch, a_tp: int, linear_layers: int, ssm_dtype: str | None = None) -> int:
    """configs/mamba_utils.py (Mamba2StateShape, mamba2_cache_params) with Qwen3Next's shape: conv + SSM
    state per request. The SSM dtype: --mamba-ssm-dtype, else the config's mamba_ssm_dtype, else float32."""
    la = arch.linear
    if la is None or linear_layers == 0:
        return 0
    t = a_tp
    hk = la.num_key_heads if la.num_key_heads % t == 0 else la.num_key_heads + (t - la.num_key_heads)
    conv_dim = (la.intermediate_size or la.num_value_heads * la.value_head_dim) + 2 * hk * la.key_head_dim
    conv = conv_dim // t * (la.conv_kernel - 1) * _ESZ[la.conv_dtype]
    ssm = la.num_value_heads // t * la.value_head_dim * la.key_head_dim * _ESZ[ssm_dtype or la.ssm_dtype]
    return (conv + ssm) * linear_layers


def dsa_indexer_bytes(arch: Arch, layers: int) -> int:
    """pool_configurator.py DefaultPoolConfigurator._compute_dsa_indexer_cell_size: FP8 index keys plus
    one FP32 scale per 128, per indexed layer."""
    if not arch.dsa:
        return 0
    return (arch.index_head_dim + arch.index_head_dim // 128 * 4) * layers


def mla_width_bytes(arch: Arch, kv_dtype: str, raw_dsa_layout: bool = False) -> int:
    """mem_cache/kv_cache_configurator.py calculate_mla_kv_cache_dim: DSA models store FP8 rows with
    per-128 scales and a BF16 rope part, except when a TRT-LLM DSA kernel reads the raw MLA layout."""
    if arch.dsa and kv_dtype == "fp8_e4m3" and not raw_dsa_layout:
        return arch.kv_lora_rank + arch.kv_lora_rank // 128 * 4 + arch.qk_rope_head_dim * 2
    return (arch.kv_lora_rank + arch.qk_rope_head_dim) * _ESZ[kv_dtype]
