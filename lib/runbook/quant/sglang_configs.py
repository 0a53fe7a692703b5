"""SGLang's quantization config classes as their from_config builds them from a checkpoint's quant config:
the kv_cache_quant_algo each reports (configure_kv_cache_dtype reads it under `auto`), and the start-up error
each raises on a config it cannot use (SGLangRefusal). The choice of class is sglang_rules.py."""
from __future__ import annotations

from typing import Any


class SGLangRefusal(Exception):
    """SGLang would stop at start-up; `stage` says where, `fix` what to change."""

    def __init__(self, stage: str, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.stage, self.fix = stage, fix



def _need(cfg: dict[str, Any], *keys: str) -> Any:
    # base_config.py QuantizationConfig.get_from_keys
    for k in keys:
        if k in cfg:
            return cfg[k]
    raise SGLangRefusal("quant_config", f"Cannot find any of {list(keys)} in the model's quantization config.",
                        f"Add {keys[0]!r} to the checkpoint's quantization config.")


def _kv_modelopt_fp8(cfg: dict[str, Any], flat: bool) -> str | None:
    # modelopt_quant.py ModelOptFp8Config.from_config: a flat config reads kv_cache_scheme only as a dict
    # (float, 8 bits -> FP8) and otherwise kv_cache_quant_algo; a string kv_cache_scheme counts for nothing.
    if flat:
        scheme = cfg.get("kv_cache_scheme")
        kv = (("FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else None)
              if isinstance(scheme, dict) else cfg.get("kv_cache_quant_algo"))
        algo = cfg.get("quant_algo")
    else:
        q = cfg.get("quantization")
        if not isinstance(q, dict):
            raise SGLangRefusal("quant_config", "Cannot find 'quant_algo' in the model's quantization config.",
                                "The ModelOpt config needs quant_algo (flat) or quantization.quant_algo (hf_quant_config.json).")
        algo, kv = q.get("quant_algo"), q.get("kv_cache_quant_algo")
    if algo is None:
        raise SGLangRefusal("quant_config", "Cannot find 'quant_algo' in the model's quantization config.",
                            "Add quant_algo to the ModelOpt config.")
    if algo != "FP8":
        raise SGLangRefusal("quant_config", f"ModelOptFp8Config only supports regular FP8 quantization, but found {algo!r}.",
                            "SGLang has no ModelOpt kernel for this quant_algo: use an FP8/NVFP4/MXFP8 export.")
    return kv if isinstance(kv, str) or kv is None else str(kv)


def _kv_modelopt_fp4(cfg: dict[str, Any], flat: bool) -> str | None:
    # modelopt_quant.py ModelOptFp4Config.from_config: flat configs take kv_cache_scheme as a dict (float 8 -> FP8,
    # else "auto") or as a string (FP8/FLOAT8 -> FP8, FP4/FLOAT4/NVFP4 -> NVFP4, else "auto"); nested read
    # quantization.kv_cache_quant_algo. An "fp8" checkpoint is requantized online (no KV algo).
    if cfg.get("__online__") or str(cfg.get("quant_method", "")).lower() == "fp8":
        return None
    kv: Any
    if flat:
        algo, scheme = cfg.get("quant_algo"), cfg.get("kv_cache_scheme")
        if isinstance(scheme, dict):
            kv = "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else "auto"
        elif isinstance(scheme, str):
            s = scheme.strip().upper()
            kv = "FP8" if s in ("FP8", "FLOAT8") else "NVFP4" if s in ("FP4", "FLOAT4", "NVFP4") else "auto"
        else:
            kv = cfg.get("kv_cache_quant_algo") or "auto"
        gs = cfg.get("group_size")
        if gs is None:
            groups = cfg.get("config_groups") or {}
            first: Any = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
            weights = first.get("weights", {}) if isinstance(first, dict) else None
            gs = weights.get("group_size") if isinstance(weights, dict) else None
        if gs is None and isinstance(algo, str) and "NVFP4" in algo:
            gs = 16
        excl = cfg.get("ignore", cfg.get("modules_to_not_convert", cfg.get("exclude_modules", [])))
    else:
        q = cfg.get("quantization")
        if not isinstance(q, dict) or "quant_algo" not in q:
            raise SGLangRefusal("quant_config", "Cannot find 'quant_algo' in the model's quantization config.",
                                "The ModelOpt config needs quantization.quant_algo.")
        algo, kv = q["quant_algo"], (q.get("kv_cache_quant_algo") or "auto")
        sizes: set[int] = {v for v in (cfg.get("group_size"), q.get("group_size")) if isinstance(v, int)}
        for g in (cfg.get("config_groups") or {}).values():
            if isinstance(g, dict):
                sizes |= {int(v["group_size"]) for v in [g, *g.values()] if isinstance(v, dict) and isinstance(v.get("group_size"), int)}
        if len(sizes) != 1:  # ModelOptFp4Config.common_group_size
            raise SGLangRefusal("quant_config", "No group_size found in config." if not sizes else
                                f"Inconsistent group_size values: {sorted(sizes)}", "Fix group_size in hf_quant_config.json.")
        gs, excl = sizes.pop(), q.get("exclude_modules", [])
    if algo not in ("FP8", "NVFP4", "NVFP4_AWQ", "W4A16_NVFP4"):
        raise SGLangRefusal("quant_config", "ModelOpt currently only supports: FP8, NVFP4, NVFP4_AWQ, W4A16_NVFP4 quantizations "
                            f"in sglang (found {algo!r}).", "SGLang has no kernel for this ModelOpt quant_algo.")
    if gs is None or excl is None:
        raise SGLangRefusal("quant_config", "NVFP4 quantization requires group_size and exclude_modules specified in the "
                            "quantization config", "Add group_size (16) and exclude_modules / ignore to the config.")
    return kv if isinstance(kv, str) else None


def _kv_modelopt_mixed(cfg: dict[str, Any], flat: bool) -> str | None:
    # modelopt_quant.py ModelOptMixedPrecisionConfig.from_config
    kv: Any
    if flat:
        algo, scheme = cfg.get("quant_algo"), cfg.get("kv_cache_scheme")
        if isinstance(scheme, dict):
            kv = ("FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else
                  "NVFP4" if scheme.get("type") == "float" and scheme.get("num_bits") == 4 else "auto")
        else:
            kv = cfg.get("kv_cache_quant_algo")
        layers = cfg.get("quantized_layers", {})
    else:
        q = cfg.get("quantization")
        if not isinstance(q, dict):
            raise SGLangRefusal("quant_config", "Cannot find 'quantization' in the model's quantization config.",
                                "Fix hf_quant_config.json.")
        algo, kv, layers = q.get("quant_algo"), q.get("kv_cache_quant_algo"), q.get("quantized_layers", {})
    if algo != "MIXED_PRECISION":
        raise SGLangRefusal("quant_config", "ModelOptMixedPrecisionConfig only supports MIXED_PRECISION checkpoints.",
                            "Fix quant_algo.")
    if not layers:
        raise SGLangRefusal("quant_config", "MIXED_PRECISION quantization requires a non-empty quantized_layers map.",
                            "Re-export with ModelOpt: quantized_layers lists each layer's algorithm.")
    return kv if isinstance(kv, str) else None


def _kv_fp8(cfg: dict[str, Any], flat: bool) -> str | None:
    # fp8.py Fp8Config.from_config: quant_method and activation_scheme are required; KV from kv_cache_quant_algo.
    _need(cfg, "quant_method")
    _need(cfg, "activation_scheme")
    kv = cfg.get("kv_cache_quant_algo")
    return kv if isinstance(kv, str) else None


def _kv_compressed_tensors(cfg: dict[str, Any], flat: bool) -> str | None:
    # compressed_tensors.py CompressedTensorsConfig.kv_cache_quant_algo -> CompressedTensorsKVCacheMethod
    # .is_supported_scheme: float, 8 bits, strategy exactly "tensor", symmetric, not dynamic.
    scheme = cfg.get("kv_cache_scheme")
    if scheme is None:
        return None
    if not isinstance(scheme, dict):
        # configure_kv_cache_dtype's getattr(..., None) swallows the AttributeError (auto would be the model dtype),
        # but CompressedTensorsConfig.get_quant_method for the first RadixAttention calls .get() on it and fails.
        raise SGLangRefusal("attention_init", f"kv_cache_scheme is a {type(scheme).__name__}; SGLang reads it with .get()",
                            "Fix kv_cache_scheme: an object such as {type: float, num_bits: 8, strategy: tensor}.")
    ok = (scheme.get("type") == "float" and scheme.get("num_bits") == 8 and scheme.get("strategy") == "tensor"
          and scheme.get("symmetric", True) and not scheme.get("dynamic", False))
    return "FP8" if ok else None


def _kv_gptq_marlin(cfg: dict[str, Any], flat: bool) -> str | None:
    # gptq/gptq.py GPTQMarlinConfig.from_config / __init__: TYPE_MAP holds (4, sym) and (8, sym) only.
    bits, sym = _need(cfg, "bits"), None
    _need(cfg, "group_size")
    _need(cfg, "desc_act")
    sym = _need(cfg, "sym")
    if (bits, sym) not in ((4, True), (8, True)):
        raise SGLangRefusal("quant_config", f"Unsupported quantization config: bits={bits}, sym={sym}",
                            "gptq_marlin runs 4- and 8-bit symmetric GPTQ only; use a 4/8-bit symmetric export.")
    return None


def _kv_awq_marlin(cfg: dict[str, Any], flat: bool) -> str | None:
    _need(cfg, "bits")
    _need(cfg, "group_size")
    _need(cfg, "zero_point")
    return None


def _kv_awq(cfg: dict[str, Any], flat: bool) -> str | None:
    _need(cfg, "w_bit", "bits")
    _need(cfg, "q_group_size", "group_size")
    _need(cfg, "zero_point")
    return None


_KV_FROM_CONFIG = {'modelopt': _kv_modelopt_fp8, 'modelopt_fp8': _kv_modelopt_fp8, 'modelopt_fp4': _kv_modelopt_fp4,
                   'modelopt_mixed': _kv_modelopt_mixed, 'fp8': _kv_fp8, 'mxfp8': _kv_fp8, 'compressed-tensors': _kv_compressed_tensors,
                   'gptq_marlin': _kv_gptq_marlin, 'awq_marlin': _kv_awq_marlin, 'awq': _kv_awq}


def kv_cache_quant_algo(quantization: str, cfg: dict[str, Any]) -> str | None:
    """from_config of the class SGLang picks; returns its kv_cache_quant_algo, raising where from_config does.
    w4afp8, mxfp4 and the rest have no kv_cache_quant_algo attribute: None."""
    fn = _KV_FROM_CONFIG.get(quantization)
    return fn(cfg, cfg.get("quant_algo") is not None) if fn else None
