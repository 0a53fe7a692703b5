"""Each finished candidate's verdict, and the one to serve: among the candidates that ran and passed the
accuracy guard, the highest load within the SLOs (the SLO search's limit), then the highest throughput gain — and the
reference itself unless a candidate carries more load within the SLOs, or as much with a throughput gain outside the
measured noise (noise.py: the requests' paired interval and the reference's launch-to-launch spread) of at least
`tune.min_gain`. For it, the unit diff against the installed unit (30_service's diff) and the exact command that
installs it."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from runbook import service
from runbook.core import registry
from runbook.core.errors import InputError, SpecError
from runbook.core.spec import Deployment
from runbook.tune import candidates as cands_mod
from runbook.tune import noise


def _score(row: dict[str, Any]) -> tuple[float, float]:
    b = row.get("bench") or {}
    return float(b.get("slo_limit") or 0), float(b.get("output_tok_s") or 0)


def _gain_mean(row: dict[str, Any]) -> float:
    return float((row.get("gain") or {}).get("mean") or 0)


def _beats(a: dict[str, Any], ref: dict[str, Any], min_gain: float) -> bool:
    """More load within the SLOs, or as much and a throughput gain whose interval is above zero and whose estimate is
    at least min_gain (a gain inside the noise, or too small to be worth a change, keeps the reference)."""
    (la, _), (lr, _) = _score(a), _score(ref)
    g = a.get("gain") or {}
    lo = (g.get("ci") or [None])[0]
    return la > lr or (la == lr and lo is not None and lo > 0 and _gain_mean(a) >= min_gain)


def _startup_failed(row: dict[str, Any]) -> bool:
    return any(d.get("status") == "fail" for d in row.get("startup") or [])


def eligible(row: dict[str, Any]) -> bool:
    """Ran, passed the guard, and started as planned (a start-up log `fail` — another KV dtype than the unit's,
    FP8 KV without scales — is not a configuration to serve, however fast)."""
    return (row.get("status") == "done" and (row.get("guard") or {}).get("status") in ("pass", "reference", "skip")
            and not _startup_failed(row))


def _why_not(row: dict[str, Any]) -> list[str]:
    """Every reason a candidate that ran is not one to serve: the guard's failures with the difference they tested,
    then what its start-up log says."""
    why = []
    g = row.get("guard") or {}
    if g.get("status") == "fail":
        bad = "; ".join(c["title"] for c in g.get("checks", []) if c.get("status") == "fail")
        why.append(f"accuracy guard failed — {bad}" + (f", testing {g['tested']}" if g.get("tested") else ""))
    bad_log = [d for d in row.get("startup") or [] if d.get("status") == "fail"]
    if bad_log:
        why.append("start-up log check failed — " + "; ".join(str(d.get("title")) for d in bad_log[:3]))
    return why


def verdict(row: dict[str, Any], best: str | None) -> str:
    """`recommended`, `ran, within noise of the reference`, `ran, not compared with the reference: <why>`, `ran, not
    the best`, `not recommended: <every reason>`, or the status of one that did not run."""
    st = row.get("status")
    if st != "done":
        return {"skipped": "skipped", "failed": "failed", "not_run": "not run", "planned": "passed the pre-check"}.get(str(st), str(st))
    why = _why_not(row)
    if why:
        return "not recommended: " + "; ".join(why)
    if row["name"] == best:
        return "recommended"
    g = row.get("gain")
    if g and (g.get("ci") or [None])[0] is None:
        return "ran, not compared with the reference: " + str(g.get("note"))
    if g and not g.get("outside_noise"):
        return "ran, within noise of the reference"      # the figures: the row's gain (noise.describe)
    return "ran, not the best"


def _within_noise(ok: list[dict[str, Any]], ref: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The eligible candidates that read faster than the reference but not outside the noise: what the verdict names
    when it keeps the reference."""
    return [{"name": r["name"], "gain": noise.describe(r.get("gain"))} for r in ok
            if r is not ref and _gain_mean(r) > 0 and not (r.get("gain") or {}).get("outside_noise")]


