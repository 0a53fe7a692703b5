"""The accuracy guard: each candidate against the reference on the same prompts. The reference's outputs
are recorded while it runs (candidates run one at a time on one port), then each candidate's are
compared with them: greedy identity reporting where outputs first diverge (a divergence late in the
output is what batched numerics legitimately do; one before `min_identical_tokens` fails), needle recall
at the guard's lengths, and the tool-call probe."""
from __future__ import annotations

from typing import Any

from runbook import accuracy
from runbook.core.spec import Deployment
from runbook.corpus import code_prompts
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer
from runbook.tune.measure import tokenizer_dir


def _recall_lengths(spec: Deployment, context: int | None) -> list[int]:
    g = spec.tune.guard
    ls = list(g.recall_lengths or spec.accuracy.recall_lengths)
    return [n for n in ls if context is None or n <= context]


def record(spec: Deployment, url: str, context: int | None) -> dict[str, Any]:
    """What the guard compares: greedy outputs, recall answers, tool-call cases passed."""
    g = spec.tune.guard
    out: dict[str, Any] = {"identity": [], "recall": None, "toolcall": None}
    if g.identity_prompts:
        recs = run_sync(accuracy.greedy_outputs(url, code_prompts()[:g.identity_prompts], g.identity_max_tokens))
        out["identity"] = [r.text if r.error_kind in (None, "no_output") else None for r in recs]
    lengths = _recall_lengths(spec, context)
    if lengths:
        doc, _ = accuracy.run_recall(url, lengths, list(g.recall_depths), tokenizer_dir(spec))
        total = sum(c["total"] for c in doc.get("grid", []))
        out["recall"] = {"correct": sum(c["correct"] for c in doc.get("grid", [])), "total": total, "lengths": lengths}
    if g.toolcall:
        tc = accuracy.probe_toolcalls(url, max_tokens=g.identity_max_tokens * 4)
        cases = tc.data().get("cases", [])
        out["toolcall"] = {"cases": len(cases), "failed": sum(1 for f in tc.findings if f.status == "fail"),
                           "skipped": any(f.id == "accuracy.toolcall.endpoint" for f in tc.findings) or not cases}
    return out


def _identity(ref: list[str | None], got: list[str | None], min_tokens: int, tok: Any) -> tuple[str, str, list[Any]]:
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
    """The guard's verdict: pass / fail, one line per probe, the first divergence point per prompt."""
    g = spec.tune.guard
    checks: list[dict[str, Any]] = []
    if ref.get("identity") and got.get("identity"):
        tok = load_tokenizer(tokenizer_dir(spec))
        st, line, points = _identity(ref["identity"], got["identity"], g.min_identical_tokens, tok)
        checks.append({"probe": "identity", "status": st, "title": line, "first_divergence": points})
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
    return {"status": status, "checks": checks}
