"""What an FP8 KV cache costs, measured offline: real FP8 arithmetic (ml_dtypes) on real and synthetic keys
and values, under the scalings SGLang can use, against a BF16 floor. The real K and V come from a decoder's cache
when one is on this machine (accuracy/kvcapture, kvstats: per layer and KV head), else from the MiniLM encoder plus
synthetic decoder-like keys.

Scalings: `scale1` — SGLang's default when the checkpoint has no k/v scales (values are divided by 1.0, so
anything beyond the format's maximum, 448 for E4M3, is clipped); `per_tensor` — one calibrated scale per
layer (amax / max), what a calibrated checkpoint gives; `per_head` — one per KV head (finer than SGLang
supports today, shown as the bound). Attention error is softmax(QKᵀ/√d)·V with quantized K and V against
full precision, for the last query over a growing context.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from runbook.accuracy import minilm
from runbook.core.findings import Finding, Status
from runbook.corpus import code_text
from runbook.model import sglang_names

FORMATS = {"fp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "fp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0),
           "bf16": (ml_dtypes.bfloat16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))}
LABEL = {"fp8_e4m3": "FP8 E4M3", "fp8_e5m2": "FP8 E5M2", "bf16": "BF16"}
SCALINGS = ("scale1", "per_tensor", "per_head")


@dataclass
class Quantized:
    x: np.ndarray            # dequantized values, float32
    clipped_frac: float      # |x/scale| beyond the format's maximum (saturated)
    flushed_frac: float      # non-zero values that became zero


def quantize(x: np.ndarray, fmt: str, scale: Any = 1.0) -> Quantized:
    """Round x/scale to `fmt` (saturating at its maximum), then multiply back."""
    dtype, fmax = FORMATS[fmt]
    s = np.asarray(scale, dtype=np.float32)
    y = x.astype(np.float32) / s
    clipped = float(np.mean(np.abs(y) > fmax))
    q = np.clip(y, -fmax, fmax).astype(dtype).astype(np.float32) * s
    flushed = float(np.mean((x != 0) & (q == 0)))
    return Quantized(q, clipped, flushed)


def scale_for(x: np.ndarray, fmt: str, scaling: str) -> Any:
    """x is [heads, seq, dim]. scale1 → 1.0; per_tensor → amax/max; per_head → per-head amax/max."""
    fmax = FORMATS[fmt][1]
    if scaling == "scale1" or fmt == "bf16":
        return 1.0
    if scaling == "per_tensor":
        return max(float(np.abs(x).max()) / fmax, 1e-12)
    if scaling == "per_head":
        return np.maximum(np.abs(x).max(axis=(1, 2), keepdims=True) / fmax, 1e-12)
    raise ValueError(f"unknown scaling {scaling!r}")


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(a - ref) / den) if den else 0.0


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(QKᵀ/√d)·V per head; q [h, m, d], k/v [h, n, d]."""
    # einsum, not `@`: numpy's batched matmul on these small stacks ran 30x slower here (BLAS threads on 2 busy cores)
    s = np.einsum("hmd,hnd->hmn", q, k) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hmn,hnd->hmd", s / s.sum(-1, keepdims=True), v)


def attn_error(q: np.ndarray, k: np.ndarray, v: np.ndarray, kq: np.ndarray, vq: np.ndarray, length: int, queries: int = 8) -> float:
    """Relative error of the attention output of the last `queries` positions over the first `length` keys."""
    qq = q[:, max(0, length - queries):length]
    return rel_err(attention(qq, kq[:, :length], vq[:, :length]), attention(qq, k[:, :length], v[:, :length]))


