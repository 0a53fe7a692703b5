"""Prompt sets. Each builder returns RequestSpecs; lengths are measured with the model's tokenizer
when one is given, otherwise approximated (~4 characters per token) and marked so.

- random: uniformly random token ids; input length drawn from U[L·(1−r), L·(1+r)] (integers, both ends
  included; r = range_ratio, default 0 = exactly L). Random tokens make speculative-decoding drafts
  useless: never judge spec decoding on this workload.
- code: realistic coding prompts from the frozen corpus (runbook/corpus, written for the project, Apache-2.0).
- longctx: the corpus's code text cut to an exact token length per request.
- prefix: an agentic shape — one long shared system prompt plus repository context, reused by every
  request, followed by a different coding question each turn (exercises the prefix cache).
- FILE: JSON Lines with "prompt" (text or token ids) or "messages", and optional "max_tokens".
- trace:FILE: a Mooncake-format trace replayed at its recorded times (open loop): JSON Lines with
  "timestamp" (ms), "input_length", "output_length" and optional "hash_ids" (one id per block of
  TRACE_BLOCK tokens: requests naming the same ids share that prefix, built from the same corpus
  text) and "session_id". `trace:synthetic` is the small trace shipped in the corpus. An SGLang request
  dump (.pkl from --dump-requests-folder / --crash-dump-folder) is read too, without running it
  (bench/sglang_dump.py): created times, prompt/completion tokens, and ids per block of input_ids.
- agentic: multi-turn sessions, built as they run (bench/sessions.py), not here.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, cast, overload

import numpy as np

from runbook.bench import sglang_dump
from runbook.core.errors import InputError
from runbook.core.fsutil import FileRefused, read_regular
from runbook.corpus import CHARS_PER_TOKEN, code_prompts, code_text
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.endpoint.client import RequestSpec


class LazyRequests(Sequence):
    """A workload's requests, built on first use and in order (so a `--duration` level planned for
    100,000 requests builds only those it sends); byte-identical to building them all up front."""

    def __init__(self, n: int, gen: Iterator[RequestSpec] | Callable[[int], RequestSpec]):
        self._n = n
        self._gen = gen
        self._memo: list[RequestSpec] = []

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestSpec]: ...

    def __getitem__(self, i: int | slice) -> RequestSpec | list[RequestSpec]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        if callable(self._gen):
            return self._gen(i)
        while len(self._memo) <= i:
            self._memo.append(next(self._gen))
        return self._memo[i]

    def __iter__(self) -> Iterator[RequestSpec]:
        for i in range(self._n):
            yield self[i]

    @property
    def built(self) -> int:
        return len(self._memo)


@dataclass
class Workload:
    name: str
    requests: Sequence[RequestSpec]
    exact_lengths: bool
    description: str
    corpus_version: str = ""   # what the prompts were built from; the regression check compares only equal ones
    schedule: Optional[list[float]] = None   # trace replay: each request's send offset (s) from the start


def _count(tok: Any, text: str) -> Optional[int]:
    return len(tok.encode(text, add_special_tokens=False).ids) if tok is not None else None


def _exact_ids(tok: Any, text: str, n: int) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False).ids
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def _text_of_length(tok: Any, text: str, n: int) -> str:
    """Text that tokenizes to exactly n tokens where the tokenizer allows, else the nearest below."""
    if tok is None:
        while len(text) < n * CHARS_PER_TOKEN:
            text += "\n" + text
        return text[: n * CHARS_PER_TOKEN]
    ids = _exact_ids(tok, text, n)
    s = tok.decode(ids)
    while cast(int, _count(tok, s)) > n and ids:  # tok is not None here
        ids = ids[:-1]
        s = tok.decode(ids)
    return s


MAX_WORKLOAD_BYTES = 1 << 30   # a JSON Lines prompt file; beyond 1 GiB it is not a workload


def read_workload_file(path: Path, dump_ok: bool = False) -> tuple[bytes, str]:
    """The bytes and UTF-8 text of a workload file; InputError naming the file, the line and byte offset, and the fix.
    `dump_ok`: a pickle (an SGLang request dump) comes back as bytes with no text."""
    try:
        raw = read_regular(path, MAX_WORKLOAD_BYTES, what="a workload file")
    except OSError as e:
        raise InputError(f"{path}: cannot read the workload file: {e.strerror or e}") from None
    except FileRefused as e:
        raise InputError(f"{path}: {e.reason}; give a JSON Lines workload file") from None
    if dump_ok and raw[:1] == sglang_dump.PICKLE_MAGIC:
        return raw, ""
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte offset {e.start}); "
                         "save the workload file as UTF-8 (JSON Lines)") from None


def build(name: str, n: int, input_len: int = 1024, output_len: int = 256, tokenizer: Any = None,
          vocab_size: Optional[int] = None, chat: bool = False, seed: int = 0, range_ratio: float = 0.0,
          ignore_eos: bool = True, trace_speed: float = 1.0) -> Workload:
    rng = np.random.default_rng(seed)
    if name == "random":
        lo, hi = int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio))
        lens = rng.integers(max(1, lo), max(1, hi) + 1, size=n)
        vocab = vocab_size or (tokenizer.get_vocab_size() if tokenizer is not None else None)

        def gen_random() -> Iterator[RequestSpec]:
            for i, L in enumerate(lens):
                if vocab and not chat:
                    ids = rng.integers(10, vocab - 10, size=int(L)).tolist()
                    yield RequestSpec(i, ids, output_len, int(L), ignore_eos)
                elif tokenizer is not None:
                    ids = rng.integers(10, tokenizer.get_vocab_size() - 10, size=int(L)).tolist()
                    txt = tokenizer.decode(ids)
                    yield RequestSpec(i, txt, output_len, _count(tokenizer, txt), ignore_eos)
                else:
                    words = ["".join(chr(c) for c in rng.integers(97, 123, size=3)) for _ in range(int(L))]
                    yield RequestSpec(i, " ".join(words), output_len, None, ignore_eos)
        exact = bool((vocab and not chat))
        return Workload(name, LazyRequests(n, gen_random()), exact, f"random token ids, input length U[{lo}, {hi}], output {output_len}",
                        f"random-seed{seed}")
    if name == "code":
        ps = code_prompts()
        counts = [_count(tokenizer, p) for p in ps]
        reqs = LazyRequests(n, lambda i: RequestSpec(i, ps[i % len(ps)], output_len, counts[i % len(ps)], ignore_eos))
        return Workload(name, reqs, tokenizer is not None, f"{len(ps)} shipped coding prompts, output {output_len}",
                        CORPUS_VERSION)
    if name == "longctx":
        text = code_text()

        def gen_long() -> Iterator[RequestSpec]:
            for i in range(n):
                # Different requests start at different offsets so the prefix cache cannot serve them.
                start = (i * 7919) % max(1, len(text) // 2)
                body = text[start:] + text[:start]
                if tokenizer is not None and not chat:
                    ids = _exact_ids(tokenizer, body, input_len)
                    yield RequestSpec(i, ids, output_len, len(ids), ignore_eos)
                else:
                    s = _text_of_length(tokenizer, body, input_len)
                    yield RequestSpec(i, s, output_len, _count(tokenizer, s), ignore_eos)
        return Workload(name, LazyRequests(n, gen_long()), tokenizer is not None, f"code text cut to {input_len} tokens, output {output_len}",
                        CORPUS_VERSION)
    if name == "prefix":
        shared = ("You are a senior engineer working in this repository. Answer with code.\n\n# Repository context\n"
                  + _text_of_length(tokenizer, code_text(), max(1, int(input_len * 0.9))))
        ps = code_prompts()
        pcounts = [_count(tokenizer, shared + q) for q in ps]

        def one_prefix(i: int) -> RequestSpec:
            q = ps[i % len(ps)]
            prompt: Any = [{"role": "system", "content": shared}, {"role": "user", "content": q}] if chat else shared + "\n\n# Task\n" + q
            return RequestSpec(i, prompt, output_len, pcounts[i % len(ps)], ignore_eos, {"shared_prefix": True})
        return Workload(name, LazyRequests(n, one_prefix), tokenizer is not None, f"shared ~{int(input_len * 0.9)}-token system prompt + a question per turn",
                        CORPUS_VERSION)
    if name.startswith("trace:"):
        return build_trace(name[len("trace:"):], n, tokenizer, chat, ignore_eos, trace_speed)
    path = Path(name)
    if not path.is_file():
        raise InputError(f"--workload {name}: not random|code|longctx|prefix and not a file")
    raw, text = read_workload_file(path)
    rows: list[RequestSpec] = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{i + 1}: not JSON ({e.msg})") from None
        except (RecursionError, ValueError):
            raise InputError(f"{path}:{i + 1}: not a usable JSON line (nested too deeply or a number too long)") from None
        if not isinstance(d, dict):
            raise InputError(f"{path}:{i + 1}: each line must be a JSON object with \"prompt\" (or \"messages\"), "
                             f"got {type(d).__name__}")
        prompt = d.get("messages") if chat and "messages" in d else d.get("prompt")
        if prompt is None:
            raise InputError(f"{path}:{i + 1}: needs \"prompt\" (or \"messages\" with --chat)")
        mt = d.get("max_tokens", output_len)
        n_out = (mt if isinstance(mt, int) and not isinstance(mt, bool) else int(mt) if isinstance(mt, float) and mt.is_integer()
                 else int(mt.strip()) if isinstance(mt, str) and mt.strip().isdigit() else None)
        if n_out is None or not 0 < n_out <= 1 << 24:
            raise InputError(f"{path}:{i + 1}: \"max_tokens\" must be a token count in [1, {1 << 24:,}] (got {str(mt)[:40]!r})")
        rows.append(RequestSpec(len(rows), prompt, n_out,
                                _count(tokenizer, prompt) if isinstance(prompt, str) else None, ignore_eos))
    if not rows:
        raise InputError(f"{path}: no requests")
    base = rows
    lazy = LazyRequests(n, lambda i: RequestSpec(i, base[i % len(base)].prompt, base[i % len(base)].max_tokens,
                                                base[i % len(base)].prompt_tokens, base[i % len(base)].ignore_eos))
    return Workload(path.name, lazy, tokenizer is not None, f"prompts from {path}",
                    "file-" + hashlib.sha256(raw).hexdigest()[:16])


TRACE_BLOCK = 512         # tokens per Mooncake hash id
SYNTHETIC_TRACE = "trace_synthetic.jsonl"
MAX_TRACE_LENGTH = 1 << 20


def _trace_int(d: dict[str, Any], key: str, where: str, lo: int) -> int:
    v = d.get(key)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= MAX_TRACE_LENGTH:
        raise InputError(f"{where}: \"{key}\" must be an integer in [{lo}, {MAX_TRACE_LENGTH:,}] (got {str(v)[:40]!r})")
    return v


def read_trace(text: str, source: str) -> list[dict[str, Any]]:
    """The trace's rows (timestamp s, lengths, hash ids, session), in timestamp order; InputError naming the line."""
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{source}:{i + 1}"
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{where}: not JSON; a Mooncake trace has one JSON object per line") from None
        if not isinstance(d, dict):
            raise InputError(f"{where}: each line must be a JSON object with timestamp, input_length, output_length")
        ts = d.get("timestamp")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
            raise InputError(f"{where}: \"timestamp\" must be a non-negative number of milliseconds (got {str(ts)[:40]!r})")
        hs = d.get("hash_ids", [])
        if not isinstance(hs, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hs):
            raise InputError(f"{where}: \"hash_ids\" must be a list of integers")
        sid = d.get("session_id")
        rows.append({"t": float(ts) / 1000.0, "input": _trace_int(d, "input_length", where, 1),
                     "output": _trace_int(d, "output_length", where, 0), "hash_ids": hs,
                     "session": sid if isinstance(sid, (str, int)) and not isinstance(sid, bool) else None})
    if not rows:
        raise InputError(f"{source}: no requests in the trace")
    rows.sort(key=lambda r: float(r["t"]))
    return rows


