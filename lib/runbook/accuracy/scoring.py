"""Asking a server to score token ids: SGLang's native `POST /generate` with prompt logprobs, on windows of the
frozen code corpus cut with the model's tokenizer, so that two servers score the very same ids.

- The reference: one request per window, `logprob_start_len` 0 and `top_logprobs_num` k: its top-k per position.
- A candidate (and the reference's own second pass, the noise floor): the window in position chunks [s, e), each
  request `input_ids[:e]` with `logprob_start_len` s − 1 (SGLang's first entry is null, whatever the start),
  `top_logprobs_num` k and `token_ids_logprob` the union of the reference's top-k ids over [s, e). SGLang returns the
  named ids' logprobs at every position of the request, so a chunk keeps the answer bounded (~chunk × (k + union)
  entries). SGLang caps a request's radix-cache prefix at its logprob_start_len (managers/schedule_batch.py:
  `max_prefix_len = min(max_prefix_len, self.logprob_start_len)`; measured: `cached_tokens` = the start), so [s, e) is
  always computed, over a cached [0, s) when the radix cache holds it (else recomputed: costlier, the same
  logprobs); torch_native attention reads every key and value back from the KV pool, so an FP8 pool's rounding
  applies to the cached prefix and the chunk alike.
- SGLang's prompt logprobs are the log-softmax of the raw logits (layers/logprob_processor.py, InputLogprobProcessor:
  `log_softmax(chunk_logits)`, or logits minus their logsumexp on the fast path): no temperature, no penalties.

Every answer is checked before it is used: the ids echoed back must be the ids sent, each position must carry k
finite logprobs and every id asked for. What is wrong is a `ScoringError`, one line naming the server and field."""
from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runbook.accuracy.kld import Scores
from runbook.core.errors import InputError, RunbookError
from runbook.core.numeric import is_number
from runbook.core.secrets import redact_text
from runbook.corpus import code_text
from runbook.endpoint.reach import BadResponse, decode_json, fetch_json

if TYPE_CHECKING:
    import numpy as np

MAX_BODY_BYTES = 256 << 20      # a 2,048-token window's top-20 is ~2 MB; a chunk's named ids ~10 MB
TIMEOUT_S = 900.0               # one request: a long window's prefill on a busy CPU


class ScoringError(RunbookError):
    """A server's answer to a scoring request cannot be used (no logprobs, ragged, not finite, other ids)."""


