"""Is a candidate's throughput gain over the reference outside the measured noise?

One launch each on a shared host cannot say: the host drifts over minutes (other work, thermal state, page cache),
and a relaunch of the same configuration reads differently. So the reference is launched `tune.reference_runs`
times, spread among the candidates (trials.py: first, and last with the default 2), and each candidate is compared
with the two reference runs that bracket it:

- per request, paired by prompt (measure.per_request's key): x = ln(candidate tok/s / reference tok/s), the
  reference's value being the geometric mean of its two bracketing runs (a linear drift cancels);
- the requests of one level that ran side by side form a block, the unit of the interval (stage 40's A/B:
  requests that ran together share the server's state); the sign-flip randomisation interval over block means
  (bench.sign_flip_interval) gives the paired interval at `tune.confidence`;
- the reference's own change between those two runs, ln(after / before) over the same prompts, is the drift the
  paired interval cannot see (it is one launch per configuration): the interval is widened by its size on both
  sides. With one reference run nothing is widened and the gain says the drift was not measured.

A gain is outside the noise when the widened interval's lower end is above zero. Figures are fractions
(0.079: +7.9 %); the log ratios are turned back with exp − 1."""
from __future__ import annotations

import math
from typing import Any

from runbook import bench


def reference_runs(ref: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """The reference's finished runs as (sequence number, per-request figures), in launch order."""
    runs = []
    if ref.get("status") == "done" and (ref.get("bench") or {}).get("per_request"):
        runs.append((int(ref.get("seq") or 0), ref["bench"]["per_request"]))
    for rep in ref.get("repeats") or []:
        if rep.get("status") == "done" and (rep.get("bench") or {}).get("per_request"):
            runs.append((int(rep.get("seq") or 0), rep["bench"]["per_request"]))
    return sorted(runs, key=lambda r: r[0])


def bracket(seq: int, runs: list[tuple[int, Any]]) -> tuple[Any, Any]:
    """The last reference run before `seq` and the first after it (either None where there is none)."""
    before = next((r for r in reversed(runs) if r[0] < seq), None)
    after = next((r for r in runs if r[0] > seq), None)
    return before, after


def _values(per_request: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    return {str(p["key"]): (str(p["block"]), float(p["tok_s"])) for p in per_request if float(p.get("tok_s") or 0) > 0}


def _block_means(xs: list[tuple[str, float]]) -> list[float]:
    blocks: dict[str, list[float]] = {}
    for b, x in xs:
        blocks.setdefault(b, []).append(x)
    return [sum(v) / len(v) for _, v in sorted(blocks.items())]


def _frac(x: float | None) -> float | None:
    return None if x is None else round(math.expm1(x), 4)


def gain(cand: dict[str, Any], ref: dict[str, Any], confidence: float) -> dict[str, Any]:
    """The candidate's throughput gain over the reference: `mean`, `ci` (widened by the drift), `ci_paired` (not
    widened), `drift`, `pairs`, `blocks`, `reference_runs` (the bracketing runs' sequence numbers), `outside_noise`
    (the widened interval excludes zero) and, where no interval could be made, `note` saying why."""
    doc: dict[str, Any] = {"mean": None, "ci": [None, None], "ci_paired": [None, None], "drift": None, "pairs": 0,
                           "blocks": 0, "confidence": confidence, "reference_runs": [], "outside_noise": False}
    own = _values((cand.get("bench") or {}).get("per_request") or [])
    runs = reference_runs(ref)
    before, after = bracket(int(cand.get("seq") or 0), runs)
    sides = [r for r in (before, after) if r is not None]
    if not own or not sides:
        doc["note"] = "no per-request figures to pair" if not own else "no reference run to compare with"
        return doc
    doc["reference_runs"] = [r[0] for r in sides]
    refs = [_values(r[1]) for r in sides]
    keys = sorted(k for k in own if all(k in v for v in refs))
    xs = [(own[k][0], math.log(own[k][1]) - sum(math.log(v[k][1]) for v in refs) / len(refs)) for k in keys]
    means = _block_means(xs)
    m, lo, hi = bench.sign_flip_interval(means, confidence=confidence)
    doc.update(pairs=len(keys), blocks=len(means), mean=_frac(m), ci_paired=[_frac(lo), _frac(hi)])
    drift = None
    if len(refs) == 2:
        d = _block_means([(refs[0][k][0], math.log(refs[1][k][1] / refs[0][k][1])) for k in keys])
        drift = sum(d) / len(d) if d else None
        doc["drift"] = _frac(drift)
    if lo is None or hi is None:
        doc["note"] = f"{len(means)} blocks of paired requests are too few for a {confidence:.0%} interval"
        return doc
    w = abs(drift or 0.0)
    doc["ci"] = [_frac(lo - w), _frac(hi + w)]
    doc["outside_noise"] = lo - w > 0 or hi + w < 0
    if drift is None:
        doc["note"] = "the host's drift was not measured (one reference run on this side): the interval is the paired one"
    return doc


def reference_drift(ref: dict[str, Any], confidence: float) -> dict[str, Any] | None:
    """The reference's change from its first run to its last, paired by prompt (None with one run): the noise floor
    shown on its own row."""
    runs = reference_runs(ref)
    if len(runs) < 2:
        return None
    last = {"seq": runs[-1][0] + 1, "bench": {"per_request": runs[-1][1]}}
    g = gain(last, {"status": "done", "seq": runs[0][0], "bench": {"per_request": runs[0][1]}}, confidence)
    return {"drift": g["mean"], "ci": g["ci_paired"], "pairs": g["pairs"], "blocks": g["blocks"], "runs": len(runs),
            "confidence": confidence}


def describe(g: dict[str, Any] | None) -> str:
    """`+7.9 % (95 % CI −3.1 … +12.0 %, drift +2.0 %)`, or why there is no interval."""
    if not g:
        return ""
    if "runs" in g:             # the reference's own drift
        return f"drift {_pct(g['drift'])} over {g['runs']} runs ({_ci(g)})"
    if g.get("mean") is None:
        return str(g.get("note") or "no interval")
    extra = f", drift {_pct(g['drift'])}" if g.get("drift") is not None else ", drift not measured"
    return f"{_pct(g['mean'])} ({_ci(g)}{extra})"


def _ci(g: dict[str, Any]) -> str:
    lo, hi = g.get("ci") or [None, None]
    if lo is None or hi is None:
        return "no interval"
    return f"{g.get('confidence', 0.95):.0%} CI {_pct(lo)} … {_pct(hi)}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.1f} %".replace("-", "−")