def _install_command(spec: Deployment, row: dict[str, Any]) -> str:
    args = []
    for k, v in (row.get("overlay") or {}).items():
        args += ["--arg", f"{k}=false" if v in (None, False) else (k if v is True else f"{k}={v}")]
    cmd = shlex.join(["python", "-m", "runbook", "service", "install", "--deployment", spec.source or "SPEC", *args, "--yes"])
    if row.get("python"):
        cmd = f"set serving.python: {row['python']} in {spec.source}, then: {cmd}"
    return cmd


def _gateway_change(spec: Deployment, row: dict[str, Any]) -> dict[str, Any]:
    """A policy to serve: the gateway's unit rendered with it against the installed one, and how to install it."""
    cspec = cands_mod.apply(spec, cands_mod.Candidate(row["name"], policy=row["policy"]))
    name = service.gateway_unit_name(spec)
    installed = Path(spec.systemd.installed_path).parent / f"{name}.service"
    try:
        unit = service.render_gateway(cspec)
    except (InputError, SpecError) as e:
        return {"diff": "", "changes": [], "note": f"the gateway's unit could not be built: {e}"}
    text, changes, found = service.diff(unit, installed)
    return {"diff": text, "changes": changes, "note": found[0].title if found else "",
            "command": f"set topology.gateway.policy: {row['policy']} in {spec.source or 'the spec'}, render the gateway's "
                       f"unit from it into {installed} ({registry.notebook('service')}), then "
                       f"`systemctl daemon-reload && systemctl restart {name}`"}


def _unit_diff(spec: Deployment, row: dict[str, Any]) -> dict[str, Any]:
    cand = cands_mod.Candidate(row["name"], row.get("overlay") or {}, row.get("python"))
    try:
        unit = service.build(cands_mod.apply(spec, cand)).unit
    except (InputError, SpecError) as e:
        return {"diff": "", "changes": [], "note": f"the unit could not be built: {e}"}
    text, changes, found = service.diff(unit, Path(spec.systemd.installed_path))
    return {"diff": text, "changes": changes, "note": found[0].title if found else ""}


def recommend(spec: Deployment, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The recommendation (None when no candidate ran and passed the guard); every row gets its verdict."""
    t = spec.tune
    ref_row = next((r for r in rows if r["name"] == t.reference), None)
    for r in rows:
        r.pop("gain", None)
        r.pop("noise", None)
        if ref_row is not None and r is not ref_row and r.get("status") == "done":
            r["gain"] = noise.gain(r, ref_row, t.confidence)
    if ref_row is not None:
        ref_row["noise"] = noise.reference_noise(ref_row, t.confidence)
    ok = [r for r in rows if eligible(r)]
    ref = ref_row if any(r is ref_row for r in ok) else None
    if ref is None:             # nothing to compare with: the best by its own figures
        best = max(ok, key=_score) if ok else None
    else:
        wins = [r for r in ok if r is not ref and _beats(r, ref, t.min_gain)]
        best = max(wins, key=lambda r: (_score(r)[0], _gain_mean(r))) if wins else ref
    for r in rows:
        r["verdict"] = verdict(r, best["name"] if best else None)
    if best is None:
        return None
    rec: dict[str, Any] = {"name": best["name"], "overlay": best.get("overlay") or {}, "python": best.get("python"),
                           "slo_limit": (best.get("bench") or {}).get("slo_limit"),
                           "output_tok_s": (best.get("bench") or {}).get("output_tok_s"),
                           "is_reference": best["name"] == t.reference, "gain": best.get("gain"),
                           "within_noise": _within_noise(ok, ref) if best is ref else []}
    if best.get("policy"):
        rec.update(_gateway_change(spec, best), policy=best["policy"])
    elif spec.tune.engine == "sglang":
        rec.update(_unit_diff(spec, best), command=_install_command(spec, best))
    else:
        rec.update(diff="", changes=[], note="llama-server runs no installed unit here: start it with this command line",
                   command=shlex.join(best.get("argv") or []))
    return rec
