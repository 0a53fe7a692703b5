"""What SGLang 0.5.23 itself decides about a checkpoint's quantization (run by .venv-serving's python).

stdin: a JSON list of {"id", "model_dir", "argv"}; argv holds server flags such as
["--quantization", "gptq_marlin", "--kv-cache-dtype", "auto", "--dtype", "auto"].
stdout: a JSON list, one object per case:
    {"id", "quantization", "quant_config_class", "kv_cache_quant_algo", "kv_cache_dtype",
     "attention_kv_method", "model_class_stand_in", "refusal": null | {"stage", "type", "message"}}

Every decision is SGLang's own code, called, not re-implemented:
  * configs/model_config.py ModelConfig(...)  -> _parse_quant_hf_config, _parse_modelopt_quant_config,
    _verify_quantization (override_quantization_method loop, compatibility table, registry check);
  * model_loader/loader.py _get_quantization_config -> weight_utils.get_quant_config ->
    layers/quantization get_quantization_config(...).from_config(...), then the min-capability and
    activation-dtype checks;
  * mem_cache/kv_cache_dtype.py configure_kv_cache_dtype on an object whose only attribute is the
    quant config (all that function reads from the model);
  * for compressed-tensors, the KV-scheme check CompressedTensorsConfig.get_quant_method runs for every
    attention layer at model construction (CompressedTensorsKVCacheMethod.is_supported_scheme).

Emulated, and only these GPU probes (this process has CPU torch; the target is a CUDA host):
  * get_device_capability() -> (SM // 10, SM % 10), SM from $RUNBOOK_ORACLE_SM (default 90, H200);
  * the CUDA branch of layers/quantization/__init__.py that registers "mxfp4" on CUDA hosts;
  * awq/awq.py's import-time `_is_cuda` flag (gates AWQ -> awq_marlin on CUDA).
Where a model class does not import on this CPU host (its kernels are CUDA-only), the loader's
get_model_architecture is answered with a bare stand-in class (no packed_modules_mapping); the
result then says "model_class_stand_in": true.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _emulate_cuda_probes(sm: int) -> None:
    import sglang.srt.utils.common as common

    real = common.get_device_capability

    def get_device_capability(device_id: int = 0):
        return sm // 10, sm % 10

    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang") and mod is not None and getattr(mod, "get_device_capability", None) is real:
            mod.get_device_capability = get_device_capability  # type: ignore[attr-defined]

    from sglang.srt.layers import quantization as q
    from sglang.srt.layers.quantization.awq import awq
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    q.QUANTIZATION_METHODS.setdefault("mxfp4", Mxfp4Config)
    q.BASE_QUANTIZATION_METHODS.setdefault("mxfp4", Mxfp4Config)
    awq._is_cuda = True  # type: ignore[attr-defined]


def _parse_argv(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    ns, _ = p.parse_known_args(argv)
    return ns


def _dtype_name(dt: Any) -> str:
    import torch
    from sglang.srt.mem_cache.kv_cache_dtype import TORCH_DTYPE_TO_KV_CACHE_STR

    if dt in TORCH_DTYPE_TO_KV_CACHE_STR and TORCH_DTYPE_TO_KV_CACHE_STR[dt] != "bf16":
        return TORCH_DTYPE_TO_KV_CACHE_STR[dt]
    return str(dt).removeprefix("torch.") if isinstance(dt, torch.dtype) else str(dt)


def _refusal(stage: str, e: BaseException) -> dict[str, str]:
    return {"stage": stage, "type": type(e).__name__, "message": str(e)[:2000]}


def decide(case: dict[str, Any]) -> dict[str, Any]:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
    from sglang.srt.model_loader import loader

    ns = _parse_argv(list(case.get("argv") or []))
    out: dict[str, Any] = {"id": case["id"], "quantization": None, "quant_config_class": None,
                           "kv_cache_quant_algo": None, "kv_cache_dtype": None, "refusal": None,
                           "attention_kv_method": None, "model_class_stand_in": False}
    try:
        mc = ModelConfig(case["model_dir"], trust_remote_code=ns.trust_remote_code, quantization=ns.quantization,
                         dtype=ns.dtype)
    except Exception as e:  # SGLang refuses to start: ModelConfig is built before anything else
        out["refusal"] = _refusal("model_config", e)
        return out
    out["quantization"] = mc.quantization
    qc = None
    if mc.quantization is not None:
        real_arch = loader.get_model_architecture
        try:
            real_arch(mc)
        except Exception:
            out["model_class_stand_in"] = True
            loader.get_model_architecture = lambda _mc: (type("StandIn", (), {}), "StandIn")  # type: ignore[assignment]
        try:
            qc = loader._get_quantization_config(mc, LoadConfig(load_format="auto"))
        except Exception as e:
            out["refusal"] = _refusal("quant_config", e)
            return out
        finally:
            loader.get_model_architecture = real_arch  # type: ignore[assignment]
        out["quant_config_class"] = type(qc).__name__ if qc is not None else None
    try:
        algo = getattr(qc, "kv_cache_quant_algo", None)
        out["kv_cache_quant_algo"] = algo if isinstance(algo, (str, type(None))) else repr(algo)
        _, kv = configure_kv_cache_dtype(server_args_kv_cache_dtype=ns.kv_cache_dtype,
                                         model=types.SimpleNamespace(quant_config=qc), model_dtype=mc.dtype,
                                         is_draft_worker=False, is_dflash=False,
                                         speculative_draft_attention_backend=None)
        out["kv_cache_dtype"] = _dtype_name(kv)
    except Exception as e:
        out["refusal"] = _refusal("kv_cache", e)
        return out
    # What CompressedTensorsConfig.get_quant_method does for each RadixAttention layer at model construction:
    # a declared kv_cache_scheme goes through CompressedTensorsKVCacheMethod.is_supported_scheme. (RadixAttention
    # itself does not import here: its attention backends need einops, absent from this CPU venv.)
    scheme = getattr(qc, "kv_cache_scheme", None)
    if scheme is not None:
        try:
            from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
                CompressedTensorsKVCacheMethod,
            )

            ok = CompressedTensorsKVCacheMethod.is_supported_scheme(scheme)
            out["attention_kv_method"] = "CompressedTensorsKVCacheMethod" if ok else None
        except Exception as e:
            out["refusal"] = _refusal("attention_init", e)
    return out


def main() -> int:
    cases = json.load(sys.stdin)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.disable(logging.WARNING)
    import sglang_env

    sglang_env.install()
    with contextlib.redirect_stdout(io.StringIO()):
        import sglang.srt.configs.model_config
        import sglang.srt.model_loader.loader  # noqa: F401

        _emulate_cuda_probes(int(os.environ.get("RUNBOOK_ORACLE_SM", "90")))
    results = []
    for case in cases:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):  # SGLang prints some warnings
            results.append(decide(case))
    json.dump(results, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
