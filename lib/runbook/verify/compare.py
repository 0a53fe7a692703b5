"""Predicted (20_kv_memory's figures for the unit) against observed (the log, /server_info): rows and findings."""
from __future__ import annotations

from typing import Any

from runbook.core import registry
from runbook.core.findings import Finding, Status
from runbook.core.units import GIB
from runbook.model import sglang_names
from runbook.verify import replan
from runbook.verify.logparse import Facts, kv_dtype_name

KEYS = ("kv_dtype", "max_total_num_tokens", "max_running_requests", "context_len", "weights_gib_per_gpu",
        "avail_mem_gib_after_start", "max_state_slots")
WARN_SHORT, FAIL_SHORT = 0.02, 0.10   # token pool below the plan by more than this: warn, fail


def _dtype(v: Any) -> str | None:
    if v in (None, "", "auto"):
        return None
    return kv_dtype_name(str(v).lower())


def predicted(result: Any, reserved_note: bool = True) -> dict[str, Any]:
    """From kv.assess(spec).result: the same figures `runbook kv` prints."""
    w = result.weights_bytes_per_gpu
    reserved = result.reserved_bytes_per_gpu
    return {"kv_dtype": result.kv_dtype, "max_total_num_tokens": result.max_total_num_tokens,
            "max_running_requests": result.max_running_requests, "context_len": result.context_len,
            "weights_gib_per_gpu": round(w / GIB, 2) if w else None,
            # 1 − mem_fraction_static of the GPU: what is left before CUDA graphs and activations take their share
            "avail_mem_gib_after_start": round(reserved / GIB, 2) if reserved else None,
            "max_state_slots": result.max_state_slots}


def observed(facts: Facts) -> dict[str, Any]:
    kv = facts.rank0(facts.kv)     # the target's pool: with speculative decoding the draft's is logged after it
    w = facts.rank0(facts.weights)
    s = facts.scheduler or {}
    mamba = facts.rank0(facts.mamba) or {}
    return {"kv_dtype": facts.kv_dtype(),
            "max_total_num_tokens": s.get("max_total_num_tokens", kv["tokens"] if kv else None),
            "max_running_requests": s.get("max_running_requests"), "context_len": s.get("context_len"),
            "weights_gib_per_gpu": w["usage_gib"] if w else None,
            "avail_mem_gib_after_start": s.get("available_gpu_mem_gib"), "max_state_slots": mamba.get("max_mamba_cache_size")}


def bytes_per_token(facts: Facts, draft: bool = False) -> int | None:
    """The target pool's (or the draft pool's) bytes per token on rank 0; before 0.4.6 the pool line has no
    token count and the scheduler's is used."""
    kv = facts.rank0(facts.kv_draft if draft else facts.kv)
    tokens = (kv or {}).get("tokens") or (facts.scheduler or {}).get("max_total_num_tokens")
    if not kv or not tokens or not kv["size_gib"]:
        return None
    return round(kv["size_gib"] * GIB / tokens)   # sizes are logged with 2 decimals: approximate


