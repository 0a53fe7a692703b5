"""KL divergence of a candidate server's next-token distributions from a reference's, on the same token ids: what
llama.cpp's `llama-perplexity --kl-divergence` reports (PPL ratio, mean KLD ± its uncertainty, KLD percentiles, Δp,
same top token), overall and per depth bucket, with a paired bootstrap over windows. Pure numpy: scoring.py asks
the servers; this module only counts.

Truncation. A server returns the logprobs of its top-k tokens, not the whole vocabulary. At each position P is the
reference's distribution over its own top-k ids plus ONE tail bucket (P_tail = 1 − ΣP_topk) and Q is the candidate's
over the same k ids plus its own tail (Q_tail = 1 − ΣQ over those ids). KL(P‖Q) between these (k+1)-point
distributions is a coarsening of the full-vocabulary KLD, so it is never larger (the data-processing inequality) and
approaches it as k grows; llama.cpp's figure is the full-vocabulary one. A tail probability the candidate rounds to
zero while the reference's is not is floored at PROB_FLOOR, and so is a reference tail below it (two tails that
are both rounding noise contribute nothing): the only place a floor enters."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runbook.core.errors import InputError
from runbook.core.findings import Finding, Status

if TYPE_CHECKING:
    import numpy as np

PROB_FLOOR = 1e-10          # a candidate tail rounded to 0: KLD stays finite (ln 1e-10 = −23 nats per unit of P_tail)
LOGPROB_SLACK = 1e-3        # a float32 log-softmax may round the top token's logprob a hair above 0
N_BOOT = 2000
SEED = 0
KLD_PERCENTILES = (("kld_median", 50.0), ("kld_p90", 90.0), ("kld_p99", 99.0), ("kld_p999", 99.9))
DP_PERCENTILES = (("dp_p1", 1.0), ("dp_p5", 5.0), ("dp_median", 50.0), ("dp_p95", 95.0), ("dp_p99", 99.0))

# Verdict thresholds, on the candidate's mean KLD above the noise floor (nats) and its drop in same-top-1 agreement
# (percentage points). Anchored on llama.cpp's Llama 3 8B scoreboard against FP16 (tools/perplexity/README.md):
# Q8_0 weights 0.0008-0.0014 nats, 98.5 % same top token; Q6_K 0.0047-0.0057, 96.6 %; Q5_K_M 0.011; Q4_K_M
# 0.029-0.032, 92.2 %. Within Q8_0's shift (1.5 points of top-1) practitioners call a change lossless: PASS. From
# Q5_K_M's shift up, or 5 points of top-1 (between Q6_K's 3.4 and Q4_K_M's 7.8), a change is MATERIAL for code, where
# one different token in a long completion (an identifier, a bracket) changes everything after it: FAIL. Between: WARN.
PASS_KLD = 0.001
FAIL_KLD = 0.01
PASS_TOP1_PTS = 1.5
FAIL_TOP1_PTS = 5.0
# The tail (SGLang's KL-consistency practice judges the share of positions in the tail and the maximum, not only the
# mean): a position whose KLD exceeds TAIL_KLD nats is one where the candidate's next-token distribution is materially
# another one (docs/accuracy.md: why this value).
TAIL_KLD = 0.1
# The verdict on the tail, in percentage points of positions above TAIL_KLD beyond the floor's share: pass below one
# position in a thousand, fail from one in a hundred (in a 500-token completion, five tokens drawn from a materially
# other distribution); an excess within the counts' own noise (TAIL_SIGMAS standard deviations of the difference of
# two Poisson counts) is not measurable and never decides (docs/accuracy.md: why these values).
PASS_TAIL_PTS = 0.1
FAIL_TAIL_PTS = 1.0
TAIL_SIGMAS = 2.0
REFERENCE_TABLE = ("llama.cpp's Llama 3 8B vs FP16: Q8_0 weights 0.0014 nats / 98.5 % same top token, Q6_K 0.0057 / "
                   "96.6 %, Q4_K_M 0.032 / 92.2 %")


@dataclass(frozen=True)
class Scores:
    """One window as one server scored it. Position i (1 … n−1) predicts ids[i] from ids[:i]; row i−1 of each array
    belongs to position i (its depth: i tokens of context)."""
    ids: np.ndarray                      # (n,) the token ids sent
    actual: np.ndarray                   # (n−1,) logprob of ids[i]
    top_ids: np.ndarray                  # (n−1, k) the server's own top-k ids
    top_lp: np.ndarray                   # (n−1, k) their logprobs
    at_ref: np.ndarray | None = None     # (n−1, k) logprobs of the reference's top_ids (a candidate's scores only)

    @property
    def positions(self) -> int:
        return int(self.actual.shape[0])


def check_scores(s: Scores, what: str = "scores") -> None:
    """InputError naming the field when a window's arrays are ragged, not finite, or not logprobs."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    n = s.ids.shape[0] if s.ids.ndim == 1 else -1
    if n < 2:
        raise InputError(f"{what}: ids must be a list of at least 2 token ids, got shape {s.ids.shape}")
    if s.actual.shape != (n - 1,):
        raise InputError(f"{what}: actual has shape {s.actual.shape}, expected ({n - 1},): one per position after the first")
    if s.top_ids.ndim != 2 or s.top_ids.shape[0] != n - 1 or s.top_ids.shape[1] < 1:
        raise InputError(f"{what}: top_ids has shape {s.top_ids.shape}, expected ({n - 1}, k)")
    if s.top_lp.shape != s.top_ids.shape:
        raise InputError(f"{what}: top_lp has shape {s.top_lp.shape}, top_ids {s.top_ids.shape}: ragged top-k")
    arrays = [("actual", s.actual), ("top_lp", s.top_lp)]
    if s.at_ref is not None:
        if s.at_ref.shape != s.top_ids.shape:
            raise InputError(f"{what}: at_ref has shape {s.at_ref.shape}, expected {s.top_ids.shape}")
        arrays.append(("at_ref", s.at_ref))
    for name, a in arrays:
        bad = ~np.isfinite(a)
        if bad.any():
            i = int(np.argwhere(bad)[0][0])
            raise InputError(f"{what}: {name} is not finite at position {i + 1} ({a.flat[np.flatnonzero(bad)[0]]}): "
                             "the server returned NaN or infinity")
        if (a > LOGPROB_SLACK).any():
            i = int(np.argwhere(a > LOGPROB_SLACK)[0][0])
            raise InputError(f"{what}: {name} at position {i + 1} is above 0: not a logprob")