def windows(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    """`count` consecutive windows of `length` token ids of the frozen code corpus (runbook.corpus.code_text), cut
    with the served model's tokenizer; InputError when the corpus is too short for them."""
    text, need = code_text(), count * length
    cut = text.find("\n", 8 * need)          # a prefix ending at a line: its first `need` tokens are the whole text's
    ids = tokenizer.encode(text[:cut + 1] if cut > 0 else text, add_special_tokens=False).ids
    if len(ids) < need + 64 and cut > 0:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
    if len(ids) < need:
        raise InputError(f"the code corpus is {len(ids):,} tokens with this tokenizer: {count} windows × {length} tokens "
                         f"need {count * length:,}; lower kld_windows or kld_window_tokens")
    return [ids[i * length:(i + 1) * length] for i in range(count)]


def context_length(url: str, api_key: str | None = None, timeout: float = 10.0) -> int | None:
    """The server's context in tokens: /v1/models' max_model_len (SGLang), else /server_info's context_length;
    None when neither says."""
    base = url.rstrip("/")
    try:
        models = fetch_json(base + "/v1/models", api_key, timeout)
        first = (models.get("data") or [{}])[0]
        if isinstance(first, dict) and isinstance(first.get("max_model_len"), int):
            return int(first["max_model_len"])
    except (OSError, ValueError, IndexError):
        pass
    try:
        info = fetch_json(base + "/server_info", api_key, timeout)
        if isinstance(info.get("context_length"), int):
            return int(info["context_length"])
    except (OSError, ValueError):
        pass
    return None


def longest_input(url: str, api_key: str | None = None, timeout: float = 10.0) -> int | None:
    """The most input ids the server takes in one request: SGLang refuses `len(input_ids) >= max_req_input_len`
    (/server_info; 0.5.23 sets it to min(context − 1, KV pool − 1) − 5, managers/tp_worker.py, so 8,185 of an 8,192
    context); None when it does not say."""
    try:
        info = fetch_json(url.rstrip("/") + "/server_info", api_key, timeout)
    except (OSError, ValueError):
        return None
    n = info.get("max_req_input_len") if isinstance(info, dict) else None
    return n - 1 if isinstance(n, int) and not isinstance(n, bool) and n > 1 else None


def check_fits(url: str, length: int, api_key: str | None = None) -> None:
    """InputError before any scoring request when a window is longer than the server's context, or than the input
    it takes in one request."""
    ctx = context_length(url, api_key)
    if ctx is not None and length > ctx:
        raise InputError(f"{url}: a {length:,}-token window is longer than the server's context of {ctx:,} tokens; "
                         f"lower kld_window_tokens to {ctx:,} or less")
    most = longest_input(url, api_key)
    if most is not None and length > most:
        raise InputError(f"{url}: a {length:,}-token window is more input than the server takes in one request "
                         f"({most:,} ids: its max_req_input_len, which reserves room for output); lower "
                         f"kld_window_tokens to {most:,} or less")


@dataclass(frozen=True)
class Request:
    url: str
    api_key: str | None
    top_k: int
    chunk: int = 128


def _entry(x: Any, url: str, where: str) -> tuple[float, int]:
    """One `[logprob, token_id, text]` entry -> (logprob, id)."""
    if not (isinstance(x, (list, tuple)) and len(x) >= 2 and isinstance(x[1], int)):
        raise ScoringError(f"{url}: {where} is {str(x)[:60]!r}, not [logprob, token_id, text]")
    lp = x[0]
    if not is_number(lp) or not math.isfinite(lp):
        raise ScoringError(f"{url}: {where} has logprob {lp!r}: the server returned no finite logprob")
    return float(lp), x[1]


def parse(doc: Any, url: str, ids: Sequence[int], start: int, top_k: int,
          named: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[int, float]]]:
    """One /generate answer for input_ids `ids` with logprob_start_len `start` -> (actual, top_ids, top_lp, named
    logprobs) for positions start+1 … len(ids)−1. SGLang answers one entry per position start … len(ids)−1, the first
    one null whatever `start` is (its logprob needs the logits of the position before: measured on 0.5.23's CPU
    server); ScoringError for anything else."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    meta = doc.get("meta_info") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        raise ScoringError(f"{url}: the answer has no meta_info: not SGLang's /generate")
    tok = meta.get("input_token_logprobs")
    top = meta.get("input_top_logprobs")
    if not isinstance(tok, list) or not isinstance(top, list) or not tok:
        raise ScoringError(f"{url}: meta_info has no input_token_logprobs/input_top_logprobs: the server returned no "
                           "prompt logprobs (return_logprob ignored?)")
    n = len(ids) - start
    if len(tok) != n or len(top) != n:
        raise ScoringError(f"{url}: {len(tok)} input_token_logprobs and {len(top)} input_top_logprobs for {n} positions "
                           f"(input_ids {len(ids)}, logprob_start_len {start}): ragged answer")
    got_named = meta.get("input_token_ids_logprobs") if named else None
    if named and (not isinstance(got_named, list) or len(got_named) != n):
        raise ScoringError(f"{url}: input_token_ids_logprobs missing or not one entry per position "
                           f"({len(got_named) if isinstance(got_named, list) else 'none'} for {n})")
    first = start + 1
    m = len(ids) - first
    actual = np.empty(m)
    top_ids = np.empty((m, top_k), dtype=np.int64)
    top_lp = np.empty((m, top_k))
    at: list[dict[int, float]] = []
    for j, i in enumerate(range(first, len(ids))):
        r = i - start
        lp, tid = _entry(tok[r], url, f"input_token_logprobs[{r}]")
        if tid != ids[i]:
            raise ScoringError(f"{url}: position {i} echoed token id {tid} where {ids[i]} was sent: the server "
                               "re-tokenized the input (mismatched tokenizer); refusing to compare")
        actual[j] = lp
        row = top[r]
        if not isinstance(row, list) or len(row) != top_k:
            raise ScoringError(f"{url}: input_top_logprobs[{r}] has {len(row) if isinstance(row, list) else 'no'} "
                               f"entries, {top_k} asked for")
        for c, e in enumerate(row):
            top_lp[j, c], top_ids[j, c] = _entry(e, url, f"input_top_logprobs[{r}][{c}]")
        if named and got_named is not None:
            cell = got_named[r]
            if not isinstance(cell, list):
                raise ScoringError(f"{url}: input_token_ids_logprobs[{r}] is {str(cell)[:40]!r}, not a list")
            at.append(dict(_entry(e, url, f"input_token_ids_logprobs[{r}]")[::-1] for e in cell))  # type: ignore[misc]
    return actual, top_ids, top_lp, at


def _post(url: str, body: dict[str, Any], api_key: str | None) -> bytes:
    """One POST, its answer read to at most MAX_BODY_BYTES. Blocking, so it runs in a thread: aiohttp dropped
    SGLang's 30 MB answers mid-body on this host (ServerDisconnectedError) where the standard library read them whole."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            raw = r.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as e:
        head = " ".join(e.read(160).decode("utf-8", "replace").split())
        if e.code == 404:
            raise ScoringError(f"{url}: HTTP 404: no native /generate (not SGLang): this server cannot score prompt "
                               "tokens by id") from None
        raise ScoringError(f"{url}: HTTP {e.code}: {head}") from None
    except TimeoutError:
        raise ScoringError(f"{url}: no answer within {TIMEOUT_S:g} s") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        why = getattr(e, "reason", None) or e
        raise ScoringError(f"{url}: {type(e).__name__}: {' '.join(str(why).split())[:160]}") from None
    if len(raw) > MAX_BODY_BYTES:
        raise ScoringError(f"{url}: answer larger than the {MAX_BODY_BYTES:,} bytes allowed: lower kld_chunk")
    return raw