def _causes(pred: dict[str, Any], obs: dict[str, Any], facts: Facts, unit_flags: dict[str, Any], gpu_mem_gib: float | None,
            plan_frac: float | None, replanned: dict[str, Any] | None = None) -> list[str]:
    out = []
    _, words = replan.verdict(replanned, pred.get("weights_gib_per_gpu"), obs.get("max_total_num_tokens"),
                              pred.get("max_total_num_tokens"))
    if words:
        out.append(words)
    ow, pw = obs.get("weights_gib_per_gpu"), pred.get("weights_gib_per_gpu")
    if ow and pw and ow > pw * 1.03:
        out.append(f"weights take {obs['weights_gib_per_gpu']:.2f} GiB per GPU, the plan {pred['weights_gib_per_gpu']:.2f}")
    w = facts.rank0(facts.weights)
    if w and gpu_mem_gib and not words and w.get("usage_gib") is not None:
        seen = w["avail_gib"] + w["usage_gib"]   # free memory before the weights loaded
        if seen < gpu_mem_gib * 0.95:
            out.append(f"only {seen:.1f} of {gpu_mem_gib:g} GiB were free before the weights loaded: another process holds GPU memory "
                       f"(nvidia-smi; {registry.notebook('environment')} lists the processes)")
    frac = unit_flags.get("mem-fraction-static")
    if frac is not None and plan_frac is not None and abs(float(frac) - float(plan_frac)) > 1e-6:
        out.append(f"the unit's --mem-fraction-static {frac} is not the plan's {plan_frac}")
    elif frac is None:
        out.append("--mem-fraction-static is unset: SGLang's heuristic picked the fraction")
    if not words and any(g["mem_gib"] is not None for g in facts.graphs):   # a re-plan that explains the pool says it all
        mem = max(g["mem_gib"] or 0.0 for g in facts.graphs)
        out.append(f"CUDA graphs took {mem:.2f} GiB (largest capture); post-capture sizing or a larger --cuda-graph-max-bs-decode "
                   "shrinks the pool")
    return out or ["mem-fraction, CUDA-graph memory, or another process on the GPU"]


def compare(pred: dict[str, Any], obs: dict[str, Any], facts: Facts, unit_flags: dict[str, Any], where: str = "log",
            gpu_mem_gib: float | None = None, plan_frac: float | None = None,
            id_prefix: str = "verify", replanned: dict[str, Any] | None = None) -> list[Finding]:
    """Token pool and state pool vs plan (warn > 2 % short, fail > 10 %), KV dtype and context length vs the unit (fail)."""
    out: list[Finding] = []
    want_dtype = _dtype(unit_flags.get("kv-cache-dtype")) or _dtype(pred.get("kv_dtype"))
    have_dtype = _dtype(obs.get("kv_dtype"))
    if have_dtype is None and want_dtype is not None and where == "log" and (facts.kv or facts.kv_labelled or facts.kv_unparsed):
        out.append(_dtype_unread(facts, want_dtype))
    if have_dtype is not None and want_dtype is not None:
        # the log prints the pool's torch dtype only: mxfp8 is float8_e4m3fn there, fp4_mx_block16 float4_e2m1fn_x2
        ok = have_dtype == want_dtype or (where == "log" and sglang_names.same_kv_storage(have_dtype, want_dtype))
        out.append(Finding(f"{id_prefix}.kv_dtype", "pass" if ok else "fail",
                           f"KV cache dtype {have_dtype} ({where})" + ("" if ok else f", the unit asks for {want_dtype}"),
                           remedy="" if ok else "The server is not running the unit: restart it from the rendered unit "
                                                "(`service install --yes`), and check --kv-cache-dtype in the spec."))
    want_ctx = unit_flags.get("context-length") or pred.get("context_len")
    if obs.get("context_len") is not None and want_ctx is not None:
        ok = int(obs["context_len"]) == int(want_ctx)
        out.append(Finding(f"{id_prefix}.context_len", "pass" if ok else "fail",
                           f"context length {int(obs['context_len']):,} ({where})"
                           + ("" if ok else f", the unit asks for {int(want_ctx):,}"),
                           remedy="" if ok else "The server runs another --context-length than the unit: restart "
                                                "it from the rendered unit."))
    p, o = pred.get("max_total_num_tokens"), obs.get("max_total_num_tokens")
    if p and o is not None:
        short = (p - o) / p
        status: Status = "fail" if short > FAIL_SHORT else "warn" if short > WARN_SHORT else "pass"
        title = f"KV pool {o:,} tokens ({where}), plan {p:,}: " + _off(short)
        detail = ""
        remedy = ""
        verdict, words = replan.verdict(replanned, pred.get("weights_gib_per_gpu"), o, p) if replanned else ("", "")
        if status != "pass" and replanned and replanned.get("cpu") and verdict == "agrees":
            # on CPU the host's free memory moves under a starting server: the re-plan from its log is the check
            status, detail = "pass", words
        elif status != "pass":
            detail = "likely causes: " + "; ".join(_causes(pred, obs, facts, unit_flags, gpu_mem_gib, plan_frac, replanned))
            remedy = ("Free the GPU of other processes, set --mem-fraction-static in the spec, or re-plan in "
                      f"{registry.notebook('kv_memory')} with the "
                      "observed weights (--weights-gib); check the requests that fit at your context length.")
        out.append(Finding(f"{id_prefix}.tokens", status, title, detail=detail, remedy=remedy))
    out += _state_slots(pred, obs, where, id_prefix)
    p, o = pred.get("max_running_requests"), obs.get("max_running_requests")
    if p and o is not None:
        low = (p - o) / p
        out.append(Finding(f"{id_prefix}.max_running_requests", "warn" if low > FAIL_SHORT else "pass",
                           f"max_running_requests {o} ({where}), plan {p}",
                           remedy="" if low <= FAIL_SHORT else "Fewer requests run at once than planned: see the token pool finding."))
    return out