def position_kld(p_lp: np.ndarray, q_lp: np.ndarray) -> np.ndarray:
    """KL(P‖Q) per row, in nats, over the k ids of each row plus one tail bucket each (the module's truncation).
    p_lp, q_lp: (m, k) logprobs of the same ids under P and Q."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    p, q = np.exp(p_lp.astype(np.float64)), np.exp(q_lp.astype(np.float64))
    p_tail = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    q_tail = np.clip(1.0 - q.sum(axis=1), 0.0, 1.0)
    head = (p * (p_lp.astype(np.float64) - q_lp.astype(np.float64))).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_tail > 0, p_tail * (np.log(np.maximum(p_tail, PROB_FLOOR)) - np.log(np.maximum(q_tail, PROB_FLOOR))), 0.0)
    return head + tail


@dataclass
class Positions:
    """Every scored position of a comparison, flattened over windows."""
    window: np.ndarray      # (m,) window index
    depth: np.ndarray       # (m,) tokens of context before the predicted token
    kld: np.ndarray
    same_top1: np.ndarray   # bool
    dp: np.ndarray          # Q(actual) − P(actual)
    lp_ref: np.ndarray      # ln P(actual)
    lp_cand: np.ndarray


def positions(ref: Sequence[Scores], cand: Sequence[Scores]) -> Positions:
    """Per-position statistics; InputError when the windows or their token ids differ (the probe never compares
    different tokens: mismatched tokenizers), or the candidate lacks the reference's top-k logprobs."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    if len(ref) != len(cand) or not ref:
        raise InputError(f"the reference scored {len(ref)} windows and the candidate {len(cand)}: compare the same windows")
    parts: list[tuple[np.ndarray, ...]] = []
    for w, (r, c) in enumerate(zip(ref, cand, strict=True)):
        check_scores(r, f"reference window {w}")
        check_scores(c, f"candidate window {w}")
        if r.ids.shape != c.ids.shape or not np.array_equal(r.ids, c.ids):
            at = int(np.argmax(r.ids != c.ids)) if r.ids.shape == c.ids.shape else min(len(r.ids), len(c.ids))
            raise InputError(f"window {w}: the two servers scored different token ids (first at position {at}): "
                             "refusing to compare; give both servers the same tokenizer")
        if c.at_ref is None:
            raise InputError(f"candidate window {w}: no logprobs of the reference's top-k ids (score it with the reference)")
        kld = position_kld(r.top_lp, c.at_ref)
        same = r.top_ids[np.arange(r.positions), r.top_lp.argmax(axis=1)] == c.top_ids[np.arange(c.positions), c.top_lp.argmax(axis=1)]
        dp = np.exp(c.actual.astype(np.float64)) - np.exp(r.actual.astype(np.float64))
        parts.append((np.full(r.positions, w), np.arange(1, r.positions + 1), kld, same, dp,
                      r.actual.astype(np.float64), c.actual.astype(np.float64)))
    cols = [np.concatenate([p[i] for p in parts]) for i in range(7)]
    return Positions(*cols)


