"""Stage 10's findings, one builder per concern: the weights and their tensor dtypes, the KV cache and its
scales, SGLang's refusals, the two config files SGLang may read, and the spec's --quantization; and the flags
the stage recommends."""
from __future__ import annotations

from typing import Any

from runbook.core import SGLANG_VERSION
from runbook.core.findings import Finding
from runbook.core.units import GIB
from runbook.model import arch as arch_mod
from runbook.model.checkpoint import INDEX, Checkpoint
from runbook.model.sglang_names import FP4_KV, FP8_KV
from runbook.quant.declared import KVCache, Weights
from runbook.quant.sglang_rules import SGLangView, modelopt_section, parse_modelopt


def dtype_findings(ck: Checkpoint, w: Weights) -> list[Finding]:
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



def weights_findings(w: Weights, a: arch_mod.Arch, tp: int, pp: int, ck: Checkpoint, note: str) -> list[Finding]:
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
        assert w.bytes_per_gpu is not None  # set from total_bytes in inspect_checkpoint()
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


def kv_findings(kv: KVCache, a: arch_mod.Arch, qpp: Any, ck: Checkpoint) -> list[Finding]:
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



def recommend(w: Weights, kv: KVCache, auto_view: SGLangView, side: SGLangView | None) -> dict[str, str]:
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


def refusal_findings(ck: Checkpoint, w: Weights, auto_view: SGLangView, view: SGLangView, side: SGLangView | None,
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
        return out  # the flag is the cause: reported by flag_findings as quant.flag
    building = {"model_config": "model config", "quant_config": "quantization config"}.get(r.stage, "attention layers")
    out.append(Finding("quant.refused", "fail", f"SGLang {SGLANG_VERSION} refuses to start: {r}",
                       detail=f"Raised while building the {building}"
                              f" (checkpoint quant_method {auto_view.quant_method or view.quant_method!r}).",
                       evidence=f"read from {w.source}" if w.source else "",
                       remedy=r.fix or "Use a checkpoint whose quant_method SGLang registers."))
    return out


def _hq_algo(ck: Checkpoint) -> str | None:
    sect = modelopt_section(ck.hf_quant_config) if isinstance(ck.hf_quant_config, dict) else {}
    algo = sect.get("quant_algo")
    return str(algo) if algo else None


def source_findings(ck: Checkpoint, auto_view: SGLangView) -> list[Finding]:
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
    theirs = parse_modelopt(hq) if algo != "MIXED_PRECISION" else None
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


def flag_findings(flags: dict[str, Any], rec: dict[str, str], w: Weights, view: SGLangView, auto_view: SGLangView) -> list[Finding]:
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
