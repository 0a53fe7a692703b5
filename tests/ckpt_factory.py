"""Small real checkpoints for tests: safetensors files written by the safetensors library."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import TensorSpec, serialize_file

_TORCH_NAME = {"U8": ("uint8", 1), "I8": ("int8", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
               "BF16": ("bfloat16", 2), "F16": ("float16", 2), "F32": ("float32", 4), "I32": ("int32", 4)}


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """Write one shard; returns its data bytes."""
    bufs, specs = [], {}
    for name, (dtype, shape) in tensors.items():
        tname, esz = _TORCH_NAME[dtype]
        n = int(np.prod(shape)) * esz if shape else esz
        buf = np.zeros(max(n, 1), np.uint8)
        bufs.append(buf)
        specs[name] = TensorSpec(dtype=tname, shape=list(shape), data_ptr=buf.ctypes.data, data_len=n)
    serialize_file(specs, str(path), {"format": "pt"})
    return sum(int(np.prod(s)) * _TORCH_NAME[d][1] if s else _TORCH_NAME[d][1] for d, s in tensors.values())


def make(d: Path, config: dict, shards: list[dict[str, tuple[str, list[int]]]] | None = None,
         hf_quant_config: dict | None = None, index: bool = True, files: dict[str, dict] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    if hf_quant_config is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    for name, doc in (files or {}).items():
        (d / name).write_text(json.dumps(doc))
    shards = shards or []
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if index else "model.safetensors"
        total += write_shard(d / fname, tensors)
        weight_map.update({t: fname for t in tensors})
    if index and shards:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return d


def llama_config(layers=4, kv_heads=2, quant=None, dtype="bfloat16"):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": 4,
         "num_key_value_heads": kv_heads, "hidden_size": 64, "torch_dtype": dtype, "max_position_embeddings": 4096}
    if quant is not None:
        c["quantization_config"] = quant
    return c


def qwen35_config(layers=8, quant=None):
    """A tiny Qwen3.5-style hybrid: every 4th layer is full attention."""
    tc = {"model_type": "qwen3_5_moe_text", "num_hidden_layers": layers, "full_attention_interval": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
          "dtype": "bfloat16", "max_position_embeddings": 8192, "mtp_num_hidden_layers": 1}
    c = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": tc, "dtype": "bfloat16"}
    if quant is not None:
        c["quantization_config"] = quant
    return c


def linear_tensors(prefix: str, fmt: str) -> dict[str, tuple[str, list[int]]]:
    """The tensors one quantized linear layer has in the given format."""
    if fmt == "nvfp4":
        return {f"{prefix}.weight": ("U8", [64, 32]), f"{prefix}.weight_scale": ("F8_E4M3", [64, 4]),
                f"{prefix}.weight_scale_2": ("F32", []), f"{prefix}.input_scale": ("F32", [])}
    if fmt == "fp8":
        return {f"{prefix}.weight": ("F8_E4M3", [64, 64]), f"{prefix}.weight_scale": ("F32", []), f"{prefix}.input_scale": ("F32", [])}
    if fmt == "fp8block":
        return {f"{prefix}.weight": ("F8_E4M3", [64, 64]), f"{prefix}.weight_scale_inv": ("F32", [1, 1])}
    if fmt in ("awq", "gptq"):
        return {f"{prefix}.qweight": ("I32", [64, 8]), f"{prefix}.qzeros": ("I32", [1, 8]), f"{prefix}.scales": ("F16", [1, 64])}
    return {f"{prefix}.weight": ("BF16", [64, 64])}


def attn_layer(i: int, fmt: str, base: str = "model.layers") -> dict[str, tuple[str, list[int]]]:
    t: dict[str, tuple[str, list[int]]] = {}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        t.update(linear_tensors(f"{base}.{i}.self_attn.{proj}", fmt))
    t[f"{base}.{i}.input_layernorm.weight"] = ("BF16", [64])
    return t
