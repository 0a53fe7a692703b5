"""Stage 10's analysis of one checkpoint: what SGLang 0.5.23 will do with its weight and KV-cache
quantization, decided from the files alone. `inspect_checkpoint` reads what the files declare (declared.py), follows
SGLang's own decision under the deployment's flags (sglang_rules.py) and turns both into findings
(findings.py). The costliest risk, an FP8 KV cache with no calibrated scales (SGLang then silently uses
1.0), is a fail finding with its remedy."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runbook.core import SGLANG_VERSION
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.model import arch as arch_mod
from runbook.model import checkpoint
from runbook.model.checkpoint import Checkpoint
from runbook.model.sglang_names import FP8_KV, KV_CACHE_DTYPE_CHOICES
from runbook.quant.declared import KVCache, Weights, kept_precision_kinds, parse_declared, scale_tensors
from runbook.quant.findings import (
    dtype_findings,
    flag_findings,
    kv_findings,
    recommend,
    refusal_findings,
    source_findings,
    weights_findings,
)
from runbook.quant.sglang_rules import capability_check, effective_kv_dtype, sglang_auto_kv, sglang_view, side_file_view


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


def inspect_checkpoint(ck: Checkpoint, flags: dict[str, Any] | None = None, tp: int = 1, pp: int = 1, location_note: str = "",
                       compute_capability: str | None = None) -> QuantReport:
    """Inspect a loaded checkpoint against a deployment's SGLang flags and parallelism."""
    flags = dict(flags or {})
    findings: list[Finding] = list(ck.problems)
    w, kv = Weights(), KVCache()
    parse_declared(ck, w, kv, findings)
    try:
        a = arch_mod.from_config(ck.config, str(ck.dir / "config.json"))
    except InputError as e:
        raise InputError(str(e)) from None
    w.kept_precision_kinds = kept_precision_kinds(w.excluded_modules)
    w.dtype_counts = ck.dtype_counts()
    w.total_bytes = ck.total_bytes
    w.bytes_per_gpu = w.total_bytes // (tp * pp) if w.total_bytes else None

    user_q = str(flags["quantization"]) if flags.get("quantization") else None
    cc = compute_capability
    auto_view = capability_check(sglang_view(ck, None, a.dtype), cc)
    view = capability_check(sglang_view(ck, user_q, a.dtype), cc) if user_q else auto_view
    side = side_file_view(ck, auto_view, a.dtype)
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
    if kv.flag not in KV_CACHE_DTYPE_CHOICES:
        findings.append(Finding("quant.kv.flag", "fail", f"--kv-cache-dtype {kv.flag} is not a choice SGLang {SGLANG_VERSION} accepts",
                                remedy=f"Use one of {', '.join(KV_CACHE_DTYPE_CHOICES)}."))
    kv.effective = effective_kv_dtype(kv.flag, kv.auto_resolves_to)
    kv.kv_layers = len(a.kv_layer_ids)
    qpp = flags.get("quantization-param-path")
    if ck.has_weights:
        per_layer, kv.scale_tensor_names = scale_tensors(list(ck.weight_map), a.kv_layer_ids, a.num_layers, a.mla)
        kv.layers_with_scales = len(per_layer)
        kv.scale_coverage = ("all" if kv.layers_with_scales == kv.kv_layers else "some" if kv.layers_with_scales else "none")
    if qpp:
        kv.scale_coverage = "file"

    findings += weights_findings(w, a, tp, pp, ck, location_note)
    findings += dtype_findings(ck, w)
    findings += kv_findings(kv, a, qpp, ck)
    rec = recommend(w, kv, auto_view, side)
    findings += refusal_findings(ck, w, auto_view, view, side, user_q)
    findings += source_findings(ck, auto_view)
    findings += flag_findings(flags, rec, w, view, auto_view)
    ckinfo = {"dir": str(ck.dir), "complete": ck.complete, "has_weights": ck.has_weights, "shards": len(ck.shards),
              "tensors": len(ck.weight_map), "bytes_read": ck.bytes_read, "architecture": a.architecture, "note": location_note}
    return QuantReport(ckinfo, w, kv, rec, findings, (ck, location_note))


def assess(spec: Deployment, model_dir: str | None = None) -> QuantReport:
    """Inspect the deployment's checkpoint (or model_dir) under the spec's flags and parallelism."""
    ck, note = checkpoint.for_spec(spec, model_dir)
    rep = inspect_checkpoint(ck, spec.serving.flags, spec.parallelism.tp, spec.parallelism.pp, note, spec.hardware.compute_capability)
    rep.loaded = (ck, note)
    if note:
        rep.findings.insert(0, Finding("quant.source", "info", "inspecting the model card, not the checkpoint", detail=note))
    return rep
