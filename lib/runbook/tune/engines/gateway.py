"""SGLang's gateway as tune launches it, where the spec declares one (topology.gateway): a candidate is the gateway's
unit (service/gateway.py) with another `--policy`, relaunched on free loopback ports in front of the replicas that
are already running (production's, never restarted); the production gateway's port stays production's.

Pre-check: every replica answers GET /health (a policy tune measures the running replicas), and each candidate's
router flags pass the gateway's own argument parser (`parse_router_args` of the wheel in topology.gateway.python, one
run for all candidates). Ready: GET /readiness answers 200; then `prepare` waits until the gateway's own /workers
lists every replica of the spec healthy, and empties the replicas' prefix caches (the gateway's POST /flush_cache, which
it sends to every worker): the replicas outlive the candidates, so without it a policy would read the previous one's
cached prefixes as its own hits.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from runbook import service
from runbook.core import oscalls, ports, registry
from runbook.core.errors import SpecError
from runbook.core.oscalls import CommandFailed
from runbook.core.spec import Deployment
from runbook.core.topospec import GATEWAYS
from runbook.core.topospec import Gateway as GatewaySpec
from runbook.endpoint import reach
from runbook.endpoint.reach import BadResponse, fetch_json
from runbook.tune.engines import PreCheck, Startup, expand_unit_argv
from runbook.tune.launch import LaunchFailed

LOOPBACK = "127.0.0.1"     # a candidate listens here only: tune drives it, nobody else should reach it
WORKERS_S = 60.0           # ready to every replica healthy in the gateway's view (its health checks run every few s)
PROBE_S = 5.0              # one GET or POST to a replica or the gateway
PARSER_S = 120.0
FLUSH_TRIES = 10           # the gateway's interpreter importing its wheel, on a loaded host
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Run by the gateway's own interpreter (-I: none of tune's path): each argv through the wheel's parse_router_args.
_PARSE = r"""
import contextlib, importlib, io, json, sys
parse = importlib.import_module(sys.argv[1]).parse_router_args
out = []
for argv in json.loads(sys.argv[2]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            a = parse(argv)
        out.append({"ok": True, "policy": getattr(a, "policy", None), "workers": list(getattr(a, "worker_urls", None) or [])})
    except SystemExit:
        lines = [x for x in err.getvalue().splitlines() if x.strip()]
        out.append({"ok": False, "error": lines[-1] if lines else "refused"})
print(json.dumps(out))
"""


def _loopback(host: str) -> str:
    return LOOPBACK if host in ("0.0.0.0", "::", "") else host


def _url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _gateway(spec: Deployment) -> GatewaySpec:
    g = spec.topology.gateway
    if g is None:
        raise SpecError(f"{spec.source or 'the spec'}: topology.gateway: this deployment declares no gateway")
    return g


def _answers(url: str) -> str | None:
    """None when GET url answers 200; else why not (one line)."""
    try:
        status, _ = reach.get(url, timeout=PROBE_S, max_bytes=4096)
        return None if status == 200 else f"HTTP {status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except reach.BadResponse as e:
        return e.reason
    except OSError as e:
        return " ".join(str(getattr(e, "reason", e) or type(e).__name__).split())[:200]


def _parse_all(spec: Deployment, argvs: list[list[str]]) -> list[dict[str, Any]] | str:
    """The gateway's parser on each candidate's router flags; a string saying why it could not run."""
    g = _gateway(spec)
    if not (os.path.isfile(g.python) and os.access(g.python, os.X_OK)):
        return f"the gateway's interpreter {g.python} is not on this machine (topology.gateway.python)"
    try:
        cp = oscalls.call([g.python, "-I", "-c", _PARSE, GATEWAYS[g.binary][1], json.dumps(argvs)], timeout=PARSER_S)
    except CommandFailed as e:
        return f"the gateway's parser did not run: {e.reason}"
    try:
        out = json.loads(cp.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = [x for x in cp.stderr.splitlines() if x.strip()]
        return f"the gateway's parser did not run ({g.python}): {err[-1][:300] if err else f'exit {cp.returncode}'}"
    return out if isinstance(out, list) and len(out) == len(argvs) else "the gateway's parser answered something else"


def replica_health(spec: Deployment) -> list[str]:
    """Each replica that does not answer GET /health, with why: `r0 http://h:p (connection refused)`."""
    return [f"{r.name} {r.url} ({why})" for r in spec.topology.replicas if (why := _answers(r.url + "/health"))]


def workers(url: str) -> list[dict[str, Any]]:
    """The gateway's own view (GET /workers), each worker as url, healthy, model, SGLang version; [] when it does not
    answer."""
    try:
        doc = fetch_json(url.rstrip("/") + "/workers", timeout=PROBE_S)
    except (OSError, BadResponse, ValueError):
        return []
    out = []
    for w in doc.get("workers") or [] if isinstance(doc, dict) else []:
        if isinstance(w, dict):
            labels = w["labels"] if isinstance(w.get("labels"), dict) else {}
            out.append({"url": w.get("url"), "healthy": bool(w.get("is_healthy")), "model": w.get("model_id"),
                        "version": labels.get("version")})
    return out


def _flush(url: str, api_key: str | None) -> str:
    """POST url/flush_cache (the gateway's: every worker's prefix cache): "ok" or why not, with what it said."""
    req = urllib.request.Request(url + "/flush_cache", data=b"", method="POST",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=PROBE_S * 6) as r:
            body = r.read(2048).decode("utf-8", "replace")
            return "ok" if r.status == 200 else f"HTTP {r.status}: {' '.join(body.split())[:200]}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except OSError as e:
        return " ".join(str(getattr(e, "reason", e) or type(e).__name__).split())[:200]


class Gateway:
    name = "gateway"
    stop_signal = None          # SIGTERM: the gateway drains and exits at once

    def precheck(self, spec: Deployment, longest: int, buckets: list[int]) -> PreCheck:
        return self.precheck_many([spec], longest, buckets)[0]

    def precheck_many(self, specs: list[Deployment], longest: int, buckets: list[int]) -> list[PreCheck]:
        if not specs:
            return []
        down = replica_health(specs[0])
        argvs = [self.launch_env(self.placed(s))[0] for s in specs]
        if down:
            why = (f"replica {down[0]} does not answer GET /health: a policy tune measures the running replicas; "
                   "start their units first")
            return [PreCheck("skipped", why, argv=a) for a in argvs]
        prefix = 1 + len(GATEWAYS[_gateway(specs[0]).binary][0])
        parsed = _parse_all(specs[0], [a[prefix:] for a in argvs])
        out = []
        for s, argv, p in zip(specs, argvs, parsed if isinstance(parsed, list) else [None] * len(specs), strict=True):
            g = _gateway(s)
            pred = {"policy": g.policy, "replicas": len(s.topology.replicas)}
            if p is None:
                out.append(PreCheck("skipped", str(parsed), predicted=pred, argv=argv))
            elif not p.get("ok"):
                out.append(PreCheck("skipped", f"the gateway's parser refuses its flags: {p.get('error')}", predicted=pred,
                                    argv=argv))
            else:
                out.append(PreCheck("ok", "", [{"id": "service.gateway_parser", "status": "pass",
                                                "title": f"{g.binary}'s parser accepts the flags (policy {p.get('policy')})"}],
                                    pred, argv))
        return out

    def launch_env(self, spec: Deployment) -> tuple[list[str], dict[str, str]]:
        """The gateway unit's ExecStart, ${VAR} (its API key) filled from serving.env_file as systemd would."""
        argv, _ = expand_unit_argv(spec, (str(x) for grp in service.gateway_argv(spec) for x in grp))
        return argv, {}

    def ready_path(self, spec: Deployment) -> str:
        return "/readiness"

    def startup(self, spec: Deployment, log_path: Any, pre: PreCheck) -> Startup:
        """The gateway's log: its last ERROR line is why a launch failed."""
        try:
            lines = [_ANSI.sub("", x).strip() for x in Path(log_path).read_text(errors="replace").splitlines()[-200:]]
        except OSError:
            lines = []
        errors = [x for x in lines if " ERROR " in f" {x} "]
        return Startup({"policy": _gateway(spec).policy}, [],
                       f"the gateway logged: {errors[-1][:300]}" if errors else None)

    def live(self, spec: Deployment, url: str) -> dict[str, Any]:
        """The gateway's own view of its workers, and the policy it was launched with."""
        ws = workers(url)
        return {"policy": _gateway(spec).policy, "workers": ws, "healthy": sum(w["healthy"] for w in ws)}

    def production(self, spec: Deployment) -> tuple[str | None, str | None]:
        """The production gateway's unit, and its /health (what its unit's ExecStartPost waits for)."""
        g = _gateway(spec)
        return service.gateway_unit_name(spec), _url(_loopback(g.bind), g.port) + "/health"

    def placed(self, spec: Deployment) -> Deployment:
        """The gateway on free loopback ports (its metrics port too: smg's default 29000 is production's, and smg binds
        it on every address unless told); the clients tune runs (benchmark, guard) send the gateway's key."""
        g = _gateway(spec)
        flags = {**g.flags, "prometheus-host": LOOPBACK} if g.binary == "smg" else g.flags
        cand = g.model_copy(update={"host": LOOPBACK, "bind": LOOPBACK, "port": ports.free_port(LOOPBACK),
                                    "prometheus_port": ports.free_port(LOOPBACK), "flags": flags})
        serving = spec.serving.model_copy(update={"api_key_env": g.api_key_env}) if g.api_key_env else spec.serving
        return spec.model_copy(update={"topology": spec.topology.model_copy(update={"gateway": cand}), "serving": serving})

    def address(self, spec: Deployment) -> tuple[str, int]:
        g = _gateway(spec)
        return g.bind, g.port

    def prepare(self, spec: Deployment, url: str) -> dict[str, Any]:
        """Every replica healthy in the gateway's own view (LaunchFailed when not within WORKERS_S, or the readiness
        timeout where shorter), then the replicas' prefix caches emptied."""
        want = {r.url for r in spec.topology.replicas}
        limit = min(WORKERS_S, spec.tune.ready_timeout_s or WORKERS_S)
        t0 = time.monotonic()
        shutdown = oscalls.current()
        while True:
            seen = {w["url"] for w in workers(url) if w["healthy"]}
            if want <= seen:
                break
            if time.monotonic() - t0 > limit:
                missing = ", ".join(f"{r.name} {r.url}" for r in spec.topology.replicas if r.url not in seen)
                raise LaunchFailed("timeout", f"the gateway did not see every replica healthy within {limit:g} s "
                                              f"(not healthy: {missing}): check those replicas ({registry.notebook('verify')})")
            shutdown.sleep(0.5)
        healthy_s = round(time.monotonic() - t0, 2)
        key = os.environ.get(spec.serving.api_key_env) if spec.serving.api_key_env else None
        # SGLang refuses a flush while a request runs, and every gateway's health checks (SGLang's /health generates a
        # token) are requests: a refusal (smg: 206, some workers flushed) is tried again
        for attempt in range(1, FLUSH_TRIES + 1):
            flushed = _flush(url, key)
            if flushed == "ok" or attempt == FLUSH_TRIES:
                break
            shutdown.sleep(0.5)
        return {"workers_healthy_s": healthy_s, "cache_flushed": flushed, "flush_attempts": attempt}


ENGINE = Gateway()
