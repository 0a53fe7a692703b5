"""What the K and V a decoder caches look like, and what each storage format does to them (pure numpy).

Input: the captured FP32 K (after RoPE) and V per layer, [windows, kv_heads, tokens, head_dim], and the queries
at a few positions (accuracy/kvjob.py). Per layer and KV head: |x|'s maximum and percentiles and the share beyond
FP8 E4M3's ±448 and E5M2's ±57,344 at scale 1.0. Per layer and storage format: the relative error of K and V and of
the attention output, with kvquant's definitions and ml_dtypes casts (kvquant.quantize, rel_err, attention).

Calibration: one scale per layer for K and one for V, absmax / the format's maximum, from the first half of the
windows; the errors are measured on the other half (held out), so a calibrated scale that a new text exceeds shows
as clipping. Absmax, not a percentile: in a floating-point format a scale moves the representable range without
changing the relative step (3 mantissa bits for E4M3 at any scale), so the only cost of a larger scale is that the
smallest values (below 2⁻⁹·scale for E4M3) flush to zero, while a percentile scale would clip exactly the outlier
channels that dominate q·k. One scale per layer is what SGLang's k_scale / v_scale hold (a per-tensor scalar per
RadixAttention: sglang/srt/layers/quantization/kv_cache.py:39-43).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runbook.accuracy.kvquant import FORMATS, attention, quantize, rel_err

E4M3_MAX = FORMATS["fp8_e4m3"][1]
E5M2_MAX = FORMATS["fp8_e5m2"][1]
PERCENTILES = (50.0, 99.0, 99.9)
QUERIES = 8          # kvquant.attn_error's definition: the last 8 query positions over the first `length` keys
# (format, scaling) pairs measured on the decoder: scale 1.0 (SGLang without scales), calibrated per layer, BF16.
VARIANTS = (("fp8_e4m3", "scale1"), ("fp8_e4m3", "per_tensor"), ("fp8_e5m2", "scale1"), ("fp8_e5m2", "per_tensor"),
            ("bf16", "none"))


def query_positions(lengths: Sequence[int], queries: int = QUERIES) -> list[int]:
    """The positions whose queries the capture keeps: the last `queries` before each length."""
    return sorted({p for L in lengths for p in range(max(0, L - queries), L)})


def head_stats(x: np.ndarray) -> list[dict[str, float]]:
    """Per KV head of x [windows, kv_heads, tokens, head_dim]: absmax, |x| percentiles, shares beyond FP8's ranges."""
    out = []
    for h in range(x.shape[1]):
        a = np.abs(x[:, h]).ravel()
        p = np.percentile(a, PERCENTILES)
        out.append({"absmax": float(a.max()), "p50": float(p[0]), "p99": float(p[1]), "p99_9": float(p[2]),
                    "e4m3_clip_share": float(np.mean(a > E4M3_MAX)), "e5m2_clip_share": float(np.mean(a > E5M2_MAX))})
    return out


def calibrated_scale(x: np.ndarray, fmt: str) -> float:
    """One per-tensor scale: absmax / the format's maximum (1.0 for BF16; never 0)."""
    if fmt == "bf16":
        return 1.0
    return max(float(np.abs(x).max()) / FORMATS[fmt][1], 1e-12)


