"""The live probes as one call each, for the CLI and the notebook (skip findings when no endpoint)."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runbook import quant
from runbook.accuracy import identity, kldprobe, recall
from runbook.accuracy.settings import AccuracySettings
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.corpus import code_prompts
from runbook.endpoint.reach import probe as reachable
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer


def deployment_format(spec: Deployment) -> tuple[str, str]:
    """(format, scaling) of the deployment's KV cache, from the quant inspection (bf16 when unreadable)."""
    from runbook.accuracy.kvquant import active_format  # lazy: ml_dtypes (~0.6 s) only when the study runs

    try:
        rep = quant.assess(spec)
    except InputError:
        return active_format(str(spec.serving.flags.get("kv-cache-dtype", "bf16")))
    return active_format(rep.kv_cache.effective, rep.kv_cache.scale_coverage)


def run_recall(s: AccuracySettings) -> tuple[dict[str, Any], list[Finding]]:
    """Recall at s.url, and the A/B against s.compare_url; prompts archived under s.artifact_dir."""
    url, compare_url = s.url, s.compare_url
    if not url:
        return {"grid": []}, [Finding("accuracy.recall.endpoint", "skip", "recall probe skipped: no endpoint given",
                                      remedy="Give url (and compare_url for an FP8-vs-BF16 A/B).")]
    tok = load_tokenizer(s.tokenizer)   # a bad --tokenizer is an error whether or not a server answers
    why = run_sync(reachable(url))
    if why:
        return {"grid": []}, [Finding("accuracy.recall.endpoint", "skip", f"recall probe skipped: no server at {url}", evidence=why,
                                      remedy="Start the server, or `make demo` to try the probe on a tiny CPU model.")]
    items = recall.build_items(s, tok)
    key = s.api_key
    res_a = run_sync(recall.ask(s, url, items))
    doc: dict[str, Any] = {"url": url, "lengths": list(s.lengths), "depths": list(s.depths), "seed": s.seed, "grid": recall.grid(res_a),
                           "exact_lengths": tok is not None, "results": res_a}
    ab = None
    tested = None
    if compare_url:
        res_b = run_sync(recall.ask(s, compare_url, items))
        ab = recall.paired(res_a, res_b)
        ca, cb = identity.server_config(url, key), identity.server_config(compare_url, key)
        diffs = identity.config_differences(ca, cb)
        tested = identity.tested_difference(diffs, ca is not None and cb is not None)
        doc.update({"compare_url": compare_url, "grid_b": recall.grid(res_b), "ab": ab, "results_b": res_b,
                    "differences": diffs})
    if s.artifact_dir:  # prompts are deterministic from the seed; archive them with the answers
        out = Path(s.artifact_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "recall_prompts.jsonl", "w") as f:
            for it in recall.item_dicts(items):
                f.write(json.dumps(it) + "\n")
    return doc, recall.findings(doc["grid"], ab, tok is not None, res_a, tested)


@dataclass
class IdentityResult:
    rows: list[dict[str, Any]]                 # A vs B, per prompt
    batch: list[dict[str, Any]]                # url at concurrency 1 vs N, per prompt
    differences: list[dict[str, Any]]          # what differs between A and B (identity.config_differences)
    findings: list[Finding]


def run_identity(s: AccuracySettings) -> IdentityResult:
    """Greedy identity between s.url (A) and s.identity_b (B), named by what differs between them, and batch
    invariance of s.url (its prompts one at a time, then s.batch_size at once; 1: not checked)."""
    url, compare_url = s.url, s.identity_b
    if not url:
        return IdentityResult([], [], [], [Finding("accuracy.identity.endpoint", "skip", "greedy-identity check skipped: no endpoint given",
                                                   remedy="Give url and a second endpoint (compare_url; report: spec_off_url) "
                                                          "that differs in the one setting to test.")])
    tok = load_tokenizer(s.tokenizer)
    texts = code_prompts()[:s.prompts]
    findings: list[Finding] = []
    rows: list[dict[str, Any]] = []
    diffs: list[dict[str, Any]] = []
    why = run_sync(reachable(url))
    if why:
        return IdentityResult([], [], [], [Finding("accuracy.identity.endpoint", "skip",
                                                   f"greedy-identity check skipped: no server at {url}", evidence=why)])
    if not compare_url:
        findings.append(Finding("accuracy.identity.endpoint", "skip", "greedy-identity check skipped: needs two endpoints",
                                remedy="Give a second endpoint (compare_url; report: spec_off_url) that differs from url in "
                                       "the one setting to test: speculative decoding, KV dtype, radix cache, version."))
    elif (why := run_sync(reachable(compare_url))):
        findings.append(Finding("accuracy.identity.endpoint", "skip", f"greedy-identity check skipped: no server at {compare_url}",
                                evidence=why))
    else:
        c = run_sync(identity.compare_configs(s, url, compare_url, texts, tok))
        rows, diffs = c.rows, c.differences
        findings.append(c.finding)
    batch: list[dict[str, Any]] = []
    if s.batch_size > 1:
        batch, f = run_sync(identity.batch_invariance(s, url, texts, tok))
        findings.append(f)
    return IdentityResult(rows, batch, diffs, findings)



def judged_by_kld(ident: list[Finding], kld_findings: list[Finding]) -> list[Finding]:
    """Greedy identity's A/B finding as information where the KL divergence judged the same two servers: on a real model
    a near-tie flips a greedy token under any numeric change, harmless or not, so where outputs first part is evidence,
    and the verdict is accuracy.kld.verdict's (measured against the noise floor)."""
    verdict = next((f for f in kld_findings if f.id == "accuracy.kld.verdict"), None)
    if verdict is None or verdict.status not in ("pass", "warn", "fail"):
        return ident
    note = f"where greedy outputs first part; judged by the KL divergence (accuracy.kld.verdict: {verdict.status})"
    return [replace(f, status="info", remedy="", detail=f"{note}; {f.detail}" if f.detail else note)
            if f.id == "accuracy.identity.mismatch" and f.status == "fail" else f for f in ident]


def run_kld(s: AccuracySettings, reference: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """KL divergence of s.url from `reference` (default s.compare_url) against the noise floor (accuracy/kldprobe.py)."""
    return kldprobe.run(s, reference)
