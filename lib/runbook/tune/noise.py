"""Is a candidate's throughput gain over the reference outside the measured noise?

One launch each on a shared host cannot say: the host drifts over minutes (other work, thermal state, page cache)
and a relaunch of the same configuration reads differently, by more than its requests vary within one launch. So the
reference is launched `tune.reference_runs` times, spread among the candidates (trials.plan), and a candidate's gain
must clear two bounds:

- **the requests' noise**: per request, paired by prompt (measure.per_request's key), x = ln(candidate tok/s /
  reference tok/s), the reference's value the geometric mean of its runs. The requests of one level that ran side
  by side are a block, the unit of stage 40's sign-flip randomisation interval (bench.sign_flip_interval) over the
  block means: the paired interval;
- **the launches' noise**: each reference run's mean ln tok/s over the same prompts is one launch's value; their
  standard deviation s is what a relaunch moves by, drift over the run included. One more launch of the reference
  would land within m ± t(R−1)·s·√(1 + 1/R) (a prediction interval; t is Student's quantile at `tune.confidence`,
  R the reference's runs), so a gain inside that is what the reference does against itself.

The interval shown is the union of the two; a gain is outside the noise when all of it is above zero. With one
reference run the launches' noise is not measured: the paired interval alone, and a note that says so. Few runs
make a wide bound (R = 2: t = 12.7); that is what one launch per candidate can tell apart on a noisy host.
Figures are fractions (0.079: +7.9 %), the log ratios turned back with exp − 1."""
from __future__ import annotations

import math
import statistics
from typing import Any

from runbook import bench
from runbook.core import stats
from runbook.core.numeric import is_number


def reference_runs(ref: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The reference's finished runs' per-request figures, in launch order."""
    runs = [r for r in [ref, *(ref.get("repeats") or [])] if r.get("status") == "done"]
    return [r["bench"]["per_request"] for r in sorted(runs, key=lambda r: int(r.get("seq") or 0))
            if (r.get("bench") or {}).get("per_request")]


def _values(per_request: Any) -> dict[str, tuple[str, float]]:
    """key → (block, ln tok/s). Entries of an archived run (read back on --resume) that are not a key, a block and a
    positive finite number are left out: they cannot be paired."""
    out = {}
    for p in per_request if isinstance(per_request, list) else []:
        v = p.get("tok_s") if isinstance(p, dict) else None
        if (is_number(v) and 0 < v < math.inf
                and isinstance(p.get("key"), str) and isinstance(p.get("block"), str)):
            out[p["key"]] = (p["block"], math.log(v))
    return out


def _block_means(xs: list[tuple[str, float]]) -> list[float]:
    blocks: dict[str, list[float]] = {}
    for b, x in xs:
        blocks.setdefault(b, []).append(x)
    return [sum(v) / len(v) for _, v in sorted(blocks.items())]


def _frac(x: float | None) -> float | None:
    return None if x is None else round(math.expm1(x), 4)


def launch_bound(refs: list[dict[str, tuple[str, float]]], keys: list[str], confidence: float) -> tuple[float, float] | None:
    """(s, half-width of the prediction interval) over the reference's launches on these prompts; None with one run."""
    if len(refs) < 2 or not keys:
        return None
    launches = [sum(v[k][1] for k in keys) / len(keys) for v in refs]
    s = statistics.stdev(launches)
    r = len(launches)
    return s, stats.t_quantile((1 + confidence) / 2, r - 1) * s * math.sqrt(1 + 1 / r)


def gain(cand: dict[str, Any], ref: dict[str, Any], confidence: float) -> dict[str, Any]:
    """The candidate's throughput gain over the reference: `mean`, `ci` (the union of the paired interval and the
    launches' prediction interval), `ci_paired`, `launch_sd`, `launch_bound`, `pairs`, `blocks`, `reference_runs`,
    `confidence`, `outside_noise` (all of `ci` on one side of zero) and, where something was not measured, `note`."""
    doc: dict[str, Any] = {"mean": None, "ci": [None, None], "ci_paired": [None, None], "launch_sd": None,
                           "launch_bound": None, "pairs": 0, "blocks": 0, "reference_runs": 0, "confidence": confidence,
                           "outside_noise": False}
    own = _values((cand.get("bench") or {}).get("per_request") or [])
    refs = [_values(r) for r in reference_runs(ref)]
    doc["reference_runs"] = len(refs)
    if not own or not refs:
        doc["note"] = "no per-request figures to pair" if not own else "no reference run to compare with"
        return doc
    keys = sorted(k for k in own if all(k in v for v in refs))
    xs = [(own[k][0], own[k][1] - sum(v[k][1] for v in refs) / len(refs)) for k in keys]
    means = _block_means(xs)
    m, lo, hi = bench.sign_flip_interval(means, confidence=confidence)
    doc.update(pairs=len(keys), blocks=len(means), mean=_frac(m), ci_paired=[_frac(lo), _frac(hi)])
    bound = launch_bound(refs, keys, confidence)
    if bound is not None:
        doc.update(launch_sd=_frac(bound[0]), launch_bound=_frac(bound[1]))
    if m is None or lo is None or hi is None:
        doc["note"] = f"{len(means)} blocks of paired requests are too few for a {confidence:.0%} interval"
        return doc
    w = bound[1] if bound else 0.0
    lo, hi = min(lo, m - w), max(hi, m + w)
    doc["ci"] = [_frac(lo), _frac(hi)]
    doc["outside_noise"] = lo > 0 or hi < 0
    if bound is None:
        doc["note"] = "one reference run: the launches' noise was not measured, the interval is the requests' alone"
    return doc


def reference_noise(ref: dict[str, Any], confidence: float) -> dict[str, Any] | None:
    """The reference's own launch-to-launch spread (None with fewer than two runs): the noise floor on its row."""
    refs = [_values(r) for r in reference_runs(ref)]
    keys = sorted(set.intersection(*(set(v) for v in refs))) if refs else []
    bound = launch_bound(refs, keys, confidence)
    if bound is None:
        return None
    return {"runs": len(refs), "pairs": len(keys), "launch_sd": _frac(bound[0]), "launch_bound": _frac(bound[1]),
            "confidence": confidence}


def describe(g: dict[str, Any] | None) -> str:
    """`+7.9 % (95 % CI −3.1 … +12.0 %)`, the reference's `launch sd …`, or why there is no interval."""
    if not g:
        return ""
    if "runs" in g:
        return (f"launch-to-launch sd {_pct(g['launch_sd'], sign=False)} over {g['runs']} runs: a gain must clear "
                f"±{_pct(g['launch_bound'], sign=False)}")
    if g.get("mean") is None:
        return str(g.get("note") or "no interval")
    lo, hi = g.get("ci") or [None, None]
    ci = "no interval" if lo is None or hi is None else f"{g.get('confidence', 0.95):.0%} CI {_pct(lo)} … {_pct(hi)}"
    return f"{_pct(g['mean'])} ({ci}" + (", the requests' noise only)" if g.get("launch_bound") is None else ")")


def _pct(x: float | None, sign: bool = True) -> str:
    return "—" if x is None else (f"{x * 100:+.1f} %" if sign else f"{x * 100:.1f} %").replace("-", "−")
