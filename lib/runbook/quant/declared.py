"""What a checkpoint's own files declare about its quantization, read as its producer wrote them: the
weights' algorithm, producer, group or block size and the modules kept in higher precision; the KV-cache
format the config declares; the k/v scale tensors per layer. What SGLang makes of them is sglang_rules.py."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from runbook.core.findings import Finding
from runbook.model.checkpoint import Checkpoint

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


def parse_declared(ck: Checkpoint, w: Weights, kv: KVCache, findings: list[Finding]) -> None:
    """Fill `w` and `kv` from the quant config the checkpoint declares (config.json's quantization_config or
    compression_config, else hf_quant_config.json, else quantize_config.json); an unknown method and two
    files that disagree are findings."""
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


def kept_precision_kinds(patterns: list[str]) -> list[str]:
    """The kinds of module (attention, router, lm_head, ...) an exclude/ignore list keeps in higher precision."""
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