def log_findings(pred: dict[str, Any], obs: dict[str, Any], facts: Facts, qpp: str | None = None,
                 checkpoint_kv: Any = None) -> list[Finding]:
    """Weights, headroom, the FP8 KV scales and the warnings SGLang logged. `qpp`: the unit's
    --quantization-param-path; `checkpoint_kv`: stage 10's reading of the checkpoint (quant.declared.KVCache)."""
    out: list[Finding] = []
    pw, ow = pred.get("weights_gib_per_gpu"), obs.get("weights_gib_per_gpu")
    if ow is not None:
        big = pw is not None and pw > 0 and ow > pw * 1.10
        out.append(Finding("verify.weights", "warn" if big else "info",
                           f"weights {ow:.2f} GiB per GPU" + (f", plan {pw:.2f}" if pw else ""),
                           detail="the plan's figure is the checkpoint's size / GPUs (or the spec's model.size_gib estimate)",
                           remedy="Re-plan with `runbook kv --weights-gib " + f"{ow:.2f}`." if big else ""))
    avail = obs.get("avail_mem_gib_after_start")
    if avail is not None:
        low = avail < 1.0
        out.append(Finding("verify.headroom", "warn" if low else "info", f"{avail:.2f} GiB free per GPU after start-up",
                           detail="activations of long prefills and sampling need this room",
                           remedy="Lower --mem-fraction-static a little (e.g. by 0.02) or --chunked-prefill-size." if low else ""))
    w = facts.warnings
    logged = w.get("fp8_kv_no_scales")
    if facts.kv or logged:   # SGLang logs that line only when the resolved dtype is fp8_e4m3
        out.append(fp8_scales(_dtype(obs.get("kv_dtype")) or ("fp8_e4m3" if logged else None), qpp, checkpoint_kv, logged))
    moe = w.get("moe_default_config")
    if moe:
        path = moe.groups[0][0] if moe.groups and moe.groups[0] else ""
        out.append(Finding("verify.moe_config", "warn", "SGLang uses its default MoE kernel config: no tuned config for this GPU",
                           detail=f"config file not found: {path}" if path else "", evidence=moe.lines[0],
                           remedy="Tune one for this GPU and shape with SGLang's benchmark/kernels/fused_moe_triton tuner and put "
                                  "it where the line says; until then MoE layers run with generic tiles."))
    ca = w.get("custom_allreduce_disabled")
    if ca:
        out.append(Finding("verify.custom_allreduce", "warn", "custom all-reduce is disabled: NCCL does every all-reduce",
                           detail=ca.groups[0][1] if ca.groups else "", evidence=ca.lines[0],
                           remedy="Expected on more than two PCIe-only GPUs; pass --disable-custom-all-reduce to say so, and keep "
                                  f"NCCL_P2P_LEVEL right for the topology ({registry.notebook('environment')})."))
    out += load_findings(facts)
    oomg = w.get("oom_graph_capture")
    if oomg:
        out.append(Finding("verify.oom_graph_capture", "fail", "out of memory while capturing CUDA graphs: the KV pool took their room",
                           evidence=oomg.lines[0],
                           remedy="Lower --mem-fraction-static (e.g. by 0.03) so graphs and activations fit, or lower "
                                  "--cuda-graph-max-bs-decode (SGLang's own advice); re-plan the pool in "
                                  f"{registry.notebook('kv_memory')}."))
    oom = w.get("oom")
    if oom and not oomg:
        out.append(Finding("verify.oom", "fail", f"CUDA out of memory ({oom.count}×)", evidence=oom.lines[0],
                           remedy="Lower --mem-fraction-static or --chunked-prefill-size; look for another process on the GPU."))
    nem = w.get("not_enough_memory")
    if nem:
        out.append(Finding("verify.not_enough_memory", "fail", "SGLang found no memory for the KV pool and refused to start",
                           evidence=nem.lines[0], remedy="Raise --mem-fraction-static, or more GPUs (TP) so the weights per GPU shrink."))
    gcf = w.get("graph_capture_failed")
    if gcf and not oomg:
        out.append(Finding("verify.graph_capture", "fail", "CUDA-graph capture failed", evidence=gcf.lines[0],
                           remedy="Read the line; SGLang suggests a smaller --cuda-graph-max-bs-decode or another attention backend."))
    jit = w.get("deepgemm_jit")
    if jit:
        out.append(Finding("verify.jit_compile", "warn", f"DeepGEMM JIT-compiled {jit.count} kernel shapes at start-up",
                           evidence=jit.lines[0],
                           remedy="Precompile once (`python3 -m sglang.compile_deep_gemm` with the unit's flags) and keep "
                                  "SGLANG_DG_CACHE_DIR on persistent disk, so a restart does not recompile."))
    return out


