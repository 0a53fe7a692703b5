"""Long-context recall for code: exact identifiers planted at chosen depths in code haystacks of exact
token lengths, answered with greedy decoding and scored by exact match.

Prompts are deterministic from the seed. With the model's tokenizer, prompts are sent as token ids, so
their length is exact; without one, text is cut at ~4 characters per token and marked approximate.
"""
from __future__ import annotations

import asyncio
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from runbook.accuracy.settings import AccuracySettings
from runbook.core.findings import Finding
from runbook.core.stats import bootstrap_ci
from runbook.corpus import CHARS_PER_TOKEN, code_text
from runbook.endpoint.client import Client, RequestSpec

if TYPE_CHECKING:
    import numpy as np

ANSWER_TOKENS = 12        # an identifier's value, with room for quotes
IN_FLIGHT = 4             # needles asked at once
TIMEOUT_S = 600.0         # per request: a long haystack's prefill on a busy server
# The answer is asked as a cloze: the needle's own line up to its value, left for the model to complete, as key-value
# retrieval tests do (RULER's "the special magic number for X is:"). A real 135 M model (SmolLM2) then recalls 6/6
# needles at 512-1,024 tokens with BF16 KV, where "Reply with the value only" got 1/6 (it continued the code's
# comments) and "KEY =" for a line written `KEY: int = N` got 4/6; a larger model answers any of these forms.
QUESTION = "\n\n# Question: in the code above, what is the value of {key}?\n# Answer: {prefix}"


@dataclass
class Item:
    id: int
    length: int
    depth: float
    key: str
    expected: str
    needle: str
    prompt: Any                 # token ids (exact) or text
    prompt_tokens: int | None
    exact: bool


def _needle(rng: np.random.Generator, i: int) -> tuple[str, str, str]:
    word = "".join(rng.choice(list(string.ascii_uppercase), 4))
    value = str(int(rng.integers(10000, 99999)))
    kind = i % 3
    if kind == 0:
        key = f"RETRY_BUDGET_{word}"
        return key, value, f"{key} = {value}"
    if kind == 1:
        key = f"SHARD_LIMIT_{word}"
        return key, value, f"{key}: int = {value}  # set by the deploy tool"
    key = f"MAX_BATCH_{word}"
    return key, value, f'CONFIG["{key}"] = {value}'


def build_items(s: AccuracySettings, tokenizer: Any = None) -> list[Item]:
    """s.per_cell needles per s.lengths × s.depths cell, deterministic from s.seed; `tokenizer`: a loaded one (exact
    lengths, as token ids), else text cut at ~4 characters per token."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    rng = np.random.default_rng(s.seed)
    text = code_text()
    items: list[Item] = []
    hay_ids = tokenizer.encode(text, add_special_tokens=False).ids if tokenizer is not None else None
    for L in s.lengths:
        for d in s.depths:
            for _ in range(s.per_cell):
                i = len(items)
                key, value, line = _needle(rng, i)
                q = QUESTION.format(key=key, prefix=line[:line.rindex(value)].rstrip())
                off = int(rng.integers(0, 10000))
                if tokenizer is not None:
                    assert hay_ids is not None  # encoded above whenever there is a tokenizer
                    nd = tokenizer.encode("\n" + line + "\n", add_special_tokens=False).ids
                    qi = tokenizer.encode(q, add_special_tokens=False).ids
                    budget = L - len(nd) - len(qi)
                    if budget < 1:
                        continue
                    ids = (hay_ids[off:] + hay_ids) * (1 + budget // max(1, len(hay_ids)))
                    hay = ids[:budget]
                    at = int(budget * d)
                    prompt = hay[:at] + nd + hay[at:] + qi
                    items.append(Item(i, L, d, key, value, line, prompt, len(prompt), True))
                else:
                    budget = max(1, L * CHARS_PER_TOKEN - len(line) - len(q) - 2)
                    hay = (text[off:] + text) * (1 + budget // max(1, len(text)))
                    hay = hay[:budget]
                    at = int(budget * d)
                    prompt = hay[:at] + "\n" + line + "\n" + hay[at:] + q
                    items.append(Item(i, L, d, key, value, line, prompt, None, False))
    return items


def score(expected: str, output: str) -> bool:
    """Exact match of the first token-like word of the answer (quotes and punctuation stripped)."""
    first = output.strip().split()[0] if output.strip() else ""
    return first.strip("`'\".,;:)(") == expected


async def ask(s: AccuracySettings, url: str, items: Sequence[Item]) -> list[dict[str, Any]]:
    """The needles' questions against `url` (s.model, s.api_key), greedy, scored by exact match."""
    client = Client(url, s.model, chat=False, api_key=s.api_key, timeout_s=TIMEOUT_S)
    sem = asyncio.Semaphore(IN_FLIGHT)
    async with client.session(limit=IN_FLIGHT) as session:
        async def one(it: Item) -> dict[str, Any]:
            async with sem:
                rec = await client.send(session, RequestSpec(it.id, it.prompt, ANSWER_TOKENS, it.prompt_tokens, ignore_eos=False))
            # An immediate end of sequence is an empty (wrong) answer, not a failed request.
            err = None if rec.error_kind in (None, "no_output") else rec.error
            return {"id": it.id, "length": it.length, "depth": it.depth, "expected": it.expected, "output": rec.text,
                    "correct": bool(err is None and score(it.expected, rec.text)), "error": err,
                    "prompt_tokens_server": rec.input_tokens}
        return list(await asyncio.gather(*(one(it) for it in items)))