def flush(url: str, api_key: str | None = None, wait_s: float = 60.0) -> None:
    """SGLang's `POST /flush_cache` (waiting up to wait_s for requests in flight): the reference's next pass then
    computes every prefix in the candidate's chunk shapes, as a restarted server does, instead of reading the KV its
    own one-pass scoring left in the radix cache. Measured on the real model: with that KV the second pass was
    identical to the reference (a floor of 0) while a restart differed by 0.0016 nats past 1,024 tokens.
    ScoringError when the server refuses."""
    try:
        _post(url.rstrip("/") + f"/flush_cache?timeout={wait_s:g}", {}, api_key)
    except ScoringError as e:
        raise ScoringError(f"{e} (flushing the radix cache before the noise floor's pass; record on a server with no "
                           "other requests, or give --floor-url)") from None


async def _generate(pool: concurrent.futures.Executor, rq: Request, ids: Sequence[int], start: int,
                    named: Sequence[int] | None) -> Any:
    body: dict[str, Any] = {"input_ids": list(ids), "return_logprob": True, "logprob_start_len": start,
                            "top_logprobs_num": rq.top_k, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    if named:
        body["token_ids_logprob"] = list(named)
    url = rq.url.rstrip("/") + "/generate"
    raw = await asyncio.get_running_loop().run_in_executor(pool, _post, url, body, rq.api_key)
    try:
        return decode_json(url, raw)
    except BadResponse as e:
        raise ScoringError(f"{url}: not SGLang's JSON: {e.reason}") from None


async def _reference_window(pool: concurrent.futures.Executor, rq: Request, ids: Sequence[int]) -> Scores:
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    doc = await _generate(pool, rq, ids, 0, None)
    actual, top_ids, top_lp, _ = parse(doc, rq.url, ids, 0, rq.top_k, None)
    return Scores(np.asarray(ids, dtype=np.int64), actual, top_ids, top_lp)


async def _candidate_window(pool: concurrent.futures.Executor, rq: Request, ref: Scores) -> Scores:
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    ids = ref.ids.tolist()
    parts = []
    for lo in range(1, len(ids), rq.chunk):       # positions [lo, e): logprob_start_len lo − 1, whose entry is null
        e = min(len(ids), lo + rq.chunk)
        union = sorted({int(x) for x in ref.top_ids[lo - 1:e - 1].ravel()})
        doc = await _generate(pool, rq, ids[:e], lo - 1, union)
        actual, top_ids, top_lp, at = parse(doc, rq.url, ids[:e], lo - 1, rq.top_k, union)
        want = ref.top_ids[lo - 1:e - 1]
        at_ref = np.empty(want.shape)
        for j, row in enumerate(want):
            try:
                at_ref[j] = [at[j][int(t)] for t in row]
            except KeyError as k:
                raise ScoringError(f"{rq.url}: position {lo + j}: no logprob for token id {k} named in token_ids_logprob"
                                   ) from None
        parts.append((actual, top_ids, top_lp, at_ref))
    return Scores(ref.ids, *(np.concatenate([p[i] for p in parts]) for i in range(4)))


async def _run(jobs: Sequence[Any], one: Any, rq: Request, concurrency: int) -> list[Scores]:
    """`one(rq, job)` for every job, `concurrency` in flight, each request in a thread of a pool that size."""
    n = max(1, concurrency)
    sem = asyncio.Semaphore(n)
    with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="kld") as pool:
        async def go(job: Any) -> Scores:
            async with sem:
                return await one(pool, rq, job)
        return list(await asyncio.gather(*(go(j) for j in jobs)))


async def score_reference(rq: Request, wins: Sequence[Sequence[int]], concurrency: int = 1) -> list[Scores]:
    """The reference's top-k at every position of each window."""
    return await _guard(rq, _run(wins, _reference_window, rq, concurrency))


async def score_candidate(rq: Request, ref: Sequence[Scores], concurrency: int = 1) -> list[Scores]:
    """A candidate on the reference's windows: its own top-k and the logprobs of the reference's top-k ids.
    `concurrency` windows in flight at once (the floor's batch pass); a window's chunks go in order."""
    return await _guard(rq, _run(ref, _candidate_window, rq, concurrency))


async def _guard(rq: Request, coro: Any) -> list[Scores]:
    """The API key never appears in an error, even when the server echoes it."""
    try:
        return list(await coro)
    except ScoringError as e:
        if rq.api_key:
            raise ScoringError(redact_text(str(e), [rq.api_key])) from None
        raise
