"""The gateway against the spec: every replica registered and healthy in the gateway's own view (GET /workers),
serving the spec's model, no worker the spec does not name, and the routing policy the spec renders.

`read_workers` never raises: an answer it cannot use (no answer, an HTTP error, not JSON, wrong types, too large)
is one line that `check` turns into the `verify.gateway.workers` finding.
"""
from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runbook.core.findings import Finding, Status
from runbook.core.spec import Deployment

MAX_BYTES = 4 * 1024 * 1024     # smg's answer is ~0.5 KiB per worker: far above any fleet, a bound on a hostile one
MAX_WORKERS = 4096
# smg (and sglang-router) log their policy at start as its Rust type: "policy: CacheAware { ... }", "RoundRobin".
_POLICY_LINE = re.compile(r"\bpolicy: ([A-Z][A-Za-z]{1,40})\b")


@dataclass
class Worker:
    """One worker as the gateway sees it (smg's /workers item; labels are what the worker told the gateway)."""
    url: str
    healthy: bool
    status: str | None = None
    model_path: str | None = None
    version: str | None = None
    tp_size: str | None = None
    replica: str | None = None      # the spec's replica at this URL, None for a worker the spec does not name


def _clip(text: str, n: int = 80) -> str:
    return repr(text[:n]) + ("…" if len(text) > n else "")


def parse_workers(body: bytes) -> tuple[list[Worker] | None, str]:
    """smg's /workers document -> its workers, or (None, why) naming the first key that is not as smg writes it."""
    if len(body) > MAX_BYTES:
        return None, f"the answer is larger than {MAX_BYTES // 2**20} MiB"
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, f"the answer is not JSON (starts {_clip(body[:80].decode('utf-8', 'replace'))})"
    if not isinstance(doc, dict):
        return None, f"the answer is a JSON {type(doc).__name__}, not an object with `workers`"
    items = doc.get("workers")
    if not isinstance(items, list):
        return None, "`workers` is missing" if items is None else f"`workers` is a {type(items).__name__}, not a list"
    if len(items) > MAX_WORKERS:
        return None, f"`workers` lists {len(items):,} workers, more than {MAX_WORKERS:,}"
    out = []
    for i, w in enumerate(items):
        if not isinstance(w, dict):
            return None, f"workers[{i}] is a {type(w).__name__}, not an object"
        url, healthy = w.get("url"), w.get("is_healthy")
        if not isinstance(url, str) or not url or len(url) > 2048:
            return None, f"workers[{i}].url is missing or not a URL"
        if not isinstance(healthy, bool):
            return None, f"workers[{i}].is_healthy is {'missing' if healthy is None else type(healthy).__name__}, not true/false"
        labels: dict[str, Any] = w["labels"] if isinstance(w.get("labels"), dict) else {}
        text = lambda v: str(v)[:512] if isinstance(v, str | int) and not isinstance(v, bool) else None   # noqa: E731
        # model_path is the path the replica was started with; served_model_name where a gateway reports no path
        out.append(Worker(url, healthy, text(w.get("status")), text(labels.get("model_path") or labels.get("served_model_name")),
                          text(labels.get("version")), text(labels.get("tp_size"))))
    return out, ""