def _grouped(q: np.ndarray, kv_heads: int) -> np.ndarray:
    """[heads, m, d] → [kv_heads, r·m, d]: query heads j·r … j·r+r−1 share KV head j (transformers' repeat_kv), so
    attention over [kv_heads, …] keys equals attention with the KV heads repeated, without copying them."""
    h, m, d = q.shape
    return q.reshape(kv_heads, (h // kv_heads) * m, d)


def attn_outputs(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: Sequence[int],
                 lengths: Sequence[int]) -> dict[int, np.ndarray]:
    """Attention output per length, every window stacked: the last QUERIES queries before the length against the
    first `length` keys (kvquant.attn_error's definition). q [windows, heads, len(positions), d]; k, v [windows,
    kv_heads, tokens, d]."""
    idx = {p: i for i, p in enumerate(positions)}
    out = {}
    for L in lengths:
        if k.shape[2] < L:
            continue
        rows = [idx[p] for p in range(max(0, L - QUERIES), L)]
        out[L] = np.stack([attention(_grouped(q[w][:, rows], k.shape[1]), k[w, :, :L], v[w, :, :L]) for w in range(k.shape[0])])
    return out


def attn_errors(q: np.ndarray, k: np.ndarray, v: np.ndarray, kq: np.ndarray, vq: np.ndarray, positions: Sequence[int],
                lengths: Sequence[int], ref: dict[int, np.ndarray] | None = None) -> dict[int, float]:
    """Relative error of the attention output per length, quantized K and V (kq, vq) against FP32 (k, v, or the
    reference outputs `ref` already computed from them)."""
    ref = ref if ref is not None else attn_outputs(q, k, v, positions, lengths)
    got = attn_outputs(q, kq, vq, positions, lengths)
    return {L: rel_err(got[L], ref[L]) for L in ref}


def layer_rows(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: Sequence[int], lengths: Sequence[int],
               calib: int, source: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float]]:
    """One layer's rows (kvquant's row keys), growth and its calibrated scales. Scales come from windows [:calib];
    the errors from windows [calib:] (all of them when there is one window)."""
    ev = slice(calib, None) if k.shape[0] > calib else slice(None)
    kc, vc = k[:calib], v[:calib]
    scales = {"k_e4m3": calibrated_scale(kc, "fp8_e4m3"), "v_e4m3": calibrated_scale(vc, "fp8_e4m3"),
              "k_e5m2": calibrated_scale(kc, "fp8_e5m2"), "v_e5m2": calibrated_scale(vc, "fp8_e5m2")}
    k, v, q = k[ev], v[ev], q[ev]
    rows, growth = [], []
    ref = attn_outputs(q, k, v, positions, lengths)
    for fmt, scaling in VARIANTS:
        tag = fmt.split("_")[-1]
        sk, sv = (scales[f"k_{tag}"], scales[f"v_{tag}"]) if scaling == "per_tensor" else (1.0, 1.0)
        kq, vq = quantize(k, fmt, sk), quantize(v, fmt, sv)
        errs = attn_errors(q, k, v, kq.x, vq.x, positions, lengths, ref)
        rows.append({"source": source, "format": fmt, "scaling": scaling, "layer": layer, "k_rel_err": rel_err(kq.x, k),
                     "v_rel_err": rel_err(vq.x, v), "clipped_frac": kq.clipped_frac, "v_clipped_frac": vq.clipped_frac,
                     "flushed_frac": kq.flushed_frac, "v_flushed_frac": vq.flushed_frac,
                     "attn_out_rel_err": errs[max(errs)] if errs else None, "k_absmax": float(np.abs(k).max()),
                     "k_scale": sk, "v_scale": sv})
        growth += [{"source": source, "format": fmt, "scaling": scaling, "layer": layer, "length": L, "attn_out_rel_err": e}
                   for L, e in errs.items()]
    return rows, growth, scales


def summarize(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], positions: Sequence[int], lengths: Sequence[int],
              source: str) -> dict[str, Any]:
    """The whole decoder study from a capture (k{L}, v{L}, q{L} per layer): `heads` (one row per layer, KV head and
    tensor), `rows` and `growth` (kvquant's keys, per layer), `scales` (per layer, calibrated on the first half)."""
    heads, rows, growth, scales = [], [], [], []
    for layer in range(int(meta["layers"])):
        k, v, q = arrays[f"k{layer}"], arrays[f"v{layer}"], arrays[f"q{layer}"]
        for tensor, x in (("k", k), ("v", v)):
            heads += [{"layer": layer, "kv_head": h, "tensor": tensor, **s} for h, s in enumerate(head_stats(x))]
        r, g, s = layer_rows(layer, q, k, v, positions, lengths, max(1, k.shape[0] // 2), source)
        rows += r
        growth += g
        scales.append({"layer": layer, **s})
    return {"heads": heads, "rows": rows, "growth": growth, "scales": scales}


def clipping_layers(heads: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per layer, the worst KV head: K's and V's absmax and share beyond E4M3's ±448 (and E5M2's ±57,344) at
    scale 1.0, and whether the layer clips at all."""
    by: dict[int, dict[str, Any]] = {}
    for r in heads:
        row = by.setdefault(int(r["layer"]), {"layer": int(r["layer"]), "k_absmax": 0.0, "v_absmax": 0.0,
                                              "k_e4m3_clip_share": 0.0, "v_e4m3_clip_share": 0.0,
                                              "k_e5m2_clip_share": 0.0, "v_e5m2_clip_share": 0.0})
        t = r["tensor"]
        row[f"{t}_absmax"] = max(row[f"{t}_absmax"], float(r["absmax"]))
        row[f"{t}_e4m3_clip_share"] = max(row[f"{t}_e4m3_clip_share"], float(r["e4m3_clip_share"]))
        row[f"{t}_e5m2_clip_share"] = max(row[f"{t}_e5m2_clip_share"], float(r["e5m2_clip_share"]))
    out = [by[k] for k in sorted(by)]
    for row in out:
        row["clips_e4m3"] = row["k_e4m3_clip_share"] > 0 or row["v_e4m3_clip_share"] > 0
        row["clips_e5m2"] = row["k_e5m2_clip_share"] > 0 or row["v_e5m2_clip_share"] > 0
    return out