def synthetic(seed: int = 0, heads: int = 2, seq: int = 8192, dim: int = 128, outliers: int = 4,
              outlier_scale: float = 200.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SYNTHETIC keys with a few large outlier channels (as decoder LLMs show), values and queries."""
    rng = np.random.default_rng(seed)
    ch = np.ones(dim, dtype=np.float32)
    ch[rng.choice(dim, outliers, replace=False)] = outlier_scale
    k = (rng.standard_normal((heads, seq, dim)) * ch).astype(np.float32) + 2.0
    v = rng.standard_normal((heads, seq, dim)).astype(np.float32)
    q = (rng.standard_normal((heads, seq, dim)) / ch).astype(np.float32)
    return q, k, v


@dataclass
class Study:
    source: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    growth: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    kind: str = "minilm"                                          # "decoder" when a decoder's cached K/V were measured
    decoder: dict[str, Any] = field(default_factory=dict)         # kvstudy.decoder_data: heads, layers, scales, capture

    def data(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "rows": self.rows, "growth": self.growth, **self.decoder}

    def to_json(self) -> dict[str, Any]:
        return {**self.data(), "findings": [f.to_dict() for f in self.findings]}


def study_layer(layer: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, source: str, lengths: Sequence[int],
                formats: Sequence[str] = ("fp8_e4m3", "fp8_e5m2", "bf16")) -> tuple[list[dict], list[dict]]:
    rows, growth = [], []
    for fmt in formats:
        for scaling in (SCALINGS if fmt != "bf16" else ("scale1",)):
            kq = quantize(k, fmt, scale_for(k, fmt, scaling))
            vq = quantize(v, fmt, scale_for(v, fmt, scaling))
            n = k.shape[1]
            errs = {L: attn_error(q, k, v, kq.x, vq.x, L) for L in lengths if n >= L}
            rows.append({"source": source, "format": fmt, "scaling": "none" if fmt == "bf16" else scaling, "layer": layer,
                         "k_rel_err": rel_err(kq.x, k), "v_rel_err": rel_err(vq.x, v),
                         "clipped_frac": kq.clipped_frac, "v_clipped_frac": vq.clipped_frac, "flushed_frac": kq.flushed_frac,
                         "attn_out_rel_err": errs[max(errs)] if errs else None, "k_absmax": float(np.abs(k).max())})
            growth += [{"source": source, "format": fmt, "scaling": "none" if fmt == "bf16" else scaling, "layer": layer,
                        "length": L, "attn_out_rel_err": e} for L, e in errs.items()]
    return rows, growth


def active_format(kv_dtype: str, scale_coverage: str = "unknown") -> tuple[str, str]:
    """The study's (format, scaling) for a deployment's effective KV dtype and its k/v scales."""
    name = sglang_names.kv_dtype_name(kv_dtype)
    if name in sglang_names.FP8_KV:
        return name, ("per_tensor" if scale_coverage in ("all", "file") else "scale1")
    return "bf16", "none"


def run(thresholds: Any = None, text: str | None = None, real_lengths: Sequence[int] = (64, 128, 256, 512),
        synth_lengths: Sequence[int] = (512, 2048, 8192), seed: int = 0, active: tuple[str, str] = ("bf16", "none"),
        decoder: Mapping[str, Any] | None = None) -> Study:
    """The whole study: a decoder's cached K/V when `decoder` is given (kvstats.summarize's rows and growth, with
    `source`), else MiniLM's real activations (≤512 tokens) plus long synthetic sequences."""
    if decoder is not None:
        st = Study(source=str(decoder["source"]), rows=list(decoder["rows"]), growth=list(decoder["growth"]), kind="decoder")
        st.findings = findings(st.rows, thresholds, active)
        return st
    st = Study(source=f"real: {minilm.MODEL_NAME}; synthetic: decoder-like keys with outlier channels (labelled 'synthetic')")
    for acts in minilm.activations(text or code_text()):
        r, g = study_layer(acts.layer, acts.q, acts.k, acts.v, "minilm (real, encoder)", real_lengths)
        st.rows += r
        st.growth += g
    q, k, v = synthetic(seed, seq=max(synth_lengths))
    r, g = study_layer("synthetic", q, k, v, "synthetic (outlier channels)", synth_lengths)
    st.rows += r
    st.growth += g
    st.findings = findings(st.rows, thresholds, active)
    return st


def findings(rows: list[dict[str, Any]], t: Any = None, active: tuple[str, str] = ("bf16", "none")) -> list[Finding]:
    """Thresholds apply to the deployment's own (format, scaling); the other rows are there for comparison
    (info). Synthetic data can warn, never fail: it is an assumption, not a measurement of the model."""
    cw = getattr(t, "clipped_frac_warn", 0.001)
    cf = getattr(t, "clipped_frac_fail", 0.01)
    aw = getattr(t, "attn_rel_err_warn", 0.01)
    af = getattr(t, "attn_rel_err_fail", 0.05)
    out: list[Finding] = []
    seen: dict[tuple, dict] = {}
    for r in rows:
        key = (r["source"], r["format"], r["scaling"])
        worst = seen.get(key)
        if worst is None or (r["clipped_frac"], r["attn_out_rel_err"] or 0) > (worst["clipped_frac"], worst["attn_out_rel_err"] or 0):
            seen[key] = r
    for (source, fmt, scaling), r in seen.items():
        att = r["attn_out_rel_err"] or 0.0
        clip = r["clipped_frac"]
        status: Status = "fail" if clip >= cf or att >= af else "warn" if clip >= cw or att >= aw else "pass"
        mine = (fmt, scaling) == active
        if not mine:
            status = "info"
        elif source.startswith("synthetic") and status == "fail":
            status = "warn"
        sc = {"scale1": "scale 1.0", "per_tensor": "calibrated per-tensor scale", "per_head": "per-head scale", "none": ""}[scaling]
        where = f"layer {r['layer']}" if r["layer"] != "synthetic" else "synthetic keys"
        title = (f"{'this deployment: ' if mine else ''}{LABEL[fmt]}{', ' + sc if sc else ''}: {clip:.1%} of K values clipped "
                 f"in {where}; attention output error {att:.2%}")
        out.append(Finding(f"accuracy.kvquant.{fmt}.{scaling}.{source.split()[0]}", status, title,
                           detail=f"{source}; K relative error {r['k_rel_err']:.2%}, V {r['v_rel_err']:.2%}, flushed to "
                                  f"zero {r['flushed_frac']:.2%}",
                           remedy="" if status in ("pass", "info") else
                           ("Use calibrated k/v scales or --kv-cache-dtype bf16." if scaling == "scale1" else
                            "Measure on the real model (recall probe) before relying on FP8 KV for long contexts.")))
    return out
