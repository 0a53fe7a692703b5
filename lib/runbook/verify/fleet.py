"""A topology against its spec: each replica verified as the one server is (its own log, its /server_info, its plan),
then the gateway (gateway.py). Replica findings keep the one-server ids, their titles open with the replica's name
("r0: ..."), so the verdict folds the replicas' same findings into one row.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.core.topospec import Replica, Topology
from runbook.verify import gateway, logsource

# The files --log-dir holds: runbook.demo.topology writes them under these names too.
REPLICA_LOG = "replica-{name}.log"
GATEWAY_LOG = "gateway.log"


def replica_spec(spec: Deployment, r: Replica) -> Deployment:
    """The deployment as one replica serves it: the one server's flags on the replica's host and port."""
    return spec.model_copy(update={"serving": spec.serving.model_copy(update={"host": r.host, "port": r.port}),
                                   "topology": Topology()})


def assess_topology(spec: Deployment, one: Callable[..., Any], log_dir: str | None = None, gateway_url: str | None = None,
                    since: str | None = None, journalctl: str = "journalctl",
                    systemctl: str = "systemctl") -> tuple[list[Finding], list[dict[str, Any]], dict[str, Any] | None]:
    """`one` is stage.assess (the one-server verify). Returns the findings, one row per replica (the report's
    `replicas`) and the gateway's view (its `gateway`, None without a gateway)."""
    reps: list[dict[str, Any]] = []
    findings: list[Finding] = []
    for r in spec.topology.replicas:
        log = str(Path(log_dir) / REPLICA_LOG.format(name=r.name)) if log_dir else None
        sub = one(replica_spec(spec, r), log=log, unit=None if log else f"{spec.systemd.unit_name}-{r.name}", url=r.url,
                  since=since, journalctl=journalctl, systemctl=systemctl)
        findings += [replace(f, title=f"{r.name}: {f.title}") for f in sub.findings]
        findings.append(_answers(r, sub, f"{spec.systemd.unit_name}-{r.name}"))
        doc = sub.data()
        reps.append({"name": r.name, "host": r.host, "url": r.url, "up": bool(sub.server),
                     "log": {"source": sub.source, "start_time": sub.facts.start_time, "ready": sub.facts.ready},
                     "observed": doc["observed"], "predicted": doc["predicted"], "server": sub.server,
                     "registered": None, "healthy": None})
    g = spec.topology.gateway
    if g is None:
        return findings, reps, None
    url = (gateway_url or g.url).rstrip("/")
    key = os.environ.get(g.api_key_env) if g.api_key_env else None
    workers, error = gateway.read_workers(url, key)
    findings += gateway.check(spec, workers, error, url)
    for row in reps:
        w = next((w for w in workers or [] if w.replica == row["name"]), None)
        row["registered"] = None if workers is None else w is not None
        row["healthy"] = None if workers is None else bool(w and w.healthy)
    seen, source = _policy(spec, log_dir, since, journalctl, systemctl)
    findings.append(gateway.check_policy(spec, seen, source))
    return findings, reps, gateway.data(workers, error, url, {"spec": g.policy, "seen": seen, "source": source})


def _answers(r: Replica, sub: Any, unit: str) -> Finding:
    """A replica the spec declares must answer: no /server_info is a fail here (the one server's `verify.server`
    is a skip, since verify may run where no server is)."""
    if sub.server:
        return Finding(f"verify.replica.{r.name}", "pass", f"{r.name}: answers at {r.url}",
                       detail=f"SGLang {sub.server.get('version') or '?'}")
    why = next((f.title for f in sub.findings if f.id == "verify.server"), "no /server_info")
    return Finding(f"verify.replica.{r.name}", "fail", f"{r.name}: does not answer at {r.url}", detail=why,
                   remedy=f"Start its unit on {r.host} (`systemctl start {unit}`); `journalctl -u {unit}` says why it stopped.")


def _policy(spec: Deployment, log_dir: str | None, since: str | None, journalctl: str,
            systemctl: str) -> tuple[str | None, str]:
    """The policy the gateway runs: its log's start line (--log-dir's gateway.log, else its unit's journal), else
    --policy in its installed unit."""
    unit = gateway.unit_name(spec)
    since_dt = logsource.parse_since(since) if since else None
    src = (logsource.from_file(Path(log_dir) / GATEWAY_LOG, since_dt) if log_dir
           else logsource.from_journal(unit, since, journalctl, systemctl))
    seen = gateway.policy_from_log(src.lines)
    if seen:
        return seen, f"its log, {src.source}"
    path = Path(spec.systemd.installed_path).parent / f"{unit}.service"
    seen = gateway.policy_from_unit(path)
    if seen:
        return seen, f"its installed unit {path}"
    return None, f"no policy line in {src.source}, no {path}"
