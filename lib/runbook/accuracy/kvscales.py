"""Calibrated FP8 E4M3 KV scales as the files SGLang 0.5.23 reads, and which of its attention backends apply them.

Two routes, by SGLang's source (sglang/srt/...):

1. `--quantization-param-path FILE.json` (`kv_scales.json` here): read only when `--kv-cache-dtype fp8_e4m3`
   (model_executor/model_runner_components/load_model_utils.py:123-126), validated by `QuantParamSchema`
   (model_loader/weight_utils.py:1914; `kv_cache.dtype` must be "float8_e4m3fn", one map per TP rank with one float
   per layer: :1861-1897), and applied by the model's own `load_kv_cache_scales` — SGLang's LlamaForCausalLM sets the
   SAME factor as k_scale and v_scale (models/llama.py:522-524), so the file holds max(K scale, V scale) per layer.
   The transformers backend (`--model-impl transformers`, what runs on CPU) has no `load_kv_cache_scales`: SGLang then
   stops with "model ... does not support loading scaling factors" (load_model_utils.py:131-135). The route sets
   `k_scale` but not `k_scale_float`, which the triton backend uses to de-scale (layers/attention/triton_backend.py:
   1835-1837) and flashinfer passes to its kernel (flashinfer_backend.py:1437): SGLang issue 18818's "scales never
   reach the KV buffer".
2. Checkpoint tensors `model.layers.N.self_attn.k_scale` / `v_scale` (`kv_scales.safetensors` here): loaded into
   RadixAttention's k_scale/v_scale parameters only when the checkpoint's quantization config gives attention a KV
   cache method (layers/radix_attention.py:104-107 → quantization/kv_cache.py:39-43; e.g. an FP8/ModelOpt checkpoint
   with KV quantization), which also sets k_scale_float (kv_cache.py:80-83). Name remapping:
   model_loader/weight_utils.py:1779 (`maybe_remap_kv_scale_name`). A BF16 checkpoint without such a config ignores them.

Who applies a loaded scale: triton (write: triton_backend.py:1721-1742, read: :1835-1837), flashinfer
(flashinfer_backend.py:1400-1438), fa3 (flashattention_backend.py:1432-1435, 1536-1548). torch_native — SGLang's
attention on CPU — never does: it writes the pool with `set_kv_buffer(layer, loc, k, v)` and no scales
(layers/attention/torch_native_backend.py:299 and :367; mem_cache/memory_pool.py:2926-2931 divides only by a scale it
is given) and reads the FP8 pool back with a plain cast (torch_native_backend.py:145-146). On CPU, FP8 KV is always
scale 1.0, whatever file or tensor is given.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runbook.core.fsutil import atomic_write_text

JSON_NAME = "kv_scales.json"
TENSORS_NAME = "kv_scales.safetensors"


def param_json(scales: Sequence[Mapping[str, Any]], model_type: str, tp_size: int = 1) -> dict[str, Any]:
    """SGLang's `--quantization-param-path` document: one E4M3 factor per layer (max of K's and V's calibrated scale,
    since SGLang applies one factor to both), the same for every TP rank (a per-tensor scale does not depend on the
    rank's heads)."""
    per_layer = {str(int(s["layer"])): max(float(s["k_e4m3"]), float(s["v_e4m3"])) for s in scales}
    return {"model_type": model_type,
            "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {str(r): dict(per_layer) for r in range(tp_size)}}}


def tensors(scales: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The checkpoint tensors: separate K and V scales per layer, float32 scalars (what kv_cache.py:39-43 creates)."""
    out = {}
    for s in scales:
        i = int(s["layer"])
        out[f"model.layers.{i}.self_attn.k_scale"] = np.array(float(s["k_e4m3"]), dtype=np.float32)
        out[f"model.layers.{i}.self_attn.v_scale"] = np.array(float(s["v_e4m3"]), dtype=np.float32)
    return out


def write(scales: Sequence[Mapping[str, Any]], model_type: str, out_dir: str | Path) -> dict[str, str]:
    """Both files into out_dir; their paths by kind."""
    from safetensors.numpy import save_file  # lazy: only when scales are written

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / JSON_NAME, json.dumps(param_json(scales, model_type), indent=1) + "\n")
    tmp = d / f".{TENSORS_NAME}.tmp"
    save_file(tensors(scales), str(tmp))
    tmp.replace(d / TENSORS_NAME)
    return {"quantization_param_path": str(d / JSON_NAME), "checkpoint_tensors": str(d / TENSORS_NAME)}
