"""Statistics shared by the stages: paired bootstrap confidence intervals."""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


def bootstrap_ci(diffs: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """Mean of paired differences with a percentile bootstrap confidence interval."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    a = np.asarray(diffs, dtype=float)
    if a.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    return float(a.mean()), float(np.percentile(means, 100 * alpha / 2)), float(np.percentile(means, 100 * (1 - alpha / 2)))


@lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (p in (0, 1), df ≥ 1). Substituting t = √df·tan θ turns the density into √df·c·cos^(df−1) θ
    on (−π/2, π/2), which is smooth, so the CDF is a Simpson sum on a fine grid and the quantile its interpolation
    (error below 1e-6 at df = 1, where the tails are heaviest; tested against scipy). numpy only: the runbook's own
    environment has no scipy."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df ≥ 1 (got p={p}, df={df})")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    theta = np.linspace(0.0, np.pi / 2, 200_001)
    f = np.cos(theta) ** (df - 1)
    h = theta[1] - theta[0]
    pairs = (f[:-2:2] + 4 * f[1:-1:2] + f[2::2]) * h / 3          # Simpson over each pair of steps
    area = np.concatenate([[0.0], np.cumsum(pairs)])
    # the half-density integrates to 1/2: normalise by the total instead of the gamma-function constant
    th = float(np.interp((p - 0.5) / 0.5 * area[-1], area, theta[::2]))
    return float(np.sqrt(df) * np.tan(th))