def depth_buckets(window_tokens: int) -> list[tuple[int, int]]:
    """[from, to) depth buckets up to the window: [1,128), [128,512), [512,1024), then doubling; the last ends at
    the window's length."""
    edges = [1, 128, 512, 1024]
    while edges[-1] < window_tokens:
        edges.append(edges[-1] * 2)
    edges = [e for e in edges if e < window_tokens] + [window_tokens]
    return list(zip(edges[:-1], edges[1:], strict=False))


def summary(p: Positions, mask: np.ndarray | None = None) -> dict[str, Any]:
    """llama.cpp's statistics over the positions in `mask` (all when None). Probabilities and Δp as fractions."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    m = np.ones(p.kld.shape, bool) if mask is None else mask
    n = int(m.sum())
    if n == 0:
        return {"positions": 0}
    kld, dp = p.kld[m], p.dp[m]
    out: dict[str, Any] = {"positions": n,
                           "ppl_ref": float(np.exp(-p.lp_ref[m].mean())), "ppl_cand": float(np.exp(-p.lp_cand[m].mean())),
                           "ppl_ratio": float(np.exp((p.lp_ref[m] - p.lp_cand[m]).mean())),
                           "kld_mean": float(kld.mean()),
                           "kld_se": float(kld.std(ddof=1) / np.sqrt(n)) if n > 1 else None,
                           "kld_max": float(kld.max())}
    out.update({k: float(np.percentile(kld, q)) for k, q in KLD_PERCENTILES})
    out["kld_share_above"] = float((kld > TAIL_KLD).mean())
    out["same_top1"] = float(p.same_top1[m].mean())
    out.update({"dp_mean": float(dp.mean()), "dp_rms": float(np.sqrt((dp ** 2).mean())),
                "dp_min": float(dp.min()), "dp_max": float(dp.max())})
    out.update({k: float(np.percentile(dp, q)) for k, q in DP_PERCENTILES})
    return out


def window_sums(p: Positions, buckets: Sequence[tuple[int, int]], windows: int) -> dict[str, np.ndarray]:
    """(windows, buckets) sums of KLD, of same-top-1 and the position counts: what the bootstrap resamples."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    b = np.full(p.depth.shape, -1)
    for j, (lo, hi) in enumerate(buckets):
        b[(p.depth >= lo) & (p.depth < hi)] = j
    ok = b >= 0
    shape = (windows, len(buckets))
    out = {}
    for name, v in (("kld", p.kld), ("same_top1", p.same_top1.astype(float)), ("count", np.ones(p.kld.shape))):
        a = np.zeros(shape)
        np.add.at(a, (p.window[ok], b[ok]), v[ok])
        out[name] = a
    return out


def _resample(n_windows: int, n_boot: int, seed: int) -> np.ndarray:
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    return np.random.default_rng(seed).integers(0, n_windows, size=(n_boot, n_windows))


