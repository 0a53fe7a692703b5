"""Drift for a topology: every running replica against its own unit, and the gateway's own worker list against the
spec's replicas. A deployment without replicas is drift.drift's one server (rank 0 of a model across nodes: the
other ranks serve no HTTP)."""
from __future__ import annotations

import os
import urllib.error
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.endpoint.reach import BadResponse, failure_finding
from runbook.service.drift import drift, get_json
from runbook.service.render import Build, build

Rows = list[dict[str, str]]


def drift_all(spec: Deployment, url: str | None = None, args: dict[str, Any] | None = None,
              fetch: Callable[[str, str | None], Any] = get_json,
              built: Build | None = None) -> tuple[Rows, list[Finding], dict[str, Any]]:
    """Each replica at its topology.replicas[].url against its unit (rows and titles name the replica), then the
    gateway's /workers against the spec. `server` (the third item) is the first replica's, with `replicas` (each
    one's) and `gateway` (its workers) beside it."""
    if not spec.topology.replicas:
        return drift(spec, url, args, fetch, built)
    if url:
        raise InputError("{server_url}: this deployment declares topology.replicas; drift reads each replica at its own URL "
                         "(topology.replicas[].host:port): leave {server_url} out")
    b = built or build(spec, args)
    rows: Rows = []
    findings: list[Finding] = []
    servers: dict[str, Any] = {}
    for r, unit in zip(spec.topology.replicas, b.units, strict=True):
        got, fs, info = drift(spec, r.url, args, fetch, b, unit)
        rows += [{"replica": r.name, **row} for row in got]
        findings += [replace(f, title=f"{r.name}: {f.title}") for f in fs]
        servers[r.name] = info
    first: dict[str, Any] = next(iter(servers.values()), {})
    out: dict[str, Any] = {**first, "replicas": servers}
    if spec.topology.gateway is not None:
        gfs, workers = gateway_drift(spec, fetch)
        findings += gfs
        out["gateway"] = {"url": spec.topology.gateway.url, "workers": workers}
    return rows, findings, out


def gateway_drift(spec: Deployment, fetch: Callable[[str, str | None], Any] = get_json) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The gateway's own view (GET /workers) against the spec: a replica it does not route to, or a worker the spec
    does not declare, is a fail each; its workers as (url, is_healthy)."""
    g = spec.topology.gateway
    assert g is not None
    key = os.environ.get(g.api_key_env) if g.api_key_env else None
    url = g.url + "/workers"
    try:
        body = fetch(url, key)
    except urllib.error.HTTPError as e:
        return [Finding("service.drift.gateway", "fail" if e.code == 401 else "skip", f"the gateway's /workers answered {e.code}",
                        remedy=f"Export {g.api_key_env} for this run." if e.code == 401 else "Is this SGLang's gateway (smg)?")], []
    except BadResponse as e:
        return [failure_finding("service.drift.gateway", url, e)], []
    except (urllib.error.URLError, OSError, ValueError) as e:
        return [Finding("service.drift.gateway", "skip", f"no gateway reachable at {g.url}", evidence=str(getattr(e, "reason", e)),
                        remedy="Start the gateway's unit, or check topology.gateway.host and port.")], []
    listed = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(listed, list):
        return [failure_finding("service.drift.gateway", url, BadResponse(url, "expected {\"workers\": [...]}"))], []
    workers = [{"url": str(w.get("url")), "is_healthy": w.get("is_healthy")} for w in listed if isinstance(w, dict)]
    have = {str(w["url"]).rstrip("/") for w in workers}
    want = {r.url: r.name for r in spec.topology.replicas}
    out = [Finding("service.drift.gateway.missing", "fail", f"{name}: {u} is not among the gateway's workers",
                   detail=f"the gateway lists {len(have)} worker(s): {', '.join(sorted(have)) or 'none'}",
                   remedy="Restart the gateway from its rendered unit (its --worker-urls are the spec's replicas).")
           for u, name in want.items() if u not in have]
    out += [Finding("service.drift.gateway.extra", "fail", f"the gateway routes to {u}, which topology.replicas does not declare",
                    remedy="Add it to topology.replicas, or restart the gateway from its rendered unit.")
            for u in sorted(have - set(want))]
    if not out:
        out.append(Finding("service.drift.gateway", "pass", f"the gateway routes to exactly the spec's {len(want)} replicas",
                           detail=", ".join(f"{w['url']} ({'healthy' if w['is_healthy'] else 'not healthy'})" for w in workers)))
    return out, workers
