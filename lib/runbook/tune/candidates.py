"""The spec's `tune:` section as a list of candidates: the reference first, then the named ones, then
the grid's combinations; each one a deployment spec with its flags laid over serving.flags. Where the spec declares a
gateway (topology.gateway) the candidates are its policies instead: the reference is the gateway as the spec builds
its unit, then one candidate per `tune.gateway_policies` entry, named `policy=<name>`."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from runbook.core.errors import InputError
from runbook.core.spec import Deployment
from runbook.core.tunespec import REFERENCE


@dataclass(frozen=True)
class Candidate:
    name: str
    overlay: dict[str, Any] = field(default_factory=dict)   # flags over serving.flags; None/False removes one
    python: str | None = None                                # serving.python override (upgrade canary)
    description: str = ""
    policy: str | None = None                                # the gateway's --policy (a gateway deployment's candidates)


def _grid_name(combo: dict[str, Any]) -> str:
    return ",".join(f"{k}={'on' if v is True else 'off' if v in (False, None) else v}" for k, v in combo.items())


def _policies(spec: Deployment) -> list[Candidate]:
    """A gateway deployment's candidates: its own policy (the reference), then each other policy to try."""
    t, g = spec.tune, spec.topology.gateway
    assert g is not None
    if t.candidates or t.grid:
        raise InputError(f"tune.{'candidates' if t.candidates else 'grid'}: this deployment declares topology.gateway, so tune "
                         "relaunches only the gateway, over tune.gateway_policies; tune the servers' flags in a spec of one "
                         "replica (no topology section)")
    if t.reference != REFERENCE:
        raise InputError(f"tune.reference: a gateway deployment's reference is its own policy (topology.gateway.policy: "
                         f"{g.policy}); leave tune.reference out")
    if t.engine != "sglang":
        raise InputError(f"tune.engine: the gateway routes to SGLang replicas; {t.engine} has no gateway here")
    out = [Candidate(REFERENCE, description=f"the gateway as the spec builds its unit (policy {g.policy})", policy=g.policy)]
    out += [Candidate(f"policy={p}", description=f"the gateway with --policy {p}", policy=p)
            for p in t.gateway_policies if p != g.policy]
    return out


def expand(spec: Deployment) -> list[Candidate]:
    """Every candidate the spec names, the reference first, names unique."""
    if spec.topology.gateway is not None:
        return _policies(spec)
    t = spec.tune
    out: dict[str, Candidate] = {}
    ref = t.candidates.get(t.reference)
    if ref is None and t.reference != REFERENCE:
        raise InputError(f"tune.reference: {t.reference!r} is not a candidate (known: {', '.join(t.candidates) or 'none'}); "
                         f"name one of tune.candidates, or leave it out for the spec as it is")
    out[t.reference] = Candidate(t.reference, dict(ref.flags) if ref else {}, ref.python if ref else None,
                                 ref.description if ref else "the deployment as the spec builds its unit")
    for name, c in t.candidates.items():
        if name != t.reference:
            out[name] = Candidate(name, dict(c.flags), c.python, c.description)
    keys = list(t.grid)
    for values in itertools.product(*(t.grid[k] for k in keys)) if keys else ():
        combo = dict(zip(keys, values, strict=True))
        name = _grid_name(combo)
        if name not in out:
            out[name] = Candidate(name, combo, None, "grid")
    return list(out.values())


def select(cands: list[Candidate], names: list[str] | None) -> list[Candidate]:
    """--candidates NAME,...: those (the reference always stays: the guard compares with it)."""
    if not names:
        return cands
    known = {c.name for c in cands}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"{{candidates}} {','.join(unknown)}: no such candidate (known: {', '.join(sorted(known))})")
    return [c for i, c in enumerate(cands) if i == 0 or c.name in names]


def apply(spec: Deployment, cand: Candidate) -> Deployment:
    """The deployment as this candidate would run it: flags overlaid, the serving interpreter swapped; a policy
    candidate's gateway with that policy."""
    g = spec.topology.gateway
    if cand.policy is not None and g is not None:
        topo = spec.topology.model_copy(update={"gateway": g.model_copy(update={"policy": cand.policy})})
        return spec.model_copy(update={"topology": topo})
    flags = dict(spec.serving.flags)
    for k, v in cand.overlay.items():
        if v is None or v is False:
            flags.pop(k, None)
        else:
            flags[k] = v
    serving = spec.serving.model_copy(update={"flags": flags, **({"python": cand.python} if cand.python else {})})
    return spec.model_copy(update={"serving": serving})