def bootstrap(sums: dict[str, np.ndarray], key: str, base: dict[str, np.ndarray] | None = None, n_boot: int = N_BOOT,
              seed: int = SEED, alpha: float = 0.05) -> dict[str, list[float | None]]:
    """Percentile CIs of the mean of `key` (minus base's, paired: the same windows drawn for both), overall
    ("all") and per bucket, resampling whole windows (positions within a window are correlated)."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    w = sums["count"].shape[0]
    idx = _resample(w, n_boot, seed)

    def means(s: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        num, cnt = s[key][idx].sum(axis=1), s["count"][idx].sum(axis=1)          # (n_boot, buckets)
        with np.errstate(divide="ignore", invalid="ignore"):
            return num / cnt, num.sum(axis=1) / cnt.sum(axis=1)
    per, overall = means(sums)
    if base is not None:
        bper, boverall = means(base)
        per, overall = per - bper, overall - boverall

    def ci(a: np.ndarray) -> list[float | None]:
        a = a[np.isfinite(a)]
        if a.size == 0:
            return [None, None]
        return [float(np.percentile(a, 100 * alpha / 2)), float(np.percentile(a, 100 * (1 - alpha / 2)))]
    return {"all": ci(overall), **{str(j): ci(per[:, j]) for j in range(per.shape[1])}}


@dataclass
class KldResult:
    """One candidate against the reference: statistics overall and per depth bucket, and the per-window sums a
    paired comparison with another result (the noise floor) needs."""
    windows: int
    window_tokens: int
    top_k: int
    buckets: list[tuple[int, int]]
    overall: dict[str, Any]
    by_depth: list[dict[str, Any]]
    sums: dict[str, np.ndarray] = field(repr=False)

    def data(self) -> dict[str, Any]:
        return {"windows": self.windows, "window_tokens": self.window_tokens, "top_k": self.top_k,
                "truncation": f"top-{self.top_k} of the reference plus one tail bucket",
                "overall": self.overall, "by_depth": self.by_depth,
                "window_kld_sum": self.sums["kld"].round(9).tolist(), "window_positions": self.sums["count"].astype(int).tolist()}


def compare(ref: Sequence[Scores], cand: Sequence[Scores], n_boot: int = N_BOOT, seed: int = SEED) -> KldResult:
    """The candidate's windows against the reference's (the same token ids): llama.cpp's statistics overall and per
    depth bucket, each mean KLD and same-top-1 with a bootstrap CI over windows."""
    p = positions(ref, cand)
    n = int(ref[0].ids.shape[0])
    buckets = depth_buckets(max(int(r.ids.shape[0]) for r in ref))
    sums = window_sums(p, buckets, len(ref))
    ci_k, ci_t = bootstrap(sums, "kld", n_boot=n_boot, seed=seed), bootstrap(sums, "same_top1", n_boot=n_boot, seed=seed)
    overall = {**summary(p), "kld_ci": ci_k["all"], "same_top1_ci": ci_t["all"]}
    rows = []
    for j, (lo, hi) in enumerate(buckets):
        rows.append({"from": lo, "to": hi, **summary(p, (p.depth >= lo) & (p.depth < hi)),
                     "kld_ci": ci_k[str(j)], "same_top1_ci": ci_t[str(j)]})
    return KldResult(len(ref), n, int(ref[0].top_ids.shape[1]), buckets, overall, rows, sums)


# ---------------------------------------------------------------- the verdict against the noise floor

@dataclass
class Verdict:
    status: Status
    excess_kld: float                 # candidate − floor, mean KLD
    excess_ci: list[float | None]     # paired bootstrap over windows
    top1_drop_pts: float              # floor's same-top-1 − candidate's, in percentage points
    deepest: dict[str, Any]           # the deepest bucket's row of the candidate
    tail_excess_pts: float = 0.0      # candidate's share of positions above TAIL_KLD − floor's, in percentage points
    tail_measurable: bool = False     # that excess beyond the two counts' noise

    def data(self) -> dict[str, Any]:
        return {"status": self.status, "excess_kld": self.excess_kld, "excess_kld_ci": self.excess_ci,
                "top1_drop_pts": self.top1_drop_pts, "tail_excess_pts": self.tail_excess_pts,
                "tail_measurable": self.tail_measurable,
                "deepest_bucket": [self.deepest.get("from"), self.deepest.get("to")],
                "thresholds": {"pass_kld": PASS_KLD, "fail_kld": FAIL_KLD, "pass_top1_pts": PASS_TOP1_PTS,
                               "fail_top1_pts": FAIL_TOP1_PTS, "tail_kld": TAIL_KLD, "pass_tail_pts": PASS_TAIL_PTS,
                               "fail_tail_pts": FAIL_TAIL_PTS}}


def tail_excess(result: dict[str, Any], floor: dict[str, Any]) -> tuple[float, bool]:
    """The candidate's share of positions above TAIL_KLD over the floor's (percentage points), and whether the two
    counts differ by more than TAIL_SIGMAS of their own noise (Poisson: the variance of a count is the count). Both
    were measured on the same positions (judge checks it)."""
    n = result.get("positions") or 0
    if not n:
        return 0.0, False
    c, f = result.get("kld_share_above", 0.0) * n, floor.get("kld_share_above", 0.0) * n
    return 100.0 * (c - f) / n, c - f > TAIL_SIGMAS * math.sqrt(c + f)


def judge(result: KldResult, floor: KldResult, n_boot: int = N_BOOT, seed: int = SEED) -> Verdict:
    """pass: not distinguishable from the floor, or above it by less than Q8_0 weights move a model and with no
    measurable tail; fail: at least Q5_K_M's shift, FAIL_TOP1_PTS fewer positions with the reference's top token, or a
    measurable tail of FAIL_TAIL_PTS more positions above TAIL_KLD; warn in between."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    if result.sums["count"].shape != floor.sums["count"].shape or not np.array_equal(result.sums["count"], floor.sums["count"]):
        raise InputError("the candidate and the noise floor were measured on different windows: measure both on the same")
    excess = result.overall["kld_mean"] - floor.overall["kld_mean"]
    ci = bootstrap(result.sums, "kld", base=floor.sums, n_boot=n_boot, seed=seed)["all"]
    drop = 100.0 * (floor.overall["same_top1"] - result.overall["same_top1"])
    deepest = next((r for r in reversed(result.by_depth) if r.get("positions")), result.overall)
    measurable = ci[0] is not None and ci[0] > 0
    tail, tail_seen = tail_excess(result.overall, floor.overall)
    tail_pts = tail if tail_seen else 0.0        # a tail within the counts' noise decides nothing
    status: Status
    if tail_pts >= FAIL_TAIL_PTS or (measurable and (excess >= FAIL_KLD or drop >= FAIL_TOP1_PTS)):
        status = "fail"
    elif tail_pts < PASS_TAIL_PTS and (not measurable or (excess < PASS_KLD and drop < PASS_TOP1_PTS)):
        status = "pass"
    else:
        status = "warn"
    return Verdict(status, excess, ci, drop, deepest, tail, tail_seen)