def fp8_scales(kv_dtype: str | None, qpp: str | None, checkpoint_kv: Any, logged: Any) -> Finding:
    """The FP8 KV cache's scales from three facts: the resolved KV dtype, --quantization-param-path and whether the
    checkpoint carries k/v scales. SGLang's "no scaling factors" line is evidence only: 0.5.23 prints it for
    fp8_e4m3 whenever the path is unset, even when the checkpoint's scales load (SGLang issue 31224), and never for
    fp8_e5m2 (model_runner_components/load_model_utils.py:118-141)."""
    line = logged.lines[0] if logged else ""
    if kv_dtype not in sglang_names.FP8_KV:
        return Finding("verify.fp8_kv_scales", "pass", f"KV cache in {kv_dtype or 'an unread dtype'}: no FP8 scales involved",
                       evidence=line)
    cov = getattr(checkpoint_kv, "scale_coverage", "unknown")
    total, n = getattr(checkpoint_kv, "kv_layers", 0), getattr(checkpoint_kv, "layers_with_scales", None)
    said = (f"SGLang's \"no scaling factors\" line {'was' if line else 'was not'} logged; it says nothing about the "
            "checkpoint (printed for fp8_e4m3 whenever --quantization-param-path is unset, never for fp8_e5m2)")
    bf16 = f"--kv-cache-dtype bf16 ({registry.notebook('quant_config')}'s recommendation)"
    if qpp:
        return Finding("verify.fp8_kv_scales", "warn", f"{kv_dtype} KV cache with scales from --quantization-param-path",
                       detail="SGLang 0.5.23's triton and flashinfer backends scale on write but not on read with this "
                              "route (SGLang issue 18818); fa3 applies it both ways",
                       evidence=str(qpp), remedy=f"Checkpoint k/v scales, or {bf16}; measure with the accuracy stage.")
    if cov == "all":
        return Finding("verify.fp8_kv_scales", "pass", f"{kv_dtype} KV cache with the checkpoint's k/v scales on all {total} KV layers",
                       detail=said, evidence=line or ", ".join(checkpoint_kv.scale_tensor_names[:3]))
    if cov == "some":
        return Finding("verify.fp8_kv_scales", "fail", f"{kv_dtype} KV cache: k/v scales on only {n} of {total} KV layers, "
                       f"the other {total - (n or 0)} use 1.0", detail=said, evidence=line or ", ".join(checkpoint_kv.scale_tensor_names),
                       remedy=f"{bf16}, or a complete calibration.")
    if cov == "none":
        return Finding("verify.fp8_kv_scales", "fail", f"{kv_dtype} KV cache without scaling factors: SGLang uses 1.0 on all "
                       f"{total} KV layers", detail="the checkpoint carries no k_scale/v_scale tensors and no "
                       "--quantization-param-path is set: values outside FP8's range are clipped and small ones lose "
                       f"precision in every attention layer; {said}", evidence=line or "no k/v scale tensors in the checkpoint",
                       remedy=f"{bf16}, or a checkpoint with calibrated k/v scales.")
    return Finding("verify.fp8_kv_scales", "warn", f"{kv_dtype} KV cache: whether the checkpoint carries k/v scales cannot be "
                   "read here", detail=said, evidence=line,
                   remedy="Run verify where the checkpoint's index or shards are (model.path), or set " + bf16 + ".")


