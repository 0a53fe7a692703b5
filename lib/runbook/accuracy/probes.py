"""The live probes as one call each, for the CLI and the notebook (skip findings when no endpoint)."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook.accuracy import identity, recall
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.corpus import code_prompts
from runbook.endpoint.reach import probe as reachable
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer


def deployment_format(spec: Deployment) -> tuple[str, str]:
    """(format, scaling) of the deployment's KV cache, from the quant inspection (bf16 when unreadable)."""
    from runbook import quant
    from runbook.accuracy.kvquant import active_format
    from runbook.core.errors import InputError

    try:
        rep = quant.for_deployment(spec)
    except InputError:
        return active_format(str(spec.serving.flags.get("kv-cache-dtype", "bf16")))
    return active_format(rep.kv_cache.effective, rep.kv_cache.scale_coverage)


def recall_lengths(spec: Deployment, lengths: Sequence[int] | None = None) -> list[int]:
    """The spec's recall lengths, up to its --context-length (a longer prompt would be rejected)."""
    ls = list(lengths or spec.accuracy.recall_lengths)
    ctx = spec.serving.flags.get("context-length")
    return [L for L in ls if ctx is None or int(ctx) >= L] or ls[:1]


def run_recall(url: str | None, lengths: Sequence[int], depths: Sequence[float], tokenizer: str | None = None,
               compare_url: str | None = None, seed: int = 0, per_cell: int = 1, out: Path | None = None,
               api_key_env: str | None = None, model: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    if not url:
        return {"grid": []}, [Finding("accuracy.recall.endpoint", "skip", "recall probe skipped: no endpoint given",
                                      remedy="Give url (and compare_url for an FP8-vs-BF16 A/B).")]
    tok = load_tokenizer(tokenizer)   # a bad --tokenizer is an error whether or not a server answers
    why = run_sync(reachable(url))
    if why:
        return {"grid": []}, [Finding("accuracy.recall.endpoint", "skip", f"recall probe skipped: no server at {url}", evidence=why,
                                      remedy="Start the server, or `make demo` to try the probe on a tiny CPU model.")]
    items = recall.build_items(lengths, depths, tok, seed, per_cell)
    key = os.environ.get(api_key_env) if api_key_env else None
    res_a = run_sync(recall.ask(url, items, model, api_key=key))
    doc: dict[str, Any] = {"url": url, "lengths": list(lengths), "depths": list(depths), "seed": seed, "grid": recall.grid(res_a),
                           "exact_lengths": tok is not None, "results": res_a}
    ab = None
    tested = None
    if compare_url:
        res_b = run_sync(recall.ask(compare_url, items, model, api_key=key))
        ab = recall.paired(res_a, res_b)
        ca, cb = identity.server_config(url, key), identity.server_config(compare_url, key)
        diffs = identity.config_differences(ca, cb)
        tested = identity.tested_difference(diffs, ca is not None and cb is not None)
        doc.update({"compare_url": compare_url, "grid_b": recall.grid(res_b), "ab": ab, "results_b": res_b,
                    "differences": diffs})
    if out:  # prompts are deterministic from the seed; archive them with the answers
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


def run_identity(url: str | None, compare_url: str | None, n: int = 8, max_tokens: int = 64,
                 tokenizer: str | None = None, model: str | None = None, concurrency: int = 8,
                 api_key: str | None = None) -> IdentityResult:
    """Greedy identity between `url` (A) and `compare_url` (B), named by what differs between them, and batch
    invariance of `url` (its prompts one at a time, then `concurrency` at once; 1: not checked)."""
    if not url:
        return IdentityResult([], [], [], [Finding("accuracy.identity.endpoint", "skip", "greedy-identity check skipped: no endpoint given",
                                                   remedy="Give url and a second endpoint (compare_url; report: spec_off_url) "
                                                          "that differs in the one setting to test.")])
    tok = load_tokenizer(tokenizer)
    prompts = code_prompts()[:n]
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
        c = run_sync(identity.compare_configs(url, compare_url, prompts, max_tokens, tok, model, api_key))
        rows, diffs = c.rows, c.differences
        findings.append(c.finding)
    batch: list[dict[str, Any]] = []
    if concurrency > 1:
        batch, f = run_sync(identity.batch_invariance(url, prompts, max_tokens, concurrency, tok, model, api_key))
        findings.append(f)
    return IdentityResult(rows, batch, diffs, findings)