def _n(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def verdict(result: KldResult, floor: KldResult, tested: str = "") -> Finding:
    """One finding, in words a long-context coding operator reads: the candidate against the noise floor and the
    thresholds, with what differs between the two servers (`tested`, identity.tested_difference). A caller with its
    own id (tune's guard) replaces it (dataclasses.replace)."""
    v = judge(result, floor)
    o, f = result.overall, floor.overall
    d = v.deepest
    what = f" — {tested}" if tested else ""
    figures = (f"mean KLD {_n(o['kld_mean'], 5)} nats (floor {_n(f['kld_mean'], 5)}; excess 95 % CI "
               f"{_n(v.excess_ci[0], 5)} … {_n(v.excess_ci[1], 5)}), same top-1 {100 * o['same_top1']:.1f} % "
               f"(floor {100 * f['same_top1']:.1f} %), {100 * o.get('kld_share_above', 0.0):.2f} % of positions above "
               f"{TAIL_KLD:g} nats (floor {100 * f.get('kld_share_above', 0.0):.2f} %), PPL ratio {o['ppl_ratio']:.4f}")
    detail = (f"{result.windows} windows × {result.window_tokens} tokens, top-{result.top_k} + tail; deepest bucket "
              f"[{d.get('from')}, {d.get('to')}): mean KLD {_n(d.get('kld_mean'), 5)}, same top-1 "
              f"{100 * (d.get('same_top1') or 0):.1f} %; thresholds: pass below {PASS_KLD} nats, {PASS_TOP1_PTS:g} "
              f"points of top-1 and {PASS_TAIL_PTS:g} points of positions above {TAIL_KLD:g} nats beyond the floor, fail "
              f"from {FAIL_KLD} nats, {FAIL_TOP1_PTS:g} points of top-1 or {FAIL_TAIL_PTS:g} points of tail ({REFERENCE_TABLE})")
    if v.status == "pass":
        return Finding("accuracy.kld.verdict", "pass", f"next-token distributions inside the noise floor: {figures}{what}", detail=detail)
    share = 100 - 100 * o["same_top1"]
    words = (f"the candidate predicts a different next token than the reference at {share:.1f} % of positions "
             f"(the reference against itself: {100 - 100 * f['same_top1']:.1f} %), and the gap at depth "
             f"[{d.get('from')}, {d.get('to')}) is {_n(d.get('kld_mean'), 5)} nats")
    if v.status == "warn":
        return Finding("accuracy.kld.verdict", "warn", f"next-token distributions measurably off the reference, but small: {figures}{what}",
                       detail=detail, evidence=words,
                       remedy=("Smaller than Q6_K weights move a model: unlikely to show in short answers. For long "
                               "agentic coding sessions re-check it at your longest context (more windows, longer "
                               "windows) before relying on it."))
    return Finding("accuracy.kld.verdict", "fail", f"next-token distributions materially off the reference: {figures}{what}",
                   detail=detail, evidence=words,
                   remedy=("A shift this size is what Q5_K_M–Q4_K_M weights do to a model: in code, one different token "
                           "(an identifier, a bracket) changes everything generated after it, and the error grows with "
                           "context. Serve the reference's setting" + (f" ({tested})" if tested else "")
                           + ", or fix what differs (an FP8 KV cache needs calibrated k/v scales) and measure again."))
