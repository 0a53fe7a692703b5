"""The GPU generation each SGLang 0.5.23 quantization method needs.

One table, read by the quant stage (the checkpoint's verdict) and the KV plan (its refusals): SGLang's
model_loader/loader.py _get_quantization_config raises ValueError before loading any weight when the GPU's
capability (major × 10 + minor) is below the quantization config class's get_min_capability().
"""
from __future__ import annotations

# layers/quantization/*: each config class's get_min_capability() on CUDA, for the method name ModelConfig resolves.
# fp8 / mxfp8 share Fp8Config: 80, or 100 for MXFP8 weights; mxfp8 is SGLang's name for a ModelOpt MXFP8 checkpoint.
MIN_CAPABILITY = {"auto-round": 60, "auto-round-int8": 75, "awq": 75, "awq_marlin": 80, "bitsandbytes": 70,
                  "blockwise_int8": 80, "compressed-tensors": 70, "fp8": 80, "gguf": 60, "gptq_marlin": 80, "humming": 75,
                  "minimax_m3_nvfp4": 90, "modelopt": 89, "modelopt_fp4": 80, "modelopt_fp8": 89, "modelopt_mixed": 80,
                  "modelslim": 0, "moe_wna16": 70, "mxfp4": 80, "mxfp8": 100, "mxfp_w4a8": 0, "nvfp4_online": 100,
                  "petit_nvfp4": 90, "quark": 70, "quark_int4fp8_moe": 70, "quark_mxfp4": 70, "w4afp8": 90, "w8a8_fp8": 89,
                  "w8a8_int8": 75}


def capability(compute_capability: str) -> int:
    """"8.9" → 89, as torch.cuda.get_device_capability() is folded by the loader."""
    major, _, minor = str(compute_capability).partition(".")
    return int(major) * 10 + int(minor or 0)


def refusal(quantization: str | None, compute_capability: str | None) -> tuple[str, str] | None:
    """(SGLang's error message, the fix) when the GPU is below the method's minimum capability, else None."""
    if not quantization or not compute_capability:
        return None
    cap, need = capability(compute_capability), MIN_CAPABILITY.get(quantization)
    if need is None or cap >= need:
        return None
    return (f"The quantization method {quantization} is not supported for the current GPU. Minimum capability: {need}. "
            f"Current capability: {cap}.",
            f"Serve it on a GPU of compute capability {need // 10}.{need % 10} or newer, or use a checkpoint quantized for "
            "this GPU (e.g. BF16 or a Marlin-backed GPTQ/AWQ one).")
