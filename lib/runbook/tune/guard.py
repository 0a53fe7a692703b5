"""The accuracy guard: each candidate against the reference on the same prompts. The reference's outputs
are recorded while it runs (candidates run one at a time on one port), then each candidate's are
compared with them: greedy identity reporting where outputs first diverge (a divergence late in the
output is what batched numerics legitimately do; one before `min_identical_tokens` fails), needle recall
at the guard's lengths, and the tool-call probe. Each comparison names the difference it actually tested —
the flags, interpreter and start-up log KV dtype of the two servers — and its remedy follows from that
difference, never from a guess (an FP8 KV cache is not speculative decoding)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook import accuracy
from runbook.core.errors import InputError, RunbookError
from runbook.core.spec import Deployment
from runbook.corpus import code_prompts
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer
from runbook.tune.measure import tokenizer_dir


def _recall_lengths(spec: Deployment, context: int | None) -> list[int]:
    g = spec.tune.guard
    ls = list(g.recall_lengths or spec.accuracy.recall_lengths)
    return [n for n in ls if context is None or n <= context]


# Flags that can change greedy tokens, by what a finding calls them, in the order a remedy names them; any other
# flag that differs is named by itself.
KINDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("SGLang version", (),       # from each server's own /server_info, not a flag: an upgrade canary
     "Greedy output changed between SGLang versions: kernels and defaults change between releases. Check recall and "
     "the tool-call probe on the new version, and read its release notes, before upgrading."),
    ("KV cache dtype", ("kv-cache-dtype", "quantization-param-path"),
     "The KV cache dtype changed greedy output. An FP8 KV cache without calibrated k/v scales runs at scale 1.0 (SGLang "
     "logs \"no scaling factors provided\") and clips outliers: keep the BF16 KV cache (--kv-cache-dtype bf16, not "
     "auto on an FP8 checkpoint), or serve a checkpoint with KV scales and guard it again."),
    # llama.cpp's block-quantized KV cache types: the same difference, its own remedy
    ("KV cache dtype", ("cache-type-k", "cache-type-v"),
     "The quantized KV cache (--cache-type-k/--cache-type-v q8_0, q4_0) changed greedy output: its per-block scales "
     "round every cached key and value. Keep f16, or judge it by recall and the tool-call probe before serving it."),
    ("speculative decoding", ("speculative-", "model-draft", "spec-", "draft-"),
     "Speculative decoding changed greedy output: check the draft/verify path (dtype, backend) before enabling it."),
    ("weight dtype or quantization", ("dtype", "quantization"),
     "Weight precision differs: different greedy output is expected; judge it by recall, not identity."),
    ("radix cache", ("disable-radix-cache", "no-cache-prompt", "cache-prompt"),
     "Prefix caching must not change greedy output: report it to the engine with these prompts."),
    ("batching and chunking", ("chunked-prefill-size", "max-running-requests", "max-prefill-tokens", "schedule-policy",
                               "page-size", "batch-size", "ubatch-size", "parallel"),
     "Batch and chunk shapes change the order of reductions, and with it greedy output after a near-tie; an early "
     "divergence is worth a recall check before serving it."),
)


def _kind(flag: str) -> tuple[str, str] | None:
    for label, keys, remedy in KINDS:
        if any(flag == k or (k.endswith("-") and flag.startswith(k)) for k in keys):
            return label, remedy
    return None


def setup(spec: Deployment, observed: dict[str, Any] | None, version: str | None = None) -> dict[str, Any]:
    """What a server ran with, for naming the difference a comparison tests: its flags, interpreter, the SGLang version
    it reports (/server_info) and the KV dtype its start-up log reports (on SGLang `auto` resolves there: an FP8
    checkpoint gives an FP8 KV cache)."""
    return {"flags": {k: v for k, v in spec.serving.flags.items() if k not in ("port", "host")},
            "python": spec.serving.python if spec.tune.engine == "sglang" else None,
            "version": version, "kv_dtype": (observed or {}).get("kv_dtype")}


def differences(ref: dict[str, Any] | None, got: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """What differs between the reference's setup and the candidate's: [{what, flag, reference, candidate}], the
    ones that can change output first; None when a setup was not recorded (a run archived before it was)."""
    if not (ref and got):
        return None
    out = []
    if ref.get("kv_dtype") and got.get("kv_dtype") and ref["kv_dtype"] != got["kv_dtype"]:
        out.append({"what": "KV cache dtype", "flag": "kv_dtype", "reference": ref["kv_dtype"], "candidate": got["kv_dtype"]})
    if ref.get("version") and got.get("version") and ref["version"] != got["version"]:
        # the interpreters differ by the version they run: named by it, not by their paths
        out.append({"what": "SGLang version", "flag": "version", "reference": ref["version"], "candidate": got["version"]})
    elif ref.get("python") != got.get("python"):
        out.append({"what": "serving interpreter (SGLang version)", "flag": "python", "reference": ref.get("python"),
                    "candidate": got.get("python")})
    fa, fb = ref.get("flags") or {}, got.get("flags") or {}
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            kind = _kind(k)
            out.append({"what": kind[0] if kind else k, "flag": k, "reference": fa.get(k, "(default)"),
                        "candidate": fb.get(k, "(default)")})
    order = [label for label, _, _ in KINDS]
    return sorted(out, key=lambda d: order.index(d["what"]) if d["what"] in order else len(order))


def tested(diffs: list[dict[str, Any]] | None) -> str:
    """The difference in words: 'KV cache dtype bfloat16 vs fp8_e4m3 (--kv-cache-dtype (default) vs fp8_e4m3)'."""
    if diffs is None:
        return "what differs from the reference is unknown (its setup was not recorded)"
    if not diffs:
        return "no difference from the reference in flags or interpreter"
    groups: dict[str, list[str]] = {}
    for d in diffs:       # one entry per kind: the log's KV dtype, then the flags that set it
        if d["flag"] == "version":      # an upgrade has a direction
            groups.setdefault(d["what"], []).append(f"SGLang version {d['reference']} → {d['candidate']}")
            continue
        flag = "" if d["flag"] in ("kv_dtype", "python") else f"--{d['flag']} "
        groups.setdefault(d["what"], []).append(f"{flag}{d['reference']} vs {d['candidate']}")
    parts = [(f"{what}: " if what not in v[0] else "") + v[0] + (f" ({'; '.join(v[1:])})" if v[1:] else "")
             for what, v in list(groups.items())[:4]]
    return "; ".join(parts) + ("; …" if len(groups) > 4 else "")


def remedy(diffs: list[dict[str, Any]] | None) -> str:
    """What to do about a failed comparison, for the difference actually tested."""
    if not diffs:
        return ("Do not serve this candidate: it changes the model's answers"
                + (", and nothing in its flags differs from the reference's: the serving path is not deterministic."
                   if diffs == [] else "."))
    kinds = list(dict.fromkeys(d["what"] for d in diffs))
    flags = {d["flag"] for d in diffs if d["what"] == kinds[0]}
    named = [(keys, r) for label, keys, r in KINDS if label == kinds[0]]
    # the entry whose flags differ (an engine's own KV types), else the kind's first
    rem = next((r for keys, r in named if flags & set(keys)), named[0][1] if named else None)
    text = rem or f"Do not serve this candidate: {', '.join('--' + d['flag'] for d in diffs[:4])} changed the model's answers."
    if len(kinds) > 1:
        text = f"It differs from the reference in more than one way ({', '.join(kinds)}): change one at a time. {text}"
    return text


def record(spec: Deployment, url: str, context: int | None, observed: dict[str, Any] | None = None,
           version: str | None = None) -> dict[str, Any]:
    """What the guard compares: greedy outputs, recall answers, tool-call cases passed; and the server's setup."""
    g = spec.tune.guard
    out: dict[str, Any] = {"identity": [], "recall": None, "toolcall": None, "setup": setup(spec, observed, version)}
    lengths = _recall_lengths(spec, context)
    # The guard's own plan (spec.tune.guard), not accuracy's: the lengths already fit this candidate's context.
    s = accuracy.AccuracySettings.resolve(None, url=url, max_tokens=g.identity_max_tokens, lengths=lengths or None,
                                          depths=list(g.recall_depths), tokenizer=tokenizer_dir(spec),
                                          toolcall_max_tokens=g.identity_max_tokens * 4)
    if g.identity_prompts:
        recs = run_sync(accuracy.greedy_outputs(s, url, code_prompts()[:g.identity_prompts]))
        out["identity"] = [r.text if r.error_kind in (None, "no_output") else None for r in recs]
    if lengths:
        doc, _ = accuracy.run_recall(s)
        total = sum(c["total"] for c in doc.get("grid", []))
        out["recall"] = {"correct": sum(c["correct"] for c in doc.get("grid", [])), "total": total, "lengths": lengths}
    if g.toolcall:
        tc = accuracy.probe_toolcalls(s)
        cases = tc.data().get("cases", [])
        out["toolcall"] = {"cases": len(cases), "failed": sum(1 for f in tc.findings if f.status == "fail"),
                           "skipped": any(f.id == "accuracy.toolcall.endpoint" for f in tc.findings) or not cases}
    return out


