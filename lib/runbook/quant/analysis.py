"""What SGLang 0.5.23 will do with a checkpoint's quantization, decided from the files alone.

Weights: producer, algorithm, group/block size, modules kept in higher precision. KV cache: what
the checkpoint declares, what `--kv-cache-dtype auto` resolves to, whether calibrated k/v scale
tensors exist for the layers that hold KV. The story's risk — FP8 KV with no scales, so SGLang
silently uses 1.0 — is a fail finding with its remedy.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from runbook.core import SGLANG_VERSION
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.model import arch as arch_mod
from runbook.model.checkpoint import INDEX, Checkpoint

GIB = 1024**3
FP8_KV = ("fp8_e4m3", "fp8_e5m2")
FP4_KV = ("nvfp4", "fp4_mx_block16")
KV_CHOICES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
_QUANT_FLAG = {("modelopt", "NVFP4"): "modelopt_fp4", ("modelopt", "FP8"): "modelopt_fp8",
               ("modelopt", "MIXED_PRECISION"): "modelopt_mixed", ("compressed-tensors", None): "compressed-tensors",
               ("fp8", None): "fp8", ("fbgemm_fp8", None): "fbgemm_fp8", ("mxfp4", None): "mxfp4",
               ("awq", None): "awq_marlin", ("gptq", None): "gptq_marlin"}
_FLAG_ALIASES = {("modelopt", "modelopt_fp4"), ("modelopt", "modelopt_fp8"), ("awq", "awq_marlin"), ("gptq", "gptq_marlin"),
                 ("modelopt_fp4", "modelopt_fp4"), ("w8a8_fp8", "fp8")}
# Scale tensor names SGLang's maybe_remap_kv_scale_name accepts (ModelOpt, llm-compressor, Quark, deprecated kv_scale).
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
_SCALE = re.compile(r"(?:^|\.)(?:k_scale|v_scale|kv_scale|k_proj\.output_scale|v_proj\.output_scale)$")
_KINDS = [("lm_head", "lm_head"), ("embed", "embeddings"), ("linear_attn", "linear attention"),
          ("self_attn", "attention"), ("attn", "attention"), ("shared_expert", "shared experts"),
          ("router", "router / gates"), ("gate", "router / gates"), ("visual", "vision tower"), ("vision", "vision tower"),
          ("mtp", "MTP (draft) layers"), ("norm", "norms")]


@dataclass
class Weights:
    algo: str = "unquantized"
    quant_method: Optional[str] = None
    producer: Optional[str] = None
    producer_version: Optional[str] = None
    group_size: Optional[int] = None
    block_size: Optional[list[int]] = None
    source: Optional[str] = None                 # file the quant config was read from
    excluded_modules: list[str] = field(default_factory=list)
    kept_precision_kinds: list[str] = field(default_factory=list)
    total_bytes: Optional[int] = None
    bytes_per_gpu: Optional[int] = None
    dtype_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class KVCache:
    declared: Optional[str] = None
    declared_in: Optional[str] = None
    honoured: bool = False                       # does SGLang act on the declaration under auto?
    auto_resolves_to: str = "bfloat16"
    effective: str = "bfloat16"                  # after the deployment's --kv-cache-dtype
    flag: str = "auto"
    kv_layers: int = 0
    layers_with_scales: Optional[int] = None     # None: cannot tell (no index or shards here)
    scale_coverage: str = "unknown"              # all | some | none | unknown | file
    scale_tensor_names: list[str] = field(default_factory=list)


@dataclass
class QuantReport:
    checkpoint: dict[str, Any]
    weights: Weights
    kv_cache: KVCache
    recommended_flags: dict[str, str]
    findings: list[Finding]
    # The checkpoint read and its location note, so a caller (service check -> kv) does not read it again.
    loaded: Optional[tuple[Checkpoint, str]] = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "weights": asdict(self.weights), "kv_cache": asdict(self.kv_cache),
                "recommended_flags": self.recommended_flags, "findings": [f.to_dict() for f in self.findings]}


def _producer(p: Any) -> tuple[Optional[str], Optional[str]]:
    if isinstance(p, dict):
        return p.get("name"), (str(p["version"]) if p.get("version") is not None else None)
    return (str(p), None) if p else (None, None)


def _kv_from_scheme(scheme: Any) -> Optional[str]:
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
                                    detail=f"config.json: {w.algo}, KV {kv.declared}; hf_quant_config.json: {other_w.algo}, KV {other_kv.declared}. SGLang reads config.json.",
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


def scale_tensors(names: list[str], kv_layer_ids: list[int], num_layers: int) -> tuple[dict[int, list[str]], list[str]]:
    """KV scale tensors per target-model layer (MTP/draft layers excluded)."""
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
        if _SCALE.search(rest):
            per_layer.setdefault(i, []).append(n)
    kv = set(kv_layer_ids)
    examples = [n for i in sorted(per_layer) if i in kv for n in sorted(per_layer[i])][:4]
    return {i: v for i, v in per_layer.items() if i in kv}, examples


def _norm_kv(flag: str, auto: str) -> str:
    if flag in ("auto", "", None):
        return auto
    return "bfloat16" if flag in ("bf16", "bfloat16") else flag


def _dtype_findings(ck: Checkpoint, w: Weights) -> list[Finding]:
    if not ck.shards:
        return []
    c = w.dtype_counts
    expect = {"NVFP4": ("U8", "packed E2M1 weights"), "FP8": ("F8_E4M3", "FP8 E4M3 weights"),
              "FP8-block": ("F8_E4M3", "FP8 E4M3 weights"), "MXFP4": ("U8", "MXFP4 blocks")}
    if w.algo in expect and not c.get(expect[w.algo][0]):
        return [Finding("ckpt.dtypes", "fail", f"declared {w.algo} but no {expect[w.algo][0]} tensors in the shards",
                        detail=f"dtypes found: {c}", remedy="The quant config does not describe these weights: re-download or re-export.")]
    if w.algo.startswith(("AWQ", "GPTQ")) and not c.get("I32"):
        return [Finding("ckpt.dtypes", "fail", f"declared {w.algo} but no packed I32 qweight tensors", detail=f"dtypes found: {c}",
                        remedy="The quant config does not describe these weights.")]
    if w.algo == "unquantized" and any(k.startswith("F8") for k in c):
        return [Finding("ckpt.dtypes", "warn", "FP8 tensors in a checkpoint with no quantization config", detail=f"dtypes found: {c}",
                        remedy="SGLang will load them as if unquantized: add the checkpoint's quantization_config.")]
    return [Finding("ckpt.dtypes", "pass", f"tensor dtypes match {w.algo}", evidence=", ".join(f"{k}: {v}" for k, v in sorted(c.items())))]


def inspect(ck: Checkpoint, flags: Optional[dict[str, Any]] = None, tp: int = 1, pp: int = 1, location_note: str = "") -> QuantReport:
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

    kv.auto_resolves_to = "fp8_e4m3" if kv.honoured else a.dtype
    kv.flag = str(flags.get("kv-cache-dtype") or "auto")
    if kv.flag not in KV_CHOICES:
        findings.append(Finding("kv.flag", "fail", f"--kv-cache-dtype {kv.flag} is not a choice SGLang {SGLANG_VERSION} accepts",
                                remedy=f"Use one of {', '.join(KV_CHOICES)}."))
    kv.effective = _norm_kv(kv.flag, kv.auto_resolves_to)
    kv.kv_layers = len(a.kv_layer_ids)
    qpp = flags.get("quantization-param-path")
    if ck.has_weights:
        per_layer, kv.scale_tensor_names = scale_tensors(list(ck.weight_map), a.kv_layer_ids, a.num_layers)
        kv.layers_with_scales = len(per_layer)
        kv.scale_coverage = ("all" if kv.layers_with_scales == kv.kv_layers else "some" if kv.layers_with_scales else "none")
    if qpp:
        kv.scale_coverage = "file"

    findings += _weights_findings(w, a, tp, pp, ck, location_note)
    findings += _dtype_findings(ck, w)
    findings += _kv_findings(kv, a, qpp, ck)
    rec = _recommend(w, kv)
    findings += _flag_findings(flags, rec, w)
    ckinfo = {"dir": str(ck.dir), "complete": ck.complete, "has_weights": ck.has_weights, "shards": len(ck.shards),
              "tensors": len(ck.weight_map), "bytes_read": ck.bytes_read, "architecture": a.architecture, "note": location_note}
    return QuantReport(ckinfo, w, kv, rec, findings, (ck, location_note))


def _weights_findings(w: Weights, a: arch_mod.Arch, tp: int, pp: int, ck: Checkpoint, note: str) -> list[Finding]:
    out = []
    who = " ".join(x for x in (w.producer, w.producer_version) if x) or "unknown producer"
    size = f", group {w.group_size}" if w.group_size else (f", block {w.block_size}" if w.block_size else "")
    out.append(Finding("quant.weights", "info", f"weights: {w.algo}{size} ({who})",
                       detail=(f"read from {w.source}; " if w.source else "no quantization config; ") +
                              (f"kept in higher precision: {', '.join(w.kept_precision_kinds)}" if w.kept_precision_kinds else "no excluded modules listed"),
                       evidence=f"{len(w.excluded_modules)} exclude/ignore pattern(s)" + (f", e.g. {w.excluded_modules[:3]}" if w.excluded_modules else "")))
    if w.total_bytes:
        assert w.bytes_per_gpu is not None  # set from total_bytes in inspect()
        out.append(Finding("quant.weight_bytes", "info", f"weights: {w.total_bytes / GIB:.1f} GiB in total, ~{w.bytes_per_gpu / GIB:.1f} GiB per GPU at TP {tp} × PP {pp}",
                           detail="Per GPU = total / (TP × PP): an even split; replicated norms and router weights add a little.",
                           evidence=f"{INDEX} total_size" if (ck.index or {}).get("metadata", {}).get("total_size") else "sum over shard headers"))
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
    out.append(Finding("kv.auto", "info", f"--kv-cache-dtype auto resolves to {kv.auto_resolves_to}",
                       detail=f"{decl}; " + ("SGLang follows it" if kv.honoured else
                               ("SGLang ignores it (only a static per-tensor FP8 scheme counts), " if kv.declared else "") + "so auto means the model dtype") + f". {layers}."))
    if kv.effective in FP8_KV:
        n, total = kv.layers_with_scales, kv.kv_layers
        if kv.scale_coverage == "file":
            out.append(Finding("kv.fp8_scales", "warn", f"FP8 KV cache ({kv.effective}) with scales from --quantization-param-path",
                               detail="Check the file was calibrated on this model; FP8 still trades long-context accuracy for capacity.",
                               evidence=str(qpp), remedy="Measure with the accuracy notebook; `--kv-cache-dtype bf16` if capacity allows."))
        elif kv.scale_coverage == "unknown":
            out.append(Finding("kv.fp8_scales", "warn", f"FP8 KV cache ({kv.effective}); its k/v scales cannot be checked here",
                               detail="No index or shards on this machine. Without calibrated scales SGLang uses 1.0 and clips values beyond ±448.",
                               remedy="Run this on the checkpoint's host, or set `--kv-cache-dtype bf16` (serving.flags.kv-cache-dtype: bf16)."))
        elif kv.scale_coverage == "none":
            out.append(Finding("kv.fp8_scales", "fail", f"FP8 KV cache with no calibrated scales: SGLang uses 1.0 on all {total} KV layers",
                               detail="Keys and values beyond ±448 are clipped and small ones lose precision; errors compound over long contexts. "
                                      f"Under `auto`, SGLang {SGLANG_VERSION} logs nothing about it.",
                               evidence=f"no *.k_scale / *.v_scale / *.kv_scale / *.k_proj.output_scale tensors in {INDEX if ck.index else 'the shards'}",
                               remedy="`--kv-cache-dtype bf16` (check capacity in the KV notebook), or calibrated scales via `--quantization-param-path`."))
        elif kv.scale_coverage == "some":
            assert n is not None  # "some" is only set after counting layers_with_scales
            out.append(Finding("kv.fp8_scales", "fail", f"k/v scales on only {n} of {total} KV layers: the other {total - n} use 1.0",
                               evidence=", ".join(kv.scale_tensor_names),
                               remedy="`--kv-cache-dtype bf16`, or a complete calibration via `--quantization-param-path`."))
        else:
            out.append(Finding("kv.fp8_scales", "warn", f"FP8 KV cache with calibrated scales on all {total} KV layers",
                               detail="Half the bytes of BF16, at a long-context accuracy cost (2-3 mantissa bits). Measure it before relying on it for agentic coding.",
                               evidence=", ".join(kv.scale_tensor_names),
                               remedy="Compare FP8 and BF16 with the accuracy notebook; choose `--kv-cache-dtype bf16` if the KV notebook shows room."))
    elif kv.effective in FP4_KV or kv.effective == "mxfp8":
        out.append(Finding("kv.fp4", "warn", f"{kv.effective} KV cache: SGLang warns it may drop accuracy",
                           detail="Needs Blackwell (SM100/SM120); per-token dequantisation adds work.",
                           remedy="Measure with the accuracy notebook before production."))
    else:
        over = f" — overrides the checkpoint's {kv.declared} declaration" if kv.declared and kv.flag != "auto" else ""
        out.append(Finding("kv.fp8_scales", "pass", f"KV cache in {kv.effective}{over}",
                           detail="No KV quantization error; twice the bytes per token of FP8." if kv.declared else ""))
    if kv.flag == "fp8_e4m3" and not qpp:
        truth = {"all": "misleading here: the checkpoint's own scales are loaded anyway",
                 "some": "partly true: layers without checkpoint scales use 1.0",
                 "none": "true here: there are no scales", "unknown": "scales cannot be checked here"}[kv.scale_coverage]
        out.append(Finding("kv.log_warning", "info", "SGLang will log \"Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.\"",
                           detail=f"It does so for an explicit --kv-cache-dtype fp8_e4m3 without --quantization-param-path, whatever the checkpoint holds — {truth}."))
    return out


def _recommend(w: Weights, kv: KVCache) -> dict[str, str]:
    rec: dict[str, str] = {}
    q = _QUANT_FLAG.get((w.quant_method or "", w.algo if w.quant_method == "modelopt" else None))
    if q:
        rec["quantization"] = q
    if kv.auto_resolves_to in FP8_KV and kv.scale_coverage in ("none", "some", "unknown"):
        rec["kv-cache-dtype"] = "bf16"
    else:
        rec["kv-cache-dtype"] = "auto"
    return rec


def _flag_findings(flags: dict[str, Any], rec: dict[str, str], w: Weights) -> list[Finding]:
    out = []
    have, want = flags.get("quantization"), rec.get("quantization")
    if have and want and have != want and (have, want) not in _FLAG_ALIASES:
        out.append(Finding("quant.flag", "warn", f"--quantization {have} but the checkpoint is {w.algo} ({w.quant_method})",
                           remedy=f"Use --quantization {want} (or omit it: SGLang detects the checkpoint's method)."))
    elif have and want:
        out.append(Finding("quant.flag", "pass", f"--quantization {have} matches the checkpoint ({w.algo})"))
    if rec.get("kv-cache-dtype") == "bf16" and str(flags.get("kv-cache-dtype", "auto")) in ("auto", *FP8_KV):
        out.append(Finding("quant.recommend", "warn", "recommended: --kv-cache-dtype bf16",
                           detail="The spec's setting keeps an FP8 KV cache whose scales are missing or unverifiable.",
                           remedy="Set serving.flags.kv-cache-dtype: bf16 (or serving.apply_recommended: true) after checking capacity."))
    return out


def for_deployment(spec: Deployment, model_dir: Optional[str] = None) -> QuantReport:
    """Inspect the deployment's checkpoint (or model_dir) under the spec's flags and parallelism."""
    from runbook.model import checkpoint
    from runbook.model import location as modeldir

    if model_dir:
        ck, note = checkpoint.load(model_dir), ""
    else:
        loc = modeldir.locate(spec)
        if loc.path is None:
            raise InputError(f"{spec.source}: model.path: {loc.note}; add model.card or download the checkpoint")
        ck, note = checkpoint.load(loc.path), (loc.note if loc.kind == "card" else "")
    rep = inspect(ck, spec.serving.flags, spec.parallelism.tp, spec.parallelism.pp, note)
    if note:
        rep.findings.insert(0, Finding("quant.source", "info", "inspecting the model card, not the checkpoint", detail=note))
    return rep