def read_workers(url: str, api_key: str | None = None, timeout: float = 5.0) -> tuple[list[Worker] | None, str]:
    """GET URL/workers, read at most MAX_BYTES + 1; (workers, "") or (None, one line saying why)."""
    req = urllib.request.Request(url.rstrip("/") + "/workers",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        hint = {401: ": the gateway wants its API key (topology.gateway.api_key_env's variable)",
                403: ": the gateway wants its API key (topology.gateway.api_key_env's variable)",
                404: ": this gateway has no /workers (smg ≥ 1.0 and sglang-router list their workers there)"}.get(e.code, "")
        return None, f"HTTP {e.code} from {url}/workers{hint}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return None, f"no answer from {url}/workers ({str(reason)[:120]})"
    return parse_workers(body)


def same_url(a: str, b: str) -> bool:
    """Two worker URLs name the same server: scheme, host (case-insensitive) and port (default by scheme)."""
    try:
        pa, pb = urllib.parse.urlsplit(a.strip()), urllib.parse.urlsplit(b.strip())
        port = lambda p: p.port or {"http": 80, "https": 443}.get(p.scheme.lower())   # noqa: E731
        return (pa.scheme.lower(), pa.hostname, port(pa)) == (pb.scheme.lower(), pb.hostname, port(pb))
    except ValueError:     # a port out of range in a hostile answer
        return False


def _model_ok(spec: Deployment, seen: str) -> bool:
    """The worker's model_path label against the spec's model: its path as the unit passes it, or its served name."""
    want = {spec.model.path, str(spec.resolve_path(spec.model.path)), spec.model.served_name or ""} - {""}
    return seen in want or seen.rstrip("/") in {w.rstrip("/") for w in want}


def check(spec: Deployment, workers: list[Worker] | None, error: str, url: str) -> list[Finding]:
    """Every spec replica registered, healthy and serving the spec's model; workers the spec does not name."""
    reps = spec.topology.replicas
    if workers is None:
        return [Finding("verify.gateway.workers", "fail", f"the gateway's worker list could not be read: {error}",
                        remedy="Start the gateway's unit (`systemctl start " + unit_name(spec) + "`), or check "
                               "topology.gateway.host/port; `curl " + url + "/workers` shows what it answers.")]
    out: list[Finding] = []
    ok = 0
    for r in reps:
        w = next((w for w in workers if same_url(w.url, r.url)), None)
        fid = f"verify.gateway.replica.{r.name}"
        if w is None:
            out.append(Finding(fid, "fail", f"{r.name}: not registered in the gateway ({r.url} is not in its /workers)",
                               detail=f"the gateway lists {len(workers)} worker(s)",
                               remedy="The gateway's unit names every replica (--worker-urls): reinstall it from the spec "
                                      "(`runbook service install --yes`) or add the worker (smg: POST /workers)."))
            continue
        w.replica = r.name
        facts = ", ".join(x for x in (f"model {w.model_path}" if w.model_path else "", f"SGLang {w.version}" if w.version else "",
                                     f"tp {w.tp_size}" if w.tp_size else "") if x)
        if not w.healthy:
            out.append(Finding(fid, "fail", f"{r.name}: unhealthy in the gateway's view ({r.url}"
                               + (f", status {w.status}" if w.status else "") + ")",
                               detail="the gateway routes no request to it while its health check fails",
                               remedy=f"Check the replica's unit on {r.host} (`systemctl status {spec.systemd.unit_name}-{r.name}`) "
                                      f"and its /health; verify's {r.name} findings say whether it answers."))
        elif w.model_path and not _model_ok(spec, w.model_path):
            out.append(Finding(fid, "fail", f"{r.name}: serves {w.model_path}, the spec's model is "
                               f"{spec.model.served_name or spec.model.path}",
                               detail="the gateway sends this deployment's requests to a server of another model",
                               remedy="Restart the replica from its rendered unit, or fix the gateway's --worker-urls."))
        else:
            ok += 1
            out.append(Finding(fid, "pass", f"{r.name}: registered and healthy in the gateway" + (f" ({facts})" if facts else ""),
                               detail="" if w.model_path else "the gateway reports no model_path label: the model is not compared"))
    extra = [w for w in workers if w.replica is None]
    if extra:
        shown = ", ".join(w.url[:200] for w in extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        out.append(Finding("verify.gateway.extra", "warn", f"the gateway routes to {len(extra)} worker(s) the spec does not name",
                           detail=shown,
                           remedy="Remove them from the gateway (smg: DELETE /workers/{url}) or add them to topology.replicas."))
    status: Status = "pass" if ok == len(reps) else "fail"
    out.insert(0, Finding("verify.gateway.workers", status,
                          f"{ok} of {len(reps)} replicas registered, healthy and serving the spec's model in the gateway's view",
                          detail=f"{url}/workers lists {len(workers)} worker(s)",
                          remedy="" if status == "pass" else "See the verify.gateway.replica findings."))
    return out


def unit_name(spec: Deployment) -> str:
    g = spec.topology.gateway
    return (g.unit_name if g and g.unit_name else None) or f"{spec.systemd.unit_name}-gateway"


def policy_from_log(lines: Iterable[str]) -> str | None:
    """The last start's policy as the gateway logged it (`policy: CacheAware { … }` -> cache_aware)."""
    seen = None
    for ln in lines:
        m = _POLICY_LINE.search(ln)
        if m:
            seen = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower()
    return seen


def policy_from_unit(path: Path) -> str | None:
    """--policy in an installed unit's ExecStart (None when the file, the line or the flag is not there)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:MAX_BYTES]
    except OSError:
        return None
    for line in re.sub(r"\\\n", " ", text).splitlines():     # systemd's continuation lines joined
        if not line.strip().startswith("ExecStart="):
            continue
        try:
            words = shlex.split(line.strip().partition("=")[2])
        except ValueError:      # an unbalanced quote: not a unit this runbook wrote
            return None
        for i, w in enumerate(words):
            if w == "--policy" and i + 1 < len(words):
                return words[i + 1]
            if w.startswith("--policy="):
                return w.partition("=")[2]
    return None


def check_policy(spec: Deployment, seen: str | None, source: str) -> Finding:
    want = spec.topology.gateway.policy if spec.topology.gateway else None
    if seen is None:
        return Finding("verify.gateway.policy", "skip", "the gateway's policy not checked: no gateway log or installed unit read",
                       detail=source,
                       remedy="Give --log-dir with the gateway's log (gateway.log), or run where its unit is installed.")
    ok = seen == want
    return Finding("verify.gateway.policy", "pass" if ok else "fail",
                   f"gateway policy {seen} ({source})" + ("" if ok else f", the spec says {want}"),
                   remedy="" if ok else "Restart the gateway from its rendered unit (`runbook service install --yes`).")


def data(workers: list[Worker] | None, error: str, url: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {"url": url, "error": error or None, "workers": [asdict(w) for w in workers] if workers is not None else None,
            "policy": policy}