def build_trace(ref: str, n: int, tokenizer: Any = None, chat: bool = False, ignore_eos: bool = True,
                speed: float = 1.0) -> Workload:
    """Requests of a Mooncake trace with their send offsets (÷ speed); at most n of them."""
    if not (speed > 0 and math.isfinite(speed)):
        raise InputError(f"--trace-speed must be a positive number (got {speed})")
    if ref == "synthetic":
        from importlib import resources

        raw = resources.files("runbook.corpus").joinpath("data").joinpath(SYNTHETIC_TRACE).read_bytes()
        text, source = raw.decode(), f"corpus {SYNTHETIC_TRACE}"
    else:
        path = Path(ref)
        if not path.is_file():
            raise InputError(f"--workload trace:{ref}: no such file (a Mooncake JSON Lines trace, an SGLang request dump "
                             ".pkl, or trace:synthetic)")
        raw, text = read_workload_file(path, dump_ok=True)
        source = str(path)
    what, skipped = "trace", 0
    if raw[:1] == sglang_dump.PICKLE_MAGIC:
        all_rows, skipped = sglang_dump.rows(raw, source, TRACE_BLOCK)
        rows, what = all_rows[:n], "SGLang request dump"
    else:
        rows = read_trace(text, source)[:n]
    t0 = rows[0]["t"]
    corpus = code_text()
    exact = tokenizer is not None and not chat
    blocks: dict[int, Any] = {}

    def block(h: int) -> Any:
        if h not in blocks:
            start = (h * 2654435761) % max(1, len(corpus) // 2)
            body = corpus[start:] + corpus[:start]
            blocks[h] = (_exact_ids(tokenizer, body, TRACE_BLOCK) if tokenizer is not None
                         else body[: TRACE_BLOCK * CHARS_PER_TOKEN])
        return blocks[h]

    def one(i: int) -> RequestSpec:
        r = rows[i]
        ids = list(r["hash_ids"])
        need = -(-r["input"] // TRACE_BLOCK)
        ids += [-(i + 1) * 1000003 - k for k in range(max(0, need - len(ids)))]   # this request's own blocks
        parts = [block(h) for h in ids[:need]]
        meta: dict[str, Any] = {"scheduled_s": (r["t"] - t0) / speed}
        if r["session"] is not None:
            meta["session"] = r["session"]
        out = max(1, r["output"])
        if tokenizer is not None:
            toks = [t for p in parts for t in p][: r["input"]]
            if exact:
                return RequestSpec(i, toks, out, len(toks), ignore_eos, meta)
            txt = tokenizer.decode(toks)
            return RequestSpec(i, txt, out, _count(tokenizer, txt), ignore_eos, meta)
        txt = "".join(parts)[: r["input"] * CHARS_PER_TOKEN]
        return RequestSpec(i, txt, out, None, ignore_eos, meta)

    schedule = [(r["t"] - t0) / speed for r in rows]
    span = schedule[-1] if schedule else 0.0
    return Workload(f"trace:{ref}", LazyRequests(len(rows), one), exact,
                    f"{what} {source}: {len(rows)} requests over {span:.1f} s (speed ×{speed:g}), open loop"
                    + (f"; {skipped} dump entries without a time or token counts left out" if skipped else ""),
                    f"trace-{hashlib.sha256(raw).hexdigest()[:16]}+{CORPUS_VERSION}", schedule)
