"""Prompt text cut to token lengths: measured with the model's tokenizer when one is given, otherwise
approximated (~4 characters per token). Shared by the workloads and the agentic sessions."""
from __future__ import annotations

from typing import Any, cast

from runbook.corpus import CHARS_PER_TOKEN


def count_tokens(tok: Any, text: str) -> int | None:
    """Tokens in `text` by the tokenizer (no special tokens); None without one."""
    return len(tok.encode(text, add_special_tokens=False).ids) if tok is not None else None


def exact_ids(tok: Any, text: str, n: int) -> list[int]:
    """Exactly n token ids: the text's, repeated as often as it takes."""
    ids = tok.encode(text, add_special_tokens=False).ids
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def text_of_length(tok: Any, text: str, n: int) -> str:
    """Text that tokenizes to exactly n tokens where the tokenizer allows, else the nearest below."""
    if tok is None:
        while len(text) < n * CHARS_PER_TOKEN:
            text += "\n" + text
        return text[: n * CHARS_PER_TOKEN]
    ids = exact_ids(tok, text, n)
    s = tok.decode(ids)
    while cast(int, count_tokens(tok, s)) > n and ids:  # tok is not None here
        ids = ids[:-1]
        s = tok.decode(ids)
    return s
