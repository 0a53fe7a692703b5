"""The guard of a gateway policy candidate: are the answers still the replicas' answers, and do they all come back?

A routing policy picks which replica serves a request; it changes no weight, flag, dtype or kernel, so no token's
distribution. The KL divergence, recall and the tool-call probe measure a server's numerics: under another policy the
same replicas (the same processes) would score the same, so they are not run. What a policy can break is delivery and
provenance, and that is what is checked, each against the reference policy on the same replicas:

- `workers`: the gateway's own /workers lists exactly the spec's replicas, each healthy, each serving the model and
  SGLang version it served under the reference policy (a replica missing, unhealthy, or another server on its URL);
- `answers`: every request came back — the benchmark's and the guard's own (a policy that needs a routing key, such
  as `manual`, or that sends work to a replica that refuses it, fails requests);
- `identity`: greedy answers through the gateway match the reference policy's token for token on the guard's prompts
  (`guard.identity_prompts`), with the usual allowance: divergence after `guard.min_identical_tokens` is a batch
  shape's numerics (another policy batches requests differently on a replica) and passes; earlier means an answer
  came from something that is not the reference's replica set.
"""
from __future__ import annotations

from typing import Any

from runbook import accuracy
from runbook.core import registry
from runbook.core.spec import Deployment
from runbook.corpus import code_prompts
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer
from runbook.tune.guard import identity
from runbook.tune.measure import tokenizer_dir


def record(spec: Deployment, url: str, row: dict[str, Any]) -> dict[str, Any]:
    """What the guard compares, through the gateway at `url`: greedy answers, how many requests failed, its workers."""
    g = spec.tune.guard
    gw = spec.topology.gateway
    out: dict[str, Any] = {"identity": [], "workers": (row.get("server_info") or {}).get("workers") or [],
                           "failed": int((row.get("bench") or {}).get("failed_requests") or 0), "sent": 0,
                           "setup": {"policy": gw.policy if gw else None}}
    if g.identity_prompts:
        # the gateway routes by the request's model: name it (a server alone answers without one)
        s = accuracy.AccuracySettings.resolve(None, url=url, max_tokens=g.identity_max_tokens, tokenizer=tokenizer_dir(spec),
                                              api_key_env=spec.serving.api_key_env, model=spec.model.served_name)
        recs = run_sync(accuracy.greedy_outputs(s, url, code_prompts()[:g.identity_prompts]))
        out["identity"] = [r.text if r.error_kind in (None, "no_output") else None for r in recs]
        out["failed"] += sum(t is None for t in out["identity"])
        out["errors"] = sorted({str(r.error_kind) for r in recs if r.error_kind not in (None, "no_output")})
    out["sent"] = len(out["identity"]) + sum(int(lv.get("completed") or 0) + int(lv.get("failed") or 0)
                                             for lv in (row.get("bench") or {}).get("levels") or [])
    return out


def _workers(spec: Deployment, ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> dict[str, Any]:
    want = {r.url: r.name for r in spec.topology.replicas}
    seen = {str(w.get("url")): w for w in got}
    before = {str(w.get("url")): w for w in ref}
    bad = [f"{n} ({u}) not listed" for u, n in want.items() if u not in seen]
    bad += [f"{n} ({u}) unhealthy" for u, n in want.items() if u in seen and not seen[u].get("healthy")]
    bad += [f"{u} is not a replica of the spec" for u in seen if u not in want]
    for u, n in want.items():
        a, b = before.get(u) or {}, seen.get(u) or {}
        for k in ("model", "version"):
            if a.get(k) and b.get(k) and a[k] != b[k]:
                bad.append(f"{n} serves {k} {b[k]} (under the reference policy: {a[k]})")
    ok = f"all {len(want)} replicas healthy in the gateway's view, each serving what it served under the reference policy"
    return {"probe": "workers", "status": "fail" if bad else "pass", "title": "; ".join(bad) if bad else ok}


def own_checks(spec: Deployment, got: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference policy's own delivery checks (its replicas listed and healthy, every answer back): shown on its row."""
    return [_workers(spec, got.get("workers") or [], got.get("workers") or []), _answers(got)]


def _answers(got: dict[str, Any]) -> dict[str, Any]:
    failed, sent = int(got.get("failed") or 0), int(got.get("sent") or 0)
    return {"probe": "answers", "status": "fail" if failed else "pass",
            "title": f"{failed} of {sent} requests through the gateway failed"
            + (f" ({', '.join(got['errors'])})" if got.get("errors") else "") if failed
            else f"all {sent} requests through the gateway answered"}


def compare(spec: Deployment, ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """The verdict in guard.compare's shape: status, checks, `tested` (the policies), differences, remedy on a failure."""
    a, b = (ref.get("setup") or {}).get("policy"), (got.get("setup") or {}).get("policy")
    checks = [_workers(spec, ref.get("workers") or [], got.get("workers") or []), _answers(got)]
    if ref.get("identity") and got.get("identity"):
        g = spec.tune.guard
        st, line, points = identity(ref["identity"], got["identity"], g.min_identical_tokens,
                                    load_tokenizer(tokenizer_dir(spec)))
        checks.append({"probe": "identity", "status": st, "title": line, "first_divergence": points})
    status = "fail" if any(c["status"] == "fail" for c in checks) else "pass"
    out: dict[str, Any] = {"status": status, "checks": checks,
                           "tested": f"gateway policy {a} vs {b} (the same replicas: no numerics differ)",
                           "differences": [{"what": "gateway policy", "flag": "policy", "reference": a, "candidate": b}],
                           "versions": {"reference": None, "candidate": None}}
    if status == "fail":
        out["remedy"] = remedy([c["probe"] for c in checks if c["status"] == "fail"], b)
    return out


def remedy(failed: list[str], policy: str | None) -> str:
    """What to do, for the first check that failed."""
    if "workers" in failed:
        return ("The gateway did not route to the spec's replicas as they were under the reference policy: check each "
                f"replica ({registry.notebook('verify')}) and the gateway's --worker-urls, then tune again.")
    if "answers" in failed:
        return (f"Do not serve --policy {policy}: requests through it failed (a policy such as manual needs a routing key "
                "on every request; read the gateway's log).")
    return ("Greedy answers through this policy part early from the reference policy's on the same replicas: a replica "
            f"serves another model, version or flags; run {registry.notebook('verify')} on each replica before choosing a policy.")