def _kld_settings(spec: Deployment, url: str, context: int | None) -> accuracy.AccuracySettings:
    g = spec.tune.guard
    tokens = min(g.kld_window_tokens, context - 1) if context else g.kld_window_tokens
    return accuracy.AccuracySettings.resolve(None, url=url, tokenizer=tokenizer_dir(spec), kld_windows=g.kld_windows,
                                             kld_window_tokens=tokens, batch_size=min(2, g.kld_windows) or None)


def kld_reference(spec: Deployment, url: str, context: int | None) -> Any:
    """While the reference serves: its scores of the KL-divergence windows and its noise floor (accuracy.Reference,
    kept in memory for the candidates); None where the engine cannot score prompt tokens (llama-server) or it is off;
    a string saying why it could not be measured."""
    g = spec.tune.guard
    if not g.kld_windows or spec.tune.engine != "sglang":
        return None
    s = _kld_settings(spec, url, context)
    tok = load_tokenizer(s.tokenizer)
    if tok is None:
        return "no tokenizer.json beside the model to cut the windows into token ids"
    try:
        wins = accuracy.kld_windows(tok, s.kld_windows, s.kld_window_tokens)
        return accuracy.measure_reference(s, wins, url)
    except RunbookError as e:
        return " ".join(str(e).split())


