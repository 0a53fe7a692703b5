"""What SGLang 0.5.23 will do with a checkpoint's quantization, decided from the files alone.

Weights: producer, algorithm, group/block size, modules kept in higher precision. KV cache: what
the checkpoint declares, what `--kv-cache-dtype auto` resolves to, whether calibrated k/v scale
tensors exist for the layers that hold KV. The story's risk — FP8 KV with no scales, so SGLang
silently uses 1.0 — is a fail finding with its remedy.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from runbook.core import SGLANG_VERSION
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.core.units import GIB
from runbook.model import arch as arch_mod
from runbook.model import quant_capability, sglang_names
from runbook.model.checkpoint import INDEX, Checkpoint

FP8_KV = sglang_names.FP8_KV
MIN_CAPABILITY = quant_capability.MIN_CAPABILITY   # the shared table (model/), by the name this stage used
FP4_KV = sglang_names.FP4_KV
KV_CHOICES = sglang_names.KV_CACHE_DTYPE_CHOICES
# Scale tensor names SGLang's maybe_remap_kv_scale_name accepts (ModelOpt, llm-compressor, Quark, deprecated kv_scale).
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
_SCALE = re.compile(r"(?:^|\.)(?:k_scale|v_scale|kv_scale|k_proj\.output_scale|v_proj\.output_scale)$")
_MLA_SCALE = re.compile(r"(?:^|\.)self_attn\.(?:k_proj\.k_scale|v_proj\.v_scale|attn_mqa\.k_scale|attn_mqa\.v_scale)$")
_KINDS = [("lm_head", "lm_head"), ("embed", "embeddings"), ("linear_attn", "linear attention"),
          ("self_attn", "attention"), ("attn", "attention"), ("shared_expert", "shared experts"),
          ("router", "router / gates"), ("gate", "router / gates"), ("visual", "vision tower"), ("vision", "vision tower"),
          ("mtp", "MTP (draft) layers"), ("norm", "norms")]


@dataclass
class Weights:
    algo: str = "unquantized"
    quant_method: str | None = None
    producer: str | None = None
    producer_version: str | None = None
    group_size: int | None = None
    block_size: list[int] | None = None
    source: str | None = None                 # file the quant config was read from
    excluded_modules: list[str] = field(default_factory=list)
    kept_precision_kinds: list[str] = field(default_factory=list)
    total_bytes: int | None = None
    bytes_per_gpu: int | None = None
    dtype_counts: dict[str, int] = field(default_factory=dict)
    sglang_quantization: str | None = None    # ModelConfig.quantization under the deployment's flags
    sglang_config_class: str | None = None    # the --quantization whose config class SGLang builds
    sglang_refusal: str | None = None         # SGLang's start-up error, if it would refuse


@dataclass
class KVCache:
    declared: str | None = None
    declared_in: str | None = None
    honoured: bool = False                       # does SGLang act on the declaration under auto?
    auto_resolves_to: str = "bfloat16"
    effective: str = "bfloat16"                  # after the deployment's --kv-cache-dtype
    flag: str = "auto"
    kv_layers: int = 0
    layers_with_scales: int | None = None     # None: cannot tell (no index or shards here)
    scale_coverage: str = "unknown"              # all | some | none | unknown | file
    scale_tensor_names: list[str] = field(default_factory=list)
    kv_cache_quant_algo: str | None = None    # what SGLang's quant config reports (configure_kv_cache_dtype reads it)


@dataclass
class QuantReport:
    checkpoint: dict[str, Any]
    weights: Weights
    kv_cache: KVCache
    recommended_flags: dict[str, str]
    findings: list[Finding]
    # The checkpoint read and its location note, so a caller (service check -> kv) does not read it again.
    loaded: tuple[Checkpoint, str] | None = field(default=None, repr=False, compare=False)

    def data(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "weights": asdict(self.weights), "kv_cache": asdict(self.kv_cache),
                "recommended_flags": self.recommended_flags}


def _producer(p: Any) -> tuple[str | None, str | None]:
    if isinstance(p, dict):
        return p.get("name"), (str(p["version"]) if p.get("version") is not None else None)
    return (str(p), None) if p else (None, None)


def _kv_from_scheme(scheme: Any) -> str | None:
    if isinstance(scheme, str):
        return scheme.upper()
    if isinstance(scheme, dict) and scheme.get("type") == "float" and scheme.get("num_bits") == 8:
        return "FP8"
    if isinstance(scheme, dict) and scheme.get("num_bits"):
        return f"{str(scheme.get('type', '')).upper()}{scheme['num_bits']}"
    return None


def _first_group_weights(qc: dict[str, Any]) -> dict[str, Any]:
    groups = qc.get("config_groups") or {}
    for g in groups.values() if isinstance(groups, dict) else []:
        if isinstance(g, dict) and isinstance(g.get("weights"), dict):
            return g["weights"]
    return {}


def _algo_from_bits(w: dict[str, Any]) -> str:
    bits, typ, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
    if typ == "float" and bits == 4:
        return "NVFP4" if w.get("group_size") in (16, None) else "FP4"
    if typ == "float" and bits == 8:
        return "FP8-block" if strategy == "block" else "FP8"
    if typ == "int" and bits:
        return f"INT{bits}"
    return "unknown"


def _modelopt(qc: dict[str, Any], src: str, w: Weights, kv: KVCache, nested: bool) -> None:
    q = qc.get("quantization", {}) if nested else qc
    if not isinstance(q, dict):
        q = {}
    w.quant_method = "modelopt"
    w.producer, w.producer_version = _producer(qc.get("producer"))
    w.producer = w.producer or "modelopt"
    algo = q.get("quant_algo")
    if not algo:
        algo = _algo_from_bits(_first_group_weights(q))
    w.algo = str(algo).upper()
    gs = q.get("group_size") or _first_group_weights(q).get("group_size")
    w.group_size = int(gs) if isinstance(gs, int) else (16 if w.algo == "NVFP4" else None)
    w.excluded_modules = list(q.get("exclude_modules") or q.get("ignore") or q.get("modules_to_not_convert") or [])
    declared = q.get("kv_cache_quant_algo") or _kv_from_scheme(q.get("kv_cache_scheme"))
    kv.declared = str(declared).upper() if declared else None
    kv.declared_in = src if kv.declared else None
    kv.honoured = kv.declared == "FP8"


def _compressed_tensors(qc: dict[str, Any], src: str, w: Weights, kv: KVCache) -> None:
    w.quant_method = "compressed-tensors"
    w.producer = "llm-compressor (compressed-tensors)"
    w.producer_version = str(qc["version"]) if qc.get("version") else None
    wg = _first_group_weights(qc)
    w.algo = _algo_from_bits(wg)
    if qc.get("format") == "nvfp4-pack-quantized":
        w.algo = "NVFP4"
    w.group_size = wg.get("group_size") if isinstance(wg.get("group_size"), int) else None
    if isinstance(wg.get("block_structure"), list):
        w.block_size = [int(x) for x in wg["block_structure"]]
    w.excluded_modules = list(qc.get("ignore") or [])
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        kv.declared = _kv_from_scheme(scheme)
        kv.declared_in = src
        # SGLang honours only a static, symmetric, per-tensor 8-bit float scheme.
        kv.honoured = (kv.declared == "FP8" and not scheme.get("dynamic", False) and scheme.get("symmetric", True)
                       and scheme.get("strategy", "tensor") == "tensor")


def _parse(ck: Checkpoint, w: Weights, kv: KVCache, findings: list[Finding]) -> None:
    cfg = ck.config
    qc = cfg.get("quantization_config")
    src = "config.json"
    if not isinstance(qc, dict):
        qc = cfg.get("compression_config") if isinstance(cfg.get("compression_config"), dict) else None
    if qc is None and ck.hf_quant_config is not None:
        qc, src = ck.hf_quant_config, "hf_quant_config.json"
    if qc is None and ck.quantize_config is not None:
        qc, src = dict(ck.quantize_config), "quantize_config.json"
        qc.setdefault("quant_method", "awq" if "w_bit" in qc or "zero_point" in qc else "gptq")
    if qc is None:
        return
    w.source = src
    method = str(qc.get("quant_method") or ("modelopt" if "quantization" in qc or "quant_algo" in qc else "")).lower()
    if not isinstance(qc.get("quantization", {}), dict):
        qc = {k: v for k, v in qc.items() if k != "quantization"}
    if src == "hf_quant_config.json" or method == "modelopt" or (not method and "quantization" in qc):
        _modelopt(qc, src, w, kv, nested="quantization" in qc)
    elif method == "compressed-tensors":
        _compressed_tensors(qc, src, w, kv)
    elif method in ("fp8", "fbgemm_fp8"):
        w.quant_method = method
        bs = qc.get("weight_block_size")
        w.algo = "FP8-block" if bs else "FP8"
        w.block_size = [int(x) for x in bs] if bs else None
        w.excluded_modules = list(qc.get("ignored_layers") or qc.get("modules_to_not_convert") or [])
        w.producer = "Meta fbgemm" if method == "fbgemm_fp8" else None
        if qc.get("kv_cache_quant_algo"):
            kv.declared, kv.declared_in = str(qc["kv_cache_quant_algo"]).upper(), src
            kv.honoured = kv.declared == "FP8"
    elif method == "mxfp4":
        w.quant_method, w.algo, w.group_size = "mxfp4", "MXFP4", 32
        w.excluded_modules = list(qc.get("modules_to_not_convert") or [])
    elif method in ("awq", "gptq"):
        w.quant_method, w.algo = method, method.upper()
        bits = qc.get("bits") or qc.get("w_bit")
        gs = qc.get("group_size", qc.get("q_group_size"))
        w.group_size = int(gs) if isinstance(gs, int) else None
        if bits:
            w.algo = f"{method.upper()} {bits}-bit"
        w.excluded_modules = list(qc.get("modules_to_not_convert") or [])
        w.producer = "AutoAWQ" if method == "awq" else "AutoGPTQ / GPTQModel"
    else:
        w.quant_method, w.algo = method or None, "unknown"
        findings.append(Finding("quant.unknown_method", "warn", f"unknown quant_method {method!r} in {src}",
                                detail="This tool does not know how SGLang treats it; weights and KV findings below are incomplete.",
                                remedy=f"Check SGLang's --quantization choices for {method!r}; pass it explicitly in serving.flags."))
    # ModelOpt repeats itself in two files; SGLang reads config.json first. Disagreement is worth knowing.
    if src == "config.json" and w.quant_method == "modelopt" and ck.hf_quant_config:
        other_w, other_kv = Weights(), KVCache()
        _modelopt(ck.hf_quant_config, "hf_quant_config.json", other_w, other_kv, nested="quantization" in ck.hf_quant_config)
        if (other_w.algo, other_kv.declared) != (w.algo, kv.declared):
            findings.append(Finding("quant.files_disagree", "warn", "config.json and hf_quant_config.json disagree",
                                    detail=f"config.json: {w.algo}, KV {kv.declared}; hf_quant_config.json: {other_w.algo}, KV "
                                           f"{other_kv.declared}. SGLang reads config.json.",
                                    remedy="Trust config.json, or fix the checkpoint's files."))


def _kinds(patterns: list[str]) -> list[str]:
    out: list[str] = []
    for p in patterns:
        low = p.lower()
        for key, kind in _KINDS:
            if key in low:
                if kind not in out:
                    out.append(kind)
                break
    return out


def scale_tensors(names: list[str], kv_layer_ids: list[int], num_layers: int, mla: bool = False) -> tuple[dict[int, list[str]], list[str]]:
    """KV scale tensors per target-model layer (MTP/draft layers excluded).

    MLA models (DeepSeek V2/V3, Kimi K2): models/deepseek_common/deepseek_weight_loader.py does not call
    maybe_remap_kv_scale_name; a name with k_scale/v_scale that is not a parameter gets `k_proj`/`v_proj`
    replaced by `attn_mqa`, so only `self_attn.{k,v}_proj.{k,v}_scale` and the native `self_attn.attn_mqa.*`
    load; other names are skipped with a warning and the layer runs with scale 1.0."""
    per_layer: dict[int, list[str]] = {}
    for n in names:
        if n.startswith("mtp.") or ".mtp." in n:
            continue
        m = _LAYER.search(n)
        if not m:
            continue
        i, rest = int(m.group(1)), m.group(2)
        if i >= num_layers:
            continue  # DeepSeek's NextN layer sits after the last target layer
        if (_MLA_SCALE.search(rest) if mla else _SCALE.search(rest)):
            per_layer.setdefault(i, []).append(n)
    kv = set(kv_layer_ids)
    examples = [n for i in sorted(per_layer) if i in kv for n in sorted(per_layer[i])][:4]
    return {i: v for i, v in per_layer.items() if i in kv}, examples


# ---- what SGLang itself decides ------------------------------------------------------------------
# A step-by-step reading of SGLang 0.5.23's own decision on a CUDA host (SM 80+), from the files alone.
# Each step names the SGLang function it follows; tests/test_quant_vs_sglang.py checks the result against
# SGLang's code itself (tests/oracle/sglang_quant.py).

# layers/quantization/__init__.py BASE_QUANTIZATION_METHODS as registered on a CUDA host ("mxfp4" is added
# under is_cuda(); plain "gptq" only on CPU/NPU/XPU, so a CUDA host does not have it), in registry order.
SGLANG_QUANT_METHODS = ("fp8", "mxfp8", "minimax_m3_nvfp4", "blockwise_int8", "modelopt", "modelopt_fp8", "modelopt_fp4",
                        "nvfp4_online", "modelopt_mixed", "w8a8_int8", "w8a8_fp8", "awq", "awq_marlin", "bitsandbytes", "gguf",
                        "gptq_marlin", "moe_wna16", "compressed-tensors", "w4afp8", "petit_nvfp4", "quark", "quark_mxfp4",
                        "auto-round", "auto-round-int8", "modelslim", "quark_int4fp8_moe", "humming", "mxfp_w4a8", "mxfp4")
# configs/model_config.py ModelConfig._verify_quantization: compatible_quantization_methods (flag -> checkpoint
# methods it may run) and REQUANTIZATION_METHODS (flags that requantize any checkpoint online).
_SGLANG_COMPATIBLE = {"modelopt_fp8": ("modelopt",), "modelopt_fp4": ("modelopt", "fp8"), "modelopt_mixed": ("modelopt",),
                      "nvfp4_online": ("fp8", "modelopt_fp8"), "minimax_m3_nvfp4": ("mxfp8",), "petit_nvfp4": ("modelopt",),
                      "w8a8_int8": ("compressed-tensors", "compressed_tensors"), "w8a8_fp8": ("compressed-tensors", "compressed_tensors"),
                      "auto-round-int8": ("compressed-tensors", "compressed_tensors")}
_SGLANG_REQUANT = ("quark_mxfp4",)
# layers/modelopt_utils.py _MODELOPT_QUANT_ALGO_TO_METHOD (canonicalize_modelopt_quant_algo).
_MODELOPT_CANONICAL = {"FP8": "modelopt_fp8", "MXFP8": "mxfp8", "FP4": "modelopt_fp4", "NVFP4": "modelopt_fp4",
                       "NVFP4_AWQ": "modelopt_fp4", "W4A16_NVFP4": "modelopt_fp4"}
# get_supported_act_dtypes() of each config class (model_loader/loader.py _get_quantization_config rejects others).
_HALF = ("bfloat16", "float16")
_ACT_DTYPES = {"awq": ("float16",), "w4afp8": ("bfloat16",)}
# marlin_utils.py MARLIN_SUPPORTED_GROUP_SIZES (check_marlin_supported, device capability >= 80).
_MARLIN_GROUPS = (-1, 32, 64, 128)


_UNKNOWN_FIX = {
    "fbgemm_fp8": "SGLang has no fbgemm_fp8 loader and no --quantization maps to it: serve an FP8 export it reads "
                  "(quant_method fp8 / compressed-tensors / ModelOpt FP8, e.g. re-quantized with llm-compressor or ModelOpt).",
    "gptq": "Plain gptq is not registered on CUDA hosts; gptq_marlin takes only 4/8-bit symmetric GPTQ with bits, group_size "
            "(-1/32/64/128), sym and desc_act set. Use such an export (e.g. a 4-bit GPTQ or AWQ build) or an FP8/NVFP4 one.",
    "": "config.json's quantization_config has no quant_method (and is no ModelOpt FP8/FP4/MIXED_PRECISION/MXFP8 config): "
        "add the right quant_method.",
}


def capability_check(v: SGLangView, compute_capability: str | None) -> SGLangView:
    """model_loader/loader.py _get_quantization_config: the GPU's capability (major × 10 + minor) must reach the
    quantization config class's get_min_capability(); SGLang raises ValueError before loading any weight."""
    why = quant_capability.refusal(v.quantization, compute_capability) if v.refusal is None else None
    if why is not None:
        v.refusal = SGLangRefusal("quant_config", *why)
    return v