def grid(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    cells: dict[tuple[int, float], list[bool]] = {}
    for r in results:
        cells.setdefault((r["length"], r["depth"]), []).append(r["correct"])
    return [{"length": L, "depth": d, "correct": sum(v), "total": len(v)} for (L, d), v in sorted(cells.items())]


def paired(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """B − A recall on the same items, with a bootstrap CI."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    bm = {r["id"]: r for r in b}
    diffs = [float(bm[r["id"]]["correct"]) - float(r["correct"]) for r in a if r["id"] in bm]
    mean, lo, hi = bootstrap_ci(diffs)
    return {"pairs": len(diffs), "recall_a": float(np.mean([r["correct"] for r in a])) if a else None,
            "recall_b": float(np.mean([r["correct"] for r in b])) if b else None,
            "diff_b_minus_a": mean, "ci95": [lo, hi]}


def findings(g: Sequence[dict[str, Any]], ab: dict[str, Any] | None = None, exact: bool = True,
             results: Sequence[dict[str, Any]] = (), tested: str | None = None) -> list[Finding]:
    """`tested`: what differs between A and B (identity.tested_difference), named in the A/B finding."""
    total = sum(c["total"] for c in g)
    correct = sum(c["correct"] for c in g)
    out = [Finding("accuracy.recall.score", "info", f"recall {correct}/{total} ({correct / total:.0%})" if total else "recall: no items",
                   detail=("prompt lengths exact (token ids)" if exact else "prompt lengths approximate (~4 characters "
                           "per token, no tokenizer)"))]
    failed = [r for r in results if r.get("error")]
    if failed:
        out.append(Finding("accuracy.recall.errors", "fail", f"{len(failed)} of {len(results)} recall requests failed (counted as misses)",
                           evidence="; ".join(f"{r['length']} tokens: {str(r['error'])[:120]}" for r in failed[:3]),
                           remedy="A length beyond the server's context is rejected: lower `lengths` or raise --context-length."))
    worst = [c for c in g if c["total"] and c["correct"] < c["total"]]
    if worst:
        out.append(Finding("accuracy.recall.misses", "warn", f"missed needles in {len(worst)} of {len(g)} length × depth cells",
                           evidence=", ".join(f"{c['length']}@{c['depth']:.2f}: {c['correct']}/{c['total']}" for c in worst[:8]),
                           remedy="Compare against a BF16-KV deployment with compare_url; check --context-length."))
    if ab:
        lo, hi = ab["ci95"]
        sig = not (lo <= 0 <= hi)
        out.append(Finding("accuracy.recall.ab", "warn" if sig and ab["diff_b_minus_a"] < 0 else "info",
                           f"A/B recall: B − A = {ab['diff_b_minus_a']:+.1%} (95% CI {lo:+.1%} … {hi:+.1%}) over {ab['pairs']} items"
                           + (f" — {tested}" if tested else ""),
                           detail="significant" if sig else "not distinguishable from zero at 95%"))
    return out


def item_dicts(items: Sequence[Item]) -> list[dict[str, Any]]:
    return [asdict(i) for i in items]