KLD_RECORD = "kld-reference.safetensors"      # in the tune run's folder: what --resume compares the rest with


def keep_kld_reference(run_dir: Path, spec: Deployment, reference: Any, url: str, context: int | None) -> str | None:
    """The reference's scores and floor written as a record beside the run's candidates; why not, or None."""
    try:
        accuracy.keep_reference(_kld_settings(spec, url, context), reference, url, run_dir / KLD_RECORD)
    except RunbookError as e:
        return " ".join(str(e).split())
    return None


def kept_kld_reference(run_dir: Path) -> Any:
    """On --resume: the reference's record from the run's folder (None where none was written; a string saying why
    it cannot be used)."""
    path = run_dir / KLD_RECORD
    if not path.is_file():
        return None
    try:
        return accuracy.read_record(path).reference
    except RunbookError as e:
        return " ".join(str(e).split())


def recorded_kld_reference(spec: Deployment, path: str) -> accuracy.Record:
    """`tune --record FILE`: a reference recorded where it could run (`runbook accuracy record`), for a reference
    configuration this host cannot run; read and checked against this deployment's model before anything launches
    (a one-line InputError naming the file and the difference). Every candidate is judged against it, the reference's
    own launch included, on the record's windows, top-k and chunk."""
    rec = accuracy.read_record(path)
    here = tokenizer_dir(spec)       # no checkpoint here (a GGUF elsewhere): nothing to check; the ids are, per candidate
    if (why := accuracy.record_refusal(rec, accuracy.model_identity(here) if here else {}, {}, set())):
        raise InputError(why)
    return rec