class SGLangRefusal(Exception):
    """SGLang would stop at start-up; `stage` says where, `fix` what to change."""

    def __init__(self, stage: str, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.stage, self.fix = stage, fix


@dataclass
class SGLangView:
    quantization: str | None = None           # ModelConfig.quantization after _verify_quantization
    quant_method: str | None = None           # the checkpoint's method as SGLang reads it
    config_class: str | None = None           # get_quantization_config(quantization).__name__
    kv_cache_quant_algo: str | None = None    # the quant config's kv_cache_quant_algo
    refusal: SGLangRefusal | None = None


def _modelopt_section(d: Any) -> dict[str, Any]:
    # configs/model_config.py unwrap_modelopt_quantization_config
    q = d.get("quantization", d) if isinstance(d, dict) else None
    if not isinstance(q, dict):
        return {}
    nested = q.get("quantization")
    return nested if isinstance(nested, dict) else q


def _sg_parse_modelopt(d: Any) -> dict[str, Any] | None:
    """configs/model_config.py ModelConfig._parse_modelopt_quant_config."""
    j = _modelopt_section(d)
    if not j:
        return None
    algo = j.get("quant_algo")
    if algo == "MIXED_PRECISION":
        layers = j.get("quantized_layers") or {}
        if not isinstance(layers, dict):
            raise SGLangRefusal("model_config", f"'quantized_layers' is a {type(layers).__name__}, not an object",
                                "Re-export the checkpoint: quantized_layers maps module names to their quant_algo.")
        nvfp4 = any(str(li.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4") for li in layers.values() if isinstance(li, dict))
        return {"quant_method": "modelopt_mixed" if nvfp4 else "w4afp8", "quant_algo": algo}
    if isinstance(algo, str) and algo and "FP4" in algo:
        return {"quant_method": "modelopt_fp4", "quant_algo": algo}
    if algo == "FP8":
        return {"quant_method": "modelopt_fp8", "quant_algo": algo}
    if algo == "MXFP8":
        out: dict[str, Any] = {"quant_method": "mxfp8", "quant_algo": algo, "activation_scheme": "dynamic"}
        kv_algo = j.get("kv_cache_quant_algo")
        scheme = j.get("kv_cache_scheme")
        if kv_algo is None and isinstance(scheme, dict) and scheme.get("type") == "float" and scheme.get("num_bits") == 8:
            kv_algo = "FP8"
        if kv_algo is not None:
            out["kv_cache_quant_algo"] = kv_algo
        return out
    return None


def _sg_hf_quant_cfg(ck: Checkpoint) -> tuple[dict[str, Any] | None, str]:
    """configs/model_config.py ModelConfig._parse_quant_hf_config: config.json's quantization_config (a flat
    ModelOpt one gains the parsed quant_method), else compression_config, else hf_quant_config.json parsed by
    _parse_modelopt_quant_config. quantize_config.json / quant_config.json are not read here."""
    qc = ck.config.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise SGLangRefusal("model_config", f"config.json quantization_config is a {type(qc).__name__}, not an object",
                                "Fix config.json: quantization_config must be a JSON object.")
        qc = dict(qc)
        if "quant_method" not in qc or qc["quant_method"] == "modelopt":
            parsed = _sg_parse_modelopt({"quantization": qc})
            if parsed:
                qc.update(parsed)
        return qc, "config.json"
    cc = ck.config.get("compression_config")
    if cc is not None:
        return (dict(cc) if isinstance(cc, dict) else cc), "config.json"
    if ck.hf_quant_config is not None:
        return _sg_parse_modelopt(ck.hf_quant_config), "hf_quant_config.json"
    return None, ""


def _sg_marlin_gptq(qc: dict[str, Any]) -> bool:
    """gptq/gptq.py GPTQMarlinConfig.is_gptq_marlin_compatible (+ marlin_utils.check_marlin_supported)."""
    bits, gs, sym, act = qc.get("bits"), qc.get("group_size"), qc.get("sym"), qc.get("desc_act")
    if str(qc.get("quant_method", "")).lower() != "gptq" or None in (bits, gs, sym, act):
        return False
    return (bits, sym) in ((4, True), (8, True)) and gs in _MARLIN_GROUPS


def _sg_marlin_awq(qc: dict[str, Any]) -> bool:
    """awq/awq.py AWQMarlinConfig.is_awq_marlin_compatible: 4-bit with zero points (marlin's uint4), group in the marlin list."""
    bits, gs, zp = qc.get("bits"), qc.get("group_size"), qc.get("zero_point")
    if str(qc.get("quant_method", "")).lower() != "awq" or None in (bits, gs, zp):
        return False
    return bits == 4 and bool(zp) and gs in _MARLIN_GROUPS


def _sg_override(qc: dict[str, Any], user: str | None) -> str | None:
    """The override_quantization_method loop of _verify_quantization, in registry order."""
    if user in _SGLANG_REQUANT:
        return None
    # base_config.py QuantizationConfig._modelopt_override_quantization_method (ModelOpt config classes)
    if user != "nvfp4_online":
        algo = qc.get("quant_algo", "")
        if not isinstance(algo, str):
            raise SGLangRefusal("model_config", f"quant_algo is a {type(algo).__name__}, not a string",
                                "Fix the checkpoint's quant_algo (e.g. \"FP8\", \"NVFP4\").")
        if user == "modelopt" and algo.upper() in _MODELOPT_CANONICAL:
            return _MODELOPT_CANONICAL[algo.upper()]
        if qc.get("quant_method", "") in ("modelopt_fp8", "modelopt_fp4"):
            return str(qc["quant_method"])
    # modelopt_quant.py ModelOptMixedPrecisionConfig.override_quantization_method
    if qc.get("quant_method", "") == "modelopt_mixed":
        return "modelopt_mixed"
    # awq/awq.py AWQMarlinConfig.override_quantization_method
    if _sg_marlin_awq(qc) and user in (None, "marlin", "awq_marlin"):
        return "awq_marlin"
    # gptq/gptq.py GPTQMarlinConfig.override_quantization_method (check_marlin_format: already marlin -> no)
    marlin_fmt = qc.get("checkpoint_format") == "marlin" or qc.get("is_marlin_format", False)
    if not marlin_fmt and _sg_marlin_gptq(qc) and user in (None, "marlin", "gptq_marlin"):
        return "gptq_marlin"
    # moe_wna16.py MoeWNA16Config.override_quantization_method: only when asked for
    if user == "moe_wna16":
        m, bits = str(qc.get("quant_method", "")).lower(), qc.get("bits")
        if (m == "gptq" and not qc.get("desc_act") and bits in (4, 8)) or (m == "awq" and bits == 4):
            return "moe_wna16"
    # humming.py HummingConfig.override_quantization_method
    if user == "humming" and qc.get("quant_method") != "mxfp4":
        return "humming"
    return None


def _sg_verify(ck: Checkpoint, user: str | None) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """configs/model_config.py ModelConfig._verify_quantization -> (quantization, checkpoint method, parsed cfg)."""
    user = user.lower() if user else None
    qc, _ = _sg_hf_quant_cfg(ck)
    method: str | None = None
    if qc is not None:
        if not isinstance(qc, dict):
            raise SGLangRefusal("model_config", "compression_config is not an object", "Fix config.json.")
        raw = qc.get("quant_method", user or "")
        if not isinstance(raw, str):
            raise SGLangRefusal("model_config", f"quant_method is a {type(raw).__name__}, not a string",
                                "Fix the checkpoint's quant_method.")
        method = raw.lower()
        over = _sg_override(qc, user)
        if over:
            method = user = over
        if user is None:
            user = method
        elif user != method and not (method in _SGLANG_COMPATIBLE.get(user, ()) or user in _SGLANG_REQUANT):
            raise SGLangRefusal("model_config", f"Quantization method specified in the model config ({method}) does not match "
                                f"the quantization method specified in the `quantization` argument ({user}).",
                                f"Drop --quantization (SGLang detects {method!r}) or pass a method compatible with it.")
    if user is not None and user not in SGLANG_QUANT_METHODS:
        raise SGLangRefusal("model_config", f"Unknown quantization method: {user}. Must be one of SGLang's registered methods.",
                            _UNKNOWN_FIX.get(user, "Use a checkpoint whose quant_method SGLang registers (see "
                                             "layers/quantization/__init__.py), or pass a registered --quantization."))
    return user, method, qc


def _sg_config_file(ck: Checkpoint, quantization: str) -> dict[str, Any] | None:
    """model_loader/weight_utils.py get_quant_config when config.json declares nothing: the class's
    get_config_filenames() among the checkpoint's *.json files."""
    names = {"gptq_marlin": ("quantize_config.json",), "awq_marlin": ("quantize_config.json",), "moe_wna16": ("quantize_config.json",),
             "awq": ("quant_config.json", "quantize_config.json")}.get(quantization)
    if quantization.startswith("modelopt") or quantization == "petit_nvfp4":
        names = ("hf_quant_config.json",)
    if names is None:
        return None  # classes with no config file (fp8, w4afp8, compressed-tensors, mxfp4, ...) are built with defaults
    found = sorted(p.name for p in ck.dir.glob("*.json") if any(p.name.endswith(n) for n in names))
    if not found:
        if quantization == "modelopt_fp4":
            return {"__online__": True}
        raise SGLangRefusal("quant_config", f"Cannot find the config file for {quantization}",
                            f"Add {names[0]} to the checkpoint, or a quantization_config to config.json.")
    if len(found) > 1:
        raise SGLangRefusal("quant_config", f"Found multiple config files for {quantization}: {found}",
                            "Keep one of them in the checkpoint directory.")
    import json as _json

    try:
        doc = _json.loads((ck.dir / found[0]).read_text())
    except ValueError as e:
        raise SGLangRefusal("quant_config", f"{found[0]}: {e}", f"Fix {found[0]}.") from None
    if not isinstance(doc, dict):
        raise SGLangRefusal("quant_config", f"{found[0]} is not a JSON object", f"Fix {found[0]}.")
    return doc


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


def _kv_modelopt_fp4(cfg: dict[str, Any], flat: bool) -> str | None:  # noqa: C901
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


def _sg_kv_algo(quantization: str, cfg: dict[str, Any]) -> str | None:
    """from_config of the class SGLang picks; returns its kv_cache_quant_algo, raising where from_config does.
    w4afp8, mxfp4 and the rest have no kv_cache_quant_algo attribute: None."""
    fn = _KV_FROM_CONFIG.get(quantization)
    return fn(cfg, cfg.get("quant_algo") is not None) if fn else None


def sglang_view(ck: Checkpoint, user_quant: str | None, model_dtype: str) -> SGLangView:
    """What SGLang does with this checkpoint under `--quantization user_quant` (None: not given)."""
    v = SGLangView()
    try:
        q, method, qc = _sg_verify(ck, user_quant)
        v.quantization, v.quant_method = q, method
        if q is None:
            return v
        # model_loader/weight_utils.py get_quant_config -> checkpoint_quantization.resolve_checkpoint_quant_spec:
        # config.json's quantization_config (as _parse_quant_hf_config left it), else text_config's, else
        # compression_config; modelopt_mixed without its layer map / KV metadata falls through to the file.
        cfg: dict[str, Any] | None = None
        if ck.config.get("quantization_config") is not None or ck.config.get("compression_config") is not None:
            cfg = dict(qc) if isinstance(qc, dict) else None
        elif isinstance(ck.config.get("text_config"), dict) and isinstance(ck.config["text_config"].get("quantization_config"), dict):
            cfg = dict(ck.config["text_config"]["quantization_config"])
        if cfg is not None and q == "modelopt_mixed" and ("quantized_layers" not in cfg or
                                                          ("kv_cache_quant_algo" not in cfg and "kv_cache_scheme" not in cfg)):
            cfg = None
        cls = q
        if cfg is None:
            cfg = _sg_config_file(ck, q)
            if cfg is None:  # no config file for this class: built with its defaults, no KV algo
                v.config_class = q
                return _sg_dtype_check(v, q, model_dtype)
            producer = cfg.get("producer", {})
            if q.startswith("modelopt") and not isinstance(producer, dict):
                raise SGLangRefusal("quant_config", f"'producer' in hf_quant_config.json is a {type(producer).__name__}; "
                                    "SGLang reads producer.name", "Make producer an object: {\"name\": \"modelopt\", ...}.")
            if q.startswith("modelopt") and str(producer.get("name", "")).startswith("modelopt"):
                algo = _modelopt_section(cfg).get("quant_algo")
                if algo is None:
                    raise SGLangRefusal("quant_config", f"Invalid quant_config, quantization method: {q}",
                                        "hf_quant_config.json has no quant_algo.")
                cls = "modelopt_fp8" if (algo == "FP8" or q == "modelopt_fp8") else "modelopt_fp4" if "FP4" in str(algo) else q
        v.kv_cache_quant_algo = _sg_kv_algo(cls, cfg)
        v.config_class = cls
        return _sg_dtype_check(v, q, model_dtype)
    except SGLangRefusal as e:
        v.refusal = e
        return v


def _sg_dtype_check(v: SGLangView, q: str, model_dtype: str) -> SGLangView:
    # model_loader/loader.py _get_quantization_config: model dtype must be in get_supported_act_dtypes()
    ok = _ACT_DTYPES.get(q, _HALF)
    if model_dtype not in ok:
        v.refusal = SGLangRefusal("quant_config", f"{model_dtype} is not supported for quantization method {q}. "
                                  f"Supported dtypes: {list(ok)}", f"Serve with --dtype {ok[0]}" +
                                  (" (AWQ's non-marlin kernel is float16-only)" if q == "awq" else "") + ".")
    return v


def sglang_auto_kv(view: SGLangView, model_dtype: str) -> str:
    """mem_cache/kv_cache_dtype.py configure_kv_cache_dtype under auto: FP8 iff kv_cache_quant_algo is "FP8"."""
    algo = view.kv_cache_quant_algo
    return "fp8_e4m3" if isinstance(algo, str) and algo.upper() == "FP8" else model_dtype


def _norm_kv(flag: str, auto: str) -> str:
    if flag in ("auto", "", None):
        return auto
    return sglang_names.kv_dtype_name(flag) or flag


def _dtype_findings(ck: Checkpoint, w: Weights) -> list[Finding]:
    if not ck.shards:
        return []
    c = w.dtype_counts
    expect = {"NVFP4": ("U8", "packed E2M1 weights"), "FP8": ("F8_E4M3", "FP8 E4M3 weights"),
              "FP8-block": ("F8_E4M3", "FP8 E4M3 weights"), "MXFP4": ("U8", "MXFP4 blocks")}
    if w.algo in expect and not c.get(expect[w.algo][0]):
        return [Finding("quant.ckpt.dtypes", "fail", f"declared {w.algo} but no {expect[w.algo][0]} tensors in the shards",
                        detail=f"dtypes found: {c}", remedy="The quant config does not describe these weights: re-download or re-export.")]
    if w.algo.startswith(("AWQ", "GPTQ")) and not c.get("I32"):
        return [Finding("quant.ckpt.dtypes", "fail", f"declared {w.algo} but no packed I32 qweight tensors", detail=f"dtypes found: {c}",
                        remedy="The quant config does not describe these weights.")]
    if w.algo == "unquantized" and any(k.startswith("F8") for k in c):
        return [Finding("quant.ckpt.dtypes", "warn", "FP8 tensors in a checkpoint with no quantization config", detail=f"dtypes found: {c}",
                        remedy="SGLang will load them as if unquantized: add the checkpoint's quantization_config.")]
    return [Finding("quant.ckpt.dtypes", "pass", f"tensor dtypes match {w.algo}",
                    evidence=", ".join(f"{k}: {v}" for k, v in sorted(c.items())))]


def inspect(ck: Checkpoint, flags: dict[str, Any] | None = None, tp: int = 1, pp: int = 1, location_note: str = "",
            compute_capability: str | None = None) -> QuantReport:
    """Inspect a loaded checkpoint against a deployment's SGLang flags and parallelism."""
    flags = dict(flags or {})
    findings: list[Finding] = list(ck.problems)
    w, kv = Weights(), KVCache()
    _parse(ck, w, kv, findings)
    try:
        a = arch_mod.from_config(ck.config, str(ck.dir / "config.json"))
    except InputError as e:
        raise InputError(str(e)) from None
    w.kept_precision_kinds = _kinds(w.excluded_modules)
    w.dtype_counts = ck.dtype_counts()
    w.total_bytes = ck.total_bytes
    w.bytes_per_gpu = w.total_bytes // (tp * pp) if w.total_bytes else None

    user_q = str(flags["quantization"]) if flags.get("quantization") else None
    cc = compute_capability
    auto_view = capability_check(sglang_view(ck, None, a.dtype), cc)
    view = capability_check(sglang_view(ck, user_q, a.dtype), cc) if user_q else auto_view
    side = _side_file_view(ck, auto_view, a.dtype)
    side = capability_check(side, cc) if side is not None else None
    eff = view if view.refusal is None else auto_view if auto_view.refusal is None else view
    w.sglang_quantization, w.sglang_config_class = view.quantization, view.config_class
    w.sglang_refusal = str(view.refusal) if view.refusal else None
    kv.kv_cache_quant_algo = eff.kv_cache_quant_algo
    kv.auto_resolves_to = sglang_auto_kv(eff, a.dtype)
    override = arch_mod.auto_kv_override(a, compute_capability)
    kv.honoured = kv.auto_resolves_to in FP8_KV
    if override is not None:   # SGLang ignores the checkpoint's declaration for these models
        kv.auto_resolves_to, kv.honoured = override[0], False
    kv.flag = str(flags.get("kv-cache-dtype") or "auto")
    if kv.flag not in KV_CHOICES:
        findings.append(Finding("quant.kv.flag", "fail", f"--kv-cache-dtype {kv.flag} is not a choice SGLang {SGLANG_VERSION} accepts",
                                remedy=f"Use one of {', '.join(KV_CHOICES)}."))
    kv.effective = _norm_kv(kv.flag, kv.auto_resolves_to)
    kv.kv_layers = len(a.kv_layer_ids)
    qpp = flags.get("quantization-param-path")
    if ck.has_weights:
        per_layer, kv.scale_tensor_names = scale_tensors(list(ck.weight_map), a.kv_layer_ids, a.num_layers, a.mla)
        kv.layers_with_scales = len(per_layer)
        kv.scale_coverage = ("all" if kv.layers_with_scales == kv.kv_layers else "some" if kv.layers_with_scales else "none")
    if qpp:
        kv.scale_coverage = "file"

    findings += _weights_findings(w, a, tp, pp, ck, location_note)
    findings += _dtype_findings(ck, w)
    findings += _kv_findings(kv, a, qpp, ck)
    rec = _recommend(w, kv, auto_view, side)
    findings += _refusal_findings(ck, w, auto_view, view, side, user_q)
    findings += _source_findings(ck, auto_view)
    findings += _flag_findings(flags, rec, w, view, auto_view)
    ckinfo = {"dir": str(ck.dir), "complete": ck.complete, "has_weights": ck.has_weights, "shards": len(ck.shards),
              "tensors": len(ck.weight_map), "bytes_read": ck.bytes_read, "architecture": a.architecture, "note": location_note}
    return QuantReport(ckinfo, w, kv, rec, findings, (ck, location_note))


def _weights_findings(w: Weights, a: arch_mod.Arch, tp: int, pp: int, ck: Checkpoint, note: str) -> list[Finding]:
    out = []
    who = " ".join(x for x in (w.producer, w.producer_version) if x) or "unknown producer"
    size = f", group {w.group_size}" if w.group_size else (f", block {w.block_size}" if w.block_size else "")
    out.append(Finding("quant.weights", "info", f"weights: {w.algo}{size} ({who})",
                       detail=(f"read from {w.source}; " if w.source else "no quantization config; ") +
                              (f"kept in higher precision: {', '.join(w.kept_precision_kinds)}" if w.kept_precision_kinds
                               else "no excluded modules listed"),
                       evidence=f"{len(w.excluded_modules)} exclude/ignore pattern(s)"
                                + (f", e.g. {w.excluded_modules[:3]}" if w.excluded_modules else "")))
    if w.total_bytes:
        assert w.bytes_per_gpu is not None  # set from total_bytes in inspect()
        out.append(Finding("quant.weight_bytes", "info", f"weights: {w.total_bytes / GIB:.1f} GiB in total, ~{w.bytes_per_gpu / GIB:.1f} "
                           f"GiB per GPU at TP {tp} × PP {pp}",
                           detail="Per GPU = total / (TP × PP): an even split; replicated norms and router weights add a little.",
                           evidence=f"{INDEX} total_size" if (ck.index or {}).get("metadata", {}).get("total_size")
                           else "sum over shard headers"))
    elif not ck.has_weights:
        out.append(Finding("quant.weight_bytes", "skip", "weight bytes unknown: no index or shards here",
                           detail=note or f"{ck.dir} holds configs only.",
                           remedy="Run on the host that has the checkpoint, or give the KV notebook --weights-gib."))
    else:
        out.append(Finding("quant.weight_bytes", "warn", "weight bytes incomplete: some shards could not be read",
                           remedy="Fix the shard problems above; the KV notebook needs an exact figure."))
    return out


def _kv_findings(kv: KVCache, a: arch_mod.Arch, qpp: Any, ck: Checkpoint) -> list[Finding]:
    out = []
    layers = f"{kv.kv_layers} of {a.num_layers} layers hold KV" + (" (the rest are linear attention)" if a.linear_layer_ids else "")
    decl = f"the checkpoint declares {kv.declared} KV in {kv.declared_in}" if kv.declared else "the checkpoint declares no KV quantization"
    out.append(Finding("quant.kv.auto", "info", f"--kv-cache-dtype auto resolves to {kv.auto_resolves_to}",
                       detail=f"{decl}; " + ("SGLang follows it" if kv.honoured else
                               (f"SGLang ignores it (its quant config reports kv_cache_quant_algo={kv.kv_cache_quant_algo!r}; "
                                "only \"FP8\" switches auto to FP8), " if kv.declared else "")
                               + "so auto means the model dtype") + f". {layers}."))
    if kv.effective in FP8_KV:
        n, total = kv.layers_with_scales, kv.kv_layers
        if kv.scale_coverage == "file":
            out.append(Finding("quant.kv.fp8_scales", "warn", f"FP8 KV cache ({kv.effective}) with scales from --quantization-param-path",
                               detail="Check the file was calibrated on this model; FP8 still trades long-context accuracy for capacity.",
                               evidence=str(qpp), remedy="Measure with the accuracy notebook; `--kv-cache-dtype bf16` if capacity allows."))
        elif kv.scale_coverage == "unknown":
            out.append(Finding("quant.kv.fp8_scales", "warn", f"FP8 KV cache ({kv.effective}); its k/v scales cannot be checked here",
                               detail="No index or shards on this machine. Without calibrated scales SGLang uses 1.0 and "
                                      "clips values beyond ±448.",
                               remedy="Run this on the checkpoint's host, or set `--kv-cache-dtype bf16` "
                                      "(serving.flags.kv-cache-dtype: bf16)."))
        elif kv.scale_coverage == "none":
            out.append(Finding("quant.kv.fp8_scales", "fail",
                               f"FP8 KV cache with no calibrated scales: SGLang uses 1.0 on all {total} KV layers",
                               detail="Keys and values beyond ±448 are clipped and small ones lose precision; errors "
                                      "compound over long contexts. "
                                      f"Under `auto`, SGLang {SGLANG_VERSION} logs nothing about it.",
                               evidence="no *.k_scale / *.v_scale / *.kv_scale / *.k_proj.output_scale tensors in "
                                        f"{INDEX if ck.index else 'the shards'}",
                               remedy="`--kv-cache-dtype bf16` (check capacity in the KV notebook), or calibrated scales via "
                                      "`--quantization-param-path`."))
        elif kv.scale_coverage == "some":
            assert n is not None  # "some" is only set after counting layers_with_scales
            out.append(Finding("quant.kv.fp8_scales", "fail", f"k/v scales on only {n} of {total} KV layers: the other {total - n} use 1.0",
                               evidence=", ".join(kv.scale_tensor_names),
                               remedy="`--kv-cache-dtype bf16`, or a complete calibration via `--quantization-param-path`."))
        else:
            out.append(Finding("quant.kv.fp8_scales", "warn", f"FP8 KV cache with calibrated scales on all {total} KV layers",
                               detail="Half the bytes of BF16, at a long-context accuracy cost (2-3 mantissa bits). Measure it before "
                                      "relying on it for agentic coding.",
                               evidence=", ".join(kv.scale_tensor_names),
                               remedy="Compare FP8 and BF16 with the accuracy notebook; choose `--kv-cache-dtype bf16` if "
                                      "the KV notebook shows room."))
    elif kv.effective in FP4_KV or kv.effective == "mxfp8":
        out.append(Finding("quant.kv.fp4", "warn", f"{kv.effective} KV cache: SGLang warns it may drop accuracy",
                           detail="Needs Blackwell (SM100/SM120); per-token dequantisation adds work.",
                           remedy="Measure with the accuracy notebook before production."))
    else:
        over = f" — overrides the checkpoint's {kv.declared} declaration" if kv.declared and kv.flag != "auto" else ""
        out.append(Finding("quant.kv.fp8_scales", "pass", f"KV cache in {kv.effective}{over}",
                           detail="No KV quantization error; twice the bytes per token of FP8." if kv.declared else ""))
    if kv.flag == "fp8_e4m3" and not qpp:
        truth = {"all": "misleading here: the checkpoint's own scales are loaded anyway",
                 "some": "partly true: layers without checkpoint scales use 1.0",
                 "none": "true here: there are no scales", "unknown": "scales cannot be checked here"}[kv.scale_coverage]
        out.append(Finding("quant.kv.log_warning", "info",
                           "SGLang will log \"Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.\"",
                           detail="It does so for an explicit --kv-cache-dtype fp8_e4m3 without --quantization-param-path, whatever the "
                                  f"checkpoint holds — {truth}."))
    return out


def _side_file_view(ck: Checkpoint, auto_view: SGLangView, model_dtype: str) -> SGLangView | None:
    """A GPTQ/AWQ checkpoint whose quantization lives only in quantize_config.json / quant_config.json:
    ModelConfig._parse_quant_hf_config never reads those, so SGLang sees it unquantized unless --quantization
    names a method whose get_config_filenames() finds the file (weight_utils.get_quant_config)."""
    if auto_view.refusal or auto_view.quantization or ck.quantize_config is None:
        return None
    qc = ck.quantize_config
    awq = "w_bit" in qc or "zero_point" in qc or str(qc.get("quant_method", "")).lower() == "awq"
    cands = ("awq_marlin", "awq") if awq else ("gptq_marlin",)
    first: SGLangView | None = None
    for c in cands:
        v = sglang_view(ck, c, model_dtype)
        if v.refusal is None:
            return v
        first = first or v
    return first


def _recommend(w: Weights, kv: KVCache, auto_view: SGLangView, side: SGLangView | None) -> dict[str, str]:
    rec: dict[str, str] = {}
    # What SGLang's _verify_quantization resolves to by itself; never a method it refuses.
    if auto_view.refusal is None and auto_view.quantization:
        rec["quantization"] = auto_view.quantization
    elif side is not None and side.refusal is None and side.quantization:
        rec["quantization"] = side.quantization
    if kv.auto_resolves_to in FP8_KV and kv.scale_coverage in ("none", "some", "unknown"):
        rec["kv-cache-dtype"] = "bf16"
    else:
        rec["kv-cache-dtype"] = "auto"
    return rec


def _refusal_findings(ck: Checkpoint, w: Weights, auto_view: SGLangView, view: SGLangView, side: SGLangView | None,
                      user_q: str | None) -> list[Finding]:
    out: list[Finding] = []
    if side is not None:
        if side.refusal is None:
            out.append(Finding("quant.side_file", "warn",
                               f"SGLang does not read {w.source or 'quantize_config.json'} unless --quantization is given",
                               detail="ModelConfig._parse_quant_hf_config looks only at config.json's "
                                      "quantization_config / compression_config "
                                      "and hf_quant_config.json; without the flag the packed weights are loaded as if unquantized.",
                               remedy=f"Pass --quantization {side.quantization} (serving.flags.quantization), or copy the file's "
                                      "contents into config.json's quantization_config."))
        else:
            out.append(Finding("quant.side_file", "fail", f"SGLang {SGLANG_VERSION} cannot serve this {w.algo} checkpoint: {side.refusal}",
                               detail=f"{w.source} is read only under --quantization {side.quantization}, and that refuses it; "
                                      "without the flag SGLang loads the packed weights as if unquantized.",
                               remedy=side.refusal.fix or "Use a checkpoint in a format SGLang serves."))
    if view.refusal is None:
        return out
    r = view.refusal
    if user_q and auto_view.refusal is None:
        return out  # the flag is the cause: reported by _flag_findings as quant.flag
    building = {"model_config": "model config", "quant_config": "quantization config"}.get(r.stage, "attention layers")
    out.append(Finding("quant.refused", "fail", f"SGLang {SGLANG_VERSION} refuses to start: {r}",
                       detail=f"Raised while building the {building}"
                              f" (checkpoint quant_method {auto_view.quant_method or view.quant_method!r}).",
                       evidence=f"read from {w.source}" if w.source else "",
                       remedy=r.fix or "Use a checkpoint whose quant_method SGLang registers."))
    return out


def _hq_algo(ck: Checkpoint) -> str | None:
    sect = _modelopt_section(ck.hf_quant_config) if isinstance(ck.hf_quant_config, dict) else {}
    algo = sect.get("quant_algo")
    return str(algo) if algo else None


def _source_findings(ck: Checkpoint, auto_view: SGLangView) -> list[Finding]:
    """configs/model_config.py _parse_quant_hf_config reads config.json's quantization_config (or
    compression_config) first and hf_quant_config.json only without one: say so when the two disagree, and when
    hf_quant_config.json's "quantization" is null (_parse_modelopt_quant_config returns None: the file is ignored)."""
    hq, out = ck.hf_quant_config, list[Finding]()
    if not isinstance(hq, dict):
        return out
    uses = auto_view.quantization or "no quantization (BF16/FP16 weights)"
    in_config = ck.config.get("quantization_config") is not None or ck.config.get("compression_config") is not None
    if "quantization" in hq and hq["quantization"] is None:
        out.append(Finding("quant.hf_quant_config", "warn", 'hf_quant_config.json has "quantization": null: SGLang ignores the file',
                           detail=f"ModelConfig._parse_modelopt_quant_config returns None for it; SGLang serves {uses}"
                                  + (" from config.json's quantization_config" if in_config else ""),
                           remedy="Re-export hf_quant_config.json with its quantization section, or delete the file."))
        return out
    algo = _hq_algo(ck)
    if not in_config or algo is None:
        return out
    theirs = _sg_parse_modelopt(hq) if algo != "MIXED_PRECISION" else None
    their_method = (theirs or {}).get("quant_method") or algo
    if auto_view.quantization != their_method:
        qc = ck.config.get("quantization_config") or ck.config.get("compression_config") or {}
        mine = qc.get("quant_method") if isinstance(qc, dict) else None
        out.append(Finding("quant.conflict", "warn", f"config.json ({mine or 'quantization_config'}) and hf_quant_config.json "
                                                   f"({algo}) disagree: SGLang uses config.json",
                           detail=f"ModelConfig._parse_quant_hf_config reads config.json's quantization_config first and never "
                                  f"opens hf_quant_config.json then; SGLang serves {uses}.",
                           remedy="Check which file matches the weights (the safetensors dtypes) and remove or fix the other."))
    return out


def _flag_findings(flags: dict[str, Any], rec: dict[str, str], w: Weights, view: SGLangView, auto_view: SGLangView) -> list[Finding]:
    out = []
    have, want = flags.get("quantization"), rec.get("quantization")
    if have and view.refusal is not None and auto_view.refusal is None:
        fix = f"Use --quantization {want}, or omit it: SGLang detects the checkpoint's method." if want else \
            "Omit --quantization: SGLang serves this checkpoint unquantized."
        out.append(Finding("quant.flag", "fail", f"--quantization {have}: SGLang {SGLANG_VERSION} refuses to start",
                           detail=str(view.refusal), remedy=fix))
    elif have and view.refusal is None and view.quantization != (want or view.quantization):
        out.append(Finding("quant.flag", "warn",
                           f"--quantization {have} runs as {view.quantization}, not {want} ({w.algo}, {w.quant_method})",
                           detail="SGLang accepts the combination (a compatible or requantizing method) but does not pick it by itself.",
                           remedy=f"Use --quantization {want} (or omit it: SGLang detects the checkpoint's method)."))
    elif have and view.refusal is None:
        out.append(Finding("quant.flag", "pass", f"--quantization {have} matches the checkpoint ({w.algo})" +
                           (f"; SGLang runs it as {view.quantization}" if view.quantization != have else "")))
    if rec.get("kv-cache-dtype") == "bf16" and str(flags.get("kv-cache-dtype", "auto")) in ("auto", *FP8_KV):
        out.append(Finding("quant.recommend", "warn", "recommended: --kv-cache-dtype bf16",
                           detail="The spec's setting keeps an FP8 KV cache whose scales are missing or unverifiable.",
                           remedy="Set serving.flags.kv-cache-dtype: bf16 (or serving.apply_recommended: true) after checking capacity."))
    return out


def for_deployment(spec: Deployment, model_dir: str | None = None) -> QuantReport:
    """Inspect the deployment's checkpoint (or model_dir) under the spec's flags and parallelism."""
    from runbook.model import checkpoint

    ck, note = checkpoint.for_spec(spec, model_dir)
    rep = inspect(ck, spec.serving.flags, spec.parallelism.tp, spec.parallelism.pp, note, spec.hardware.compute_capability)
    rep.loaded = (ck, note)
    if note:
        rep.findings.insert(0, Finding("quant.source", "info", "inspecting the model card, not the checkpoint", detail=note))
    return rep