def load_findings(facts: Facts) -> list[Finding]:
    """What SGLang logged under load: retractions when the KV pool filled, the pool's own out-of-memory lines,
    requests aborted under memory pressure, no request slot left, a pool below one request at the context length."""
    out: list[Finding] = []
    w = facts.warnings
    rt = w.get("retraction")
    if rt:
        reqs = sum(int(g[0]) for g in rt.groups if g and g[0].isdigit())
        out.append(Finding("verify.retraction", "warn", f"the KV pool filled up {rt.count}× and SGLang retracted running requests",
                           detail=f"{reqs} requests retracted in the first {len(rt.groups)} events", evidence=rt.lines[0],
                           remedy="Fewer long requests at once (--max-running-requests), a larger pool (BF16 → FP8 only with "
                                  "scales, more memory), or a shorter --context-length; retraction recomputes their prefill."))
    small = w.get("pool_below_context")
    if small:
        tokens, ctx = small.groups[0] if small.groups else ("?", "?")
        out.append(Finding("verify.pool_below_context", "warn", f"the KV pool ({tokens} tokens) holds less than one request "
                           f"at the context length ({ctx})", evidence=small.lines[0],
                           detail="SGLang refuses or truncates the longest requests; under load it queues and retracts early",
                           remedy="A larger pool (--mem-fraction-static, --max-total-tokens) or a shorter --context-length "
                                  "(SGLang's own advice)."))
    pool = w.get("kv_pool_oom")
    if pool:
        phases = sorted({(g[0] or "").lower() for g in pool.groups if g} - {""})
        out.append(Finding("verify.kv_pool_oom", "fail", f"the KV pool had no room for a batch ({pool.count}×"
                           + (f", {' and '.join(phases)}" if phases else "") + "): SGLang's scheduler raises on it",
                           evidence=pool.lines[0],
                           remedy="A larger pool (--mem-fraction-static, --max-total-tokens) or less admitted at once "
                                  "(--max-running-requests, --chunked-prefill-size, a higher --schedule-conservativeness); "
                                  f"re-plan it in {registry.notebook('kv_memory')}."))
    abort = w.get("oom_abort")
    if abort:
        out.append(Finding("verify.oom_abort", "warn", f"SGLang aborted {abort.count} requests under KV memory pressure",
                           detail="retract_decode aborts a request it cannot retract, or the last one when even it alone "
                                  "does not fit; the client gets an error instead of an answer",
                           evidence=abort.lines[0],
                           remedy="A larger KV pool, shorter --context-length or fewer long requests at once "
                                  "(--max-running-requests)."))
    slots = w.get("req_slots_oom")
    if slots:
        out.append(Finding("verify.req_slots_oom", "fail", "SGLang ran out of request slots", evidence=slots.lines[0],
                           remedy="Set a smaller --max-running-requests (SGLang's own advice)."))
    return out


