"""A fake SGLang `/generate` that scores prompt tokens from a known next-token model (tests/httpfake.py serves it), so
the KLD probe's plumbing (windows, chunks, offsets, the union of named ids) can be checked against the exact
distributions, and its answers can be broken one field at a time."""
from __future__ import annotations

import math
from contextlib import contextmanager

import httpfake
import numpy as np
from scipy.special import log_softmax


class Model:
    """Next-token logprobs that depend on the previous token and the position (mod 5); `shift` perturbs them."""

    def __init__(self, vocab: int, shift: float = 0.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.table = rng.normal(0, 2.5, (vocab, 5, vocab))
        self.table += shift * np.random.default_rng(seed + 1).normal(0, 1, self.table.shape)

    def logprobs(self, prev: int, pos: int) -> np.ndarray:
        return log_softmax(self.table[prev % self.vocab, pos % 5])


def answer(model: Model, body: dict, mode: str = "") -> dict:
    """SGLang 0.5.23's meta_info for `body` (input_ids, logprob_start_len, top_logprobs_num, token_ids_logprob),
    broken as `mode` says."""
    ids, start, k = body["input_ids"], body["logprob_start_len"], body["top_logprobs_num"]
    named = body.get("token_ids_logprob")
    tok, top, nam = [], [], []
    for i in range(start, len(ids)):
        if i == start:            # SGLang 0.5.23: the first entry is null whatever logprob_start_len is
            tok.append([None, ids[i], None])
            top.append(None)
            nam.append(None)
            continue
        lp = model.logprobs(ids[i - 1], i)
        echoed = ids[i] + 1 if mode == "echo" and i == len(ids) - 1 else ids[i]
        value = float("nan") if mode == "nan" and i == len(ids) - 1 else float(lp[ids[i]])
        tok.append([value, echoed, None])
        order = np.argsort(-lp)[: (k - 1 if mode == "ragged" and i == len(ids) - 1 else k)]
        top.append([[float(lp[t]), int(t), None] for t in order])
        if named:
            cell = [[float(lp[t]), int(t), None] for t in named]
            nam.append(cell[1:] if mode == "missing_named" else cell)
    meta = {"id": "x", "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0,
            "input_token_logprobs": tok, "input_top_logprobs": top}
    if named:
        meta["input_token_ids_logprobs"] = nam
    if mode == "no_logprobs":
        meta = {"id": "x", "prompt_tokens": len(ids)}
    return {"text": "x", "output_ids": [0], "meta_info": meta}


@contextmanager
def serve(model: Model, mode: str = "", context: int = 4096, kv: str = "auto", generate: bool = True, model_path: str = "/m"):
    """A fake SGLang at a loopback URL: /v1/models (max_model_len), /server_info, /generate."""
    routes = {"/v1/models": (200, {"object": "list", "data": [{"id": "fake", "max_model_len": context}]}),
              "/server_info": (200, {"version": "0.5.23", "model_path": model_path, "kv_cache_dtype": kv, "context_length": context,
                                      "max_req_input_len": context - 6})}     # SGLang 0.5.23: min(ctx - 1, pool - 1) - 5
    if generate:
        routes["/generate"] = (200, lambda body: answer(model, body, mode))
        routes["/flush_cache?timeout=60"] = (200, lambda body: "Cache flushed.")   # before each floor pass
    with httpfake.serve(routes) as (url, seen):
        yield url, seen


def truth(ref: Model, cand: Model, windows: list[list[int]], k: int) -> np.ndarray:
    """The truncated KLD per position computed straight from the two models (no HTTP): what the probe must report."""
    from runbook.accuracy.kld import position_kld

    out = []
    for w in windows:
        for i in range(1, len(w)):
            p, q = ref.logprobs(w[i - 1], i), cand.logprobs(w[i - 1], i)
            top = np.argsort(-p)[:k]
            out.append(position_kld(p[top][None, :], q[top][None, :])[0])
    assert all(math.isfinite(x) for x in out)
    return np.array(out)
