"""Speculative decoding must not change greedy output: the same prompts with it on (A) and off (B)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runbook.core.findings import Finding
from runbook.endpoint.client import Client, RequestSpec


def first_difference(a: str, b: str, tokenizer: Any = None) -> int | None:
    """Index of the first differing token (characters without a tokenizer); None when identical."""
    if a == b:
        return None
    xs = tokenizer.encode(a, add_special_tokens=False).ids if tokenizer is not None else list(a)
    ys = tokenizer.encode(b, add_special_tokens=False).ids if tokenizer is not None else list(b)
    for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
        if x != y:
            return i
    return min(len(xs), len(ys))


async def outputs(url: str, prompts: Sequence[str], max_tokens: int, model: str | None = None,
                  api_key: str | None = None) -> list[Any]:
    c = Client(url, model, api_key=api_key)
    async with c.session() as s:   # one at a time: batching must not be what differs
        return [await c.send(s, RequestSpec(i, p, max_tokens, ignore_eos=False)) for i, p in enumerate(prompts)]


async def compare(url_a: str, url_b: str, prompts: Sequence[str], max_tokens: int = 64, tokenizer: Any = None,
                  model: str | None = None, api_key: str | None = None) -> tuple[list[dict[str, Any]], list[Finding]]:
    a = await outputs(url_a, prompts, max_tokens, model, api_key)
    b = await outputs(url_b, prompts, max_tokens, model, api_key)
    rows = []
    for ra, rb in zip(a, b, strict=True):
        pos = first_difference(ra.text, rb.text, tokenizer)
        ok = all(r.error_kind in (None, "no_output") for r in (ra, rb))   # an empty greedy output is still an output
        rows.append({"id": ra.id, "identical": pos is None and ok, "first_diff": pos, "a": ra.text, "b": rb.text,
                     "error": None if ok else (ra.error or rb.error)})
    bad = [r for r in rows if not r["identical"]]
    unit = "token" if tokenizer is not None else "character"
    if bad:
        f = Finding("accuracy.identity.mismatch", "fail", f"greedy outputs differ on {len(bad)} of {len(rows)} prompts",
                    evidence="; ".join(f"prompt {r['id']}: first differing {unit} {r['first_diff']}" for r in bad[:6]),
                    remedy="Speculative decoding changed greedy output: check the draft/verify path (dtype, backend) before enabling it.")
    else:
        f = Finding("accuracy.identity.mismatch", "pass", f"greedy outputs identical on all {len(rows)} prompts")
    return rows, [f]