def kld_candidate(spec: Deployment, reference: Any, url: str, context: int | None) -> dict[str, Any] | None:
    """The candidate on the reference's windows: its KL divergence, same top-1 and PPL ratio against the reference (its
    live scores, or an accuracy.Record), and the verdict against the reference's noise floor (accuracy/kld.py: pass, warn,
    fail); None where not measured."""
    if reference is None:
        return None
    if isinstance(reference, str):
        return {"status": "skip", "title": f"KL divergence not measured: {reference}"}
    s = _kld_settings(spec, url, context)
    if isinstance(reference, accuracy.Record):
        made = reference.made
        s = s.model_copy(update={"kld_windows": made["windows"], "kld_window_tokens": made["window_tokens"],
                                 "kld_top_k": made["top_k"], "kld_chunk": made["chunk"]})
        if (why := accuracy.server_refusal(reference, accuracy.server_config(url, s.api_key))):
            return {"status": "skip", "title": f"KL divergence not measured: {why}"}
        reference = reference.reference
    try:
        result = accuracy.measure_candidate(s, reference, url)
    except RunbookError as e:
        return {"status": "skip", "title": "KL divergence not measured: " + " ".join(str(e).split())}
    floor = reference.floors[reference.floor_used]
    v = accuracy.kld_verdict(result, floor)
    return {"status": v.status, "title": accuracy.kld_finding(result, floor).title, "verdict": v.data(),
            "overall": result.overall, "by_depth": result.by_depth, "floor": floor.overall, "floor_used": reference.floor_used}


def identity(ref: list[str | None], got: list[str | None], min_tokens: int, tok: Any) -> tuple[str, str, list[Any]]:
    points = []
    for a, b in zip(ref, got, strict=False):
        points.append(None if a is None or b is None else accuracy.first_difference(a, b, tok))
    diverged = [p for p in points if p is not None]
    unit = "token" if tok is not None else "character"
    if not diverged:
        return "pass", f"greedy outputs identical to the reference on {len(points)} prompts", points
    early = [p for p in diverged if p < min_tokens]
    where = ", ".join(f"prompt {i}: {unit} {p}" for i, p in enumerate(points) if p is not None)
    if early:
        return "fail", f"greedy outputs diverge from the reference early ({where})", points
    return "pass", f"greedy outputs diverge from the reference only after {min(diverged)} {unit}s ({where})", points


def compare(spec: Deployment, ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """The guard's verdict: pass / fail, one line per probe, the first divergence point per prompt, the difference
    tested (`tested`, `differences`) and, on a failure, the remedy for that difference."""
    g = spec.tune.guard
    diffs = differences(ref.get("setup"), got.get("setup"))
    checks: list[dict[str, Any]] = []
    kld = got.get("kld") or {}
    judged = kld.get("status") in ("pass", "warn", "fail")
    if kld:
        checks.append({"probe": "kld", **kld})
    if ref.get("identity") and got.get("identity"):
        tok = load_tokenizer(tokenizer_dir(spec))
        st, line, points = identity(ref["identity"], got["identity"], g.min_identical_tokens, tok)
        # Where the KL divergence judged, greedy identity is where the outputs first part, not a verdict: on a real
        # model a near-tie flips a greedy token under any numeric change, harmless or not.
        checks.append({"probe": "identity", "status": "info" if judged else st, "title": line, "first_divergence": points})
    r, c = ref.get("recall"), got.get("recall")
    if r and c and r["total"] and c["total"]:
        drop = r["correct"] / r["total"] - c["correct"] / c["total"]
        checks.append({"probe": "recall", "status": "fail" if drop > g.max_recall_drop + 1e-9 else "pass",
                       "title": f"recall {c['correct']}/{c['total']} (reference {r['correct']}/{r['total']})"})
    r, c = ref.get("toolcall"), got.get("toolcall")
    if r and c and not (r["skipped"] or c["skipped"]):
        checks.append({"probe": "toolcall", "status": "fail" if c["failed"] > r["failed"] else "pass",
                       "title": f"tool-call probe: {c['failed']} failing checks (reference {r['failed']})"})
    status = "fail" if any(x["status"] == "fail" for x in checks) else ("pass" if checks else "skip")
    out: dict[str, Any] = {"status": status, "checks": checks, "tested": tested(diffs), "differences": diffs,
                           "versions": {"reference": (ref.get("setup") or {}).get("version"),
                                        "candidate": (got.get("setup") or {}).get("version")}}
    if status == "fail":
        out["remedy"] = remedy(diffs)
    return out
