"""Statistics shared by the stages: paired bootstrap confidence intervals."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_ci(diffs: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """Mean of paired differences with a percentile bootstrap confidence interval."""
    a = np.asarray(diffs, dtype=float)
    if a.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    return float(a.mean()), float(np.percentile(means, 100 * alpha / 2)), float(np.percentile(means, 100 * (1 - alpha / 2)))