def _off(short: float) -> str:
    return f"{short:.1%} below the plan" if short > 0 else f"{-short:.1%} above the plan" if short < 0 else "as planned"


def _dtype_unread(facts: Facts, want: str) -> Finding:
    """The pool's dtype could not be read: say so (the dtype check is not done), never a silent gap."""
    if facts.kv_unparsed:
        return Finding("verify.kv_dtype", "warn", f"KV cache dtype not checked: a KV pool line was not understood (the unit asks "
                                                  f"for {want})", evidence=facts.kv_unparsed[0],
                       detail="this SGLang logs its pool in a form this runbook does not read; the dtype, the pool's size and "
                              "bytes per token are not compared",
                       remedy="Compare the line with --kv-cache-dtype by eye, and report the line (with the SGLang version) "
                              "so the parser learns it; /server_info (--url) names the resolved dtype.")
    return Finding("verify.kv_dtype", "skip", f"KV cache dtype not in the log (the unit asks for {want})",
                   detail="SGLang before 0.5.3 logs the pool without its dtype, and 0.5.3–0.5.12 in a separate `Using KV cache "
                          "dtype:` line on rank 0, missing here",
                   remedy="Give --url so /server_info's kv_cache_dtype is compared, or read a log that holds rank 0's lines.")


def _state_slots(pred: dict[str, Any], obs: dict[str, Any], where: str, id_prefix: str) -> list[Finding]:
    """The hybrid model's state pool (mamba cache slots), like the token pool."""
    p, o = pred.get("max_state_slots"), obs.get("max_state_slots")
    if not p or o is None:
        return []
    short = (p - o) / p
    status: Status = "fail" if short > FAIL_SHORT else "warn" if short > WARN_SHORT else "pass"
    return [Finding(f"{id_prefix}.state_slots", status,
                    f"state pool {o:,} slots ({where}), plan {p:,}: " + _off(short),
                    detail="the linear-attention state pool (SGLang's max_mamba_cache_size) caps the requests that run at once",
                    remedy="" if status == "pass" else
                    "See the token pool finding: the state pool shares the same budget (--mamba-full-memory-ratio splits it); "
                    f"re-plan in {registry.notebook('kv_memory')} with the observed weights.")]


def pool_findings(pred_bpt: dict[str, int | None], facts: Facts) -> list[Finding]:
    """A pool line not understood (warn, naming it) and, with speculative decoding, the draft pool beside the target's."""
    out: list[Finding] = []
    if facts.kv_unparsed and facts.kv:   # without an understood pool, verify.kv_dtype names the line
        out.append(Finding("verify.kv_line", "warn", f"{len(facts.kv_unparsed)} KV pool line(s) not understood",
                           evidence=facts.kv_unparsed[0],
                           detail="the pool's dtype, token count and size from this line are not compared with the plan",
                           remedy="Report the line with the SGLang version; until then read it by eye against the plan."))
    draft = facts.rank0(facts.kv_draft)
    if draft:
        t_bpt, d_bpt = bytes_per_token(facts), bytes_per_token(facts, draft=True)
        plan_d = pred_bpt.get("draft")
        off = plan_d is not None and d_bpt is not None and abs(d_bpt - plan_d) > 0.10 * max(plan_d, d_bpt)
        out.append(Finding("verify.draft_pool", "warn" if off else "info",
                           f"speculative decoding: draft KV pool {draft['tokens'] or 0:,} tokens, {draft['size_gib']:.2f} GiB "
                           f"({d_bpt or 0:,} bytes/token); target pool {t_bpt or 0:,} bytes/token"
                           + (f"; the plan's draft {plan_d:,} bytes/token" if plan_d is not None else ""),
                           detail="each rank logs the target pool and then the draft pool with the same token count; the plan is "
                                  "compared with the target pool",
                           remedy=f"The plan's draft KV differs from SGLang's: re-plan in {registry.notebook('kv_memory')} "
                                  "and trust the log's figure." if off else ""))
    return out
