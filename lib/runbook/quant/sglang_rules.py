"""What SGLang 0.5.23 itself decides from a checkpoint's files on a CUDA host (SM 80+): the quantization
method ModelConfig._verify_quantization settles on, the config class the loader builds, the KV dtype that
`--kv-cache-dtype auto` resolves to, and where SGLang would refuse to start. Each step names the SGLang
function it follows; tests/test_quant_vs_sglang.py checks the result against SGLang's code itself
(tests/oracle/sglang_quant.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runbook.model import quant_capability, sglang_names
from runbook.model.checkpoint import Checkpoint
from runbook.quant.sglang_configs import SGLangRefusal, kv_cache_quant_algo

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



@dataclass
class SGLangView:
    quantization: str | None = None           # ModelConfig.quantization after _verify_quantization
    quant_method: str | None = None           # the checkpoint's method as SGLang reads it
    config_class: str | None = None           # get_quantization_config(quantization).__name__
    kv_cache_quant_algo: str | None = None    # the quant config's kv_cache_quant_algo
    refusal: SGLangRefusal | None = None



def capability_check(v: SGLangView, compute_capability: str | None) -> SGLangView:
    """model_loader/loader.py _get_quantization_config: the GPU's capability (major × 10 + minor) must reach the
    quantization config class's get_min_capability(); SGLang raises ValueError before loading any weight."""
    why = quant_capability.refusal(v.quantization, compute_capability) if v.refusal is None else None
    if why is not None:
        v.refusal = SGLangRefusal("quant_config", *why)
    return v


def modelopt_section(d: Any) -> dict[str, Any]:
    # configs/model_config.py unwrap_modelopt_quantization_config
    q = d.get("quantization", d) if isinstance(d, dict) else None
    if not isinstance(q, dict):
        return {}
    nested = q.get("quantization")
    return nested if isinstance(nested, dict) else q


def parse_modelopt(d: Any) -> dict[str, Any] | None:
    """configs/model_config.py ModelConfig._parse_modelopt_quant_config."""
    j = modelopt_section(d)
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


def _quant_hf_config(ck: Checkpoint) -> tuple[dict[str, Any] | None, str]:
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
            parsed = parse_modelopt({"quantization": qc})
            if parsed:
                qc.update(parsed)
        return qc, "config.json"
    cc = ck.config.get("compression_config")
    if cc is not None:
        return (dict(cc) if isinstance(cc, dict) else cc), "config.json"
    if ck.hf_quant_config is not None:
        return parse_modelopt(ck.hf_quant_config), "hf_quant_config.json"
    return None, ""


def _gptq_marlin_compatible(qc: dict[str, Any]) -> bool:
    """gptq/gptq.py GPTQMarlinConfig.is_gptq_marlin_compatible (+ marlin_utils.check_marlin_supported)."""
    bits, gs, sym, act = qc.get("bits"), qc.get("group_size"), qc.get("sym"), qc.get("desc_act")
    if str(qc.get("quant_method", "")).lower() != "gptq" or None in (bits, gs, sym, act):
        return False
    return (bits, sym) in ((4, True), (8, True)) and gs in _MARLIN_GROUPS


def _awq_marlin_compatible(qc: dict[str, Any]) -> bool:
    """awq/awq.py AWQMarlinConfig.is_awq_marlin_compatible: 4-bit with zero points (marlin's uint4), group in the marlin list."""
    bits, gs, zp = qc.get("bits"), qc.get("group_size"), qc.get("zero_point")
    if str(qc.get("quant_method", "")).lower() != "awq" or None in (bits, gs, zp):
        return False
    return bits == 4 and bool(zp) and gs in _MARLIN_GROUPS


def _override_method(qc: dict[str, Any], user: str | None) -> str | None:
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
    if _awq_marlin_compatible(qc) and user in (None, "marlin", "awq_marlin"):
        return "awq_marlin"
    # gptq/gptq.py GPTQMarlinConfig.override_quantization_method (check_marlin_format: already marlin -> no)
    marlin_fmt = qc.get("checkpoint_format") == "marlin" or qc.get("is_marlin_format", False)
    if not marlin_fmt and _gptq_marlin_compatible(qc) and user in (None, "marlin", "gptq_marlin"):
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


def _verify_quantization(ck: Checkpoint, user: str | None) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """configs/model_config.py ModelConfig._verify_quantization -> (quantization, checkpoint method, parsed cfg)."""
    user = user.lower() if user else None
    qc, _ = _quant_hf_config(ck)
    method: str | None = None
    if qc is not None:
        if not isinstance(qc, dict):
            raise SGLangRefusal("model_config", "compression_config is not an object", "Fix config.json.")
        raw = qc.get("quant_method", user or "")
        if not isinstance(raw, str):
            raise SGLangRefusal("model_config", f"quant_method is a {type(raw).__name__}, not a string",
                                "Fix the checkpoint's quant_method.")
        method = raw.lower()
        over = _override_method(qc, user)
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


def _config_file(ck: Checkpoint, quantization: str) -> dict[str, Any] | None:
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
    try:
        doc = json.loads((ck.dir / found[0]).read_text())
    except ValueError as e:
        raise SGLangRefusal("quant_config", f"{found[0]}: {e}", f"Fix {found[0]}.") from None
    if not isinstance(doc, dict):
        raise SGLangRefusal("quant_config", f"{found[0]} is not a JSON object", f"Fix {found[0]}.")
    return doc


def sglang_view(ck: Checkpoint, user_quant: str | None, model_dtype: str) -> SGLangView:
    """What SGLang does with this checkpoint under `--quantization user_quant` (None: not given)."""
    v = SGLangView()
    try:
        q, method, qc = _verify_quantization(ck, user_quant)
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
            cfg = _config_file(ck, q)
            if cfg is None:  # no config file for this class: built with its defaults, no KV algo
                v.config_class = q
                return _dtype_check(v, q, model_dtype)
            producer = cfg.get("producer", {})
            if q.startswith("modelopt") and not isinstance(producer, dict):
                raise SGLangRefusal("quant_config", f"'producer' in hf_quant_config.json is a {type(producer).__name__}; "
                                    "SGLang reads producer.name", "Make producer an object: {\"name\": \"modelopt\", ...}.")
            if q.startswith("modelopt") and str(producer.get("name", "")).startswith("modelopt"):
                algo = modelopt_section(cfg).get("quant_algo")
                if algo is None:
                    raise SGLangRefusal("quant_config", f"Invalid quant_config, quantization method: {q}",
                                        "hf_quant_config.json has no quant_algo.")
                cls = "modelopt_fp8" if (algo == "FP8" or q == "modelopt_fp8") else "modelopt_fp4" if "FP4" in str(algo) else q
        v.kv_cache_quant_algo = kv_cache_quant_algo(cls, cfg)
        v.config_class = cls
        return _dtype_check(v, q, model_dtype)
    except SGLangRefusal as e:
        v.refusal = e
        return v


def _dtype_check(v: SGLangView, q: str, model_dtype: str) -> SGLangView:
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


def effective_kv_dtype(flag: str, auto: str) -> str:
    if flag in ("auto", "", None):
        return auto
    return sglang_names.kv_dtype_name(flag) or flag


def side_file_view(ck: Checkpoint, auto_view: SGLangView, model_dtype: str) -> SGLangView | None:
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
