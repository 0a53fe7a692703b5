"""SGLang as tune launches it: the unit's own ExecStart (service.build), the flags through the candidate's
own SGLang parser (service.check_flags), the KV plan (kv.assess: SGLang's start-up refusals, context
length, requests at the workload's longest context), and the start-up log read by stage 35 (verify)."""
from __future__ import annotations

import os
import re
import signal
from typing import Any

from runbook import kv, service, verify
from runbook.core.errors import InputError, SpecError
from runbook.core.spec import Deployment
from runbook.endpoint.reach import BadResponse, fetch_json
from runbook.tune.engines import PreCheck, Server, Startup, expand_unit_argv

# kv findings that mean SGLang would refuse to start (tests/test_kv_vs_sglang.py's REFUSAL_IDS)
REFUSALS = {"kv.context", "kv.state_pool", "kv.budget", "kv.dtype", "kv.refused"}
# verify findings that say why a start failed, each with its remedy
FAILURES = ("verify.oom_graph_capture", "verify.oom", "verify.not_enough_memory", "verify.graph_capture")


def _python(spec: Deployment) -> tuple[str | None, str]:
    """The candidate's own interpreter when it is here; else the check's fallback (RUNBOOK_SERVING_PYTHON)."""
    py, found = service.serving_python(spec)
    return py, (found[0].title if found else "")


def _parsed(found: list[Any], note: str) -> tuple[str | None, list[Any]]:
    """The parser's findings for one unit: why it is skipped (its first failure, in the parser's words) or None."""
    bad = [f for f in found if f.status == "fail"]
    if bad:
        f = bad[0]
        return f"{f.title}: {(f.detail or f.remedy).splitlines()[0] if (f.detail or f.remedy) else ''}".rstrip(": "), \
            [x.to_dict() for x in found]
    return None, [x.to_dict() for x in found] + ([{"id": "service.parser_env", "status": "info", "title": note}] if note else [])


def _parsers(specs: list[Deployment], units: list[Any]) -> list[tuple[str | None, list[Any]]]:
    """Every unit through its own SGLang's parser: one run of each interpreter for all the units it checks (an import
    of SGLang is seconds; a candidate's flags are milliseconds)."""
    out: list[tuple[str | None, list[Any]]] = [(None, [])] * len(specs)
    by_python: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        py, note = _python(spec)
        if py is None:
            out[i] = (None, [{"id": "service.parser", "status": "skip", "title": note}])
        else:
            by_python.setdefault(py, []).append(i)
    for py, idx in by_python.items():
        for i, found in zip(idx, service.check_flags_many([units[i] for i in idx], py), strict=True):
            out[i] = _parsed(found, _python(specs[i])[1])
    return out


def _plan(spec: Deployment, longest: int, buckets: list[int]) -> tuple[str | None, dict[str, Any], list[Any]]:
    try:
        p = kv.assess(spec, contexts=sorted({*buckets, longest}))
    except (InputError, SpecError) as e:
        return f"no KV plan: {e}", {}, []
    r = p.result
    pred = {"kv_dtype": r.kv_dtype, "max_total_num_tokens": r.max_total_num_tokens, "max_running_requests": r.max_running_requests,
            "context_len": r.context_len, "kv_bytes_per_token": r.kv_bytes_per_token_per_gpu,
            "requests_at_longest": r.requests_at_context.get(str(longest)),
            "speculative": r.speculative or None}
    found = [f.to_dict() for f in p.findings]
    refused = [f for f in p.findings if f.status == "fail" and f.id in REFUSALS]
    if refused:
        return f"SGLang would refuse to start: {refused[0].title}", pred, found
    if r.context_len is not None and r.context_len < longest:
        return (f"--context-length {r.context_len:,} is below the workload's longest request ({longest:,} tokens)",
                pred, found)
    if not pred["requests_at_longest"]:
        pool = r.max_total_num_tokens
        return (f"not even one request at the workload's longest context ({longest:,} tokens) fits"
                + (f" (token pool {pool:,})" if pool is not None else ""), pred, found)
    return None, pred, found


# The exception a failed start ends with ("ValueError: Loaded weights leave no GPU memory for the KV cache ..."):
# SGLang's own words beat "killed by SIGKILL" (its kill_process_tree) when stage 35 has no finding for it.
_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)): .+")


def _raised(log_path: Any) -> str | None:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - (256 << 10)))
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    hits = [ln.strip() for ln in lines if _RAISED.match(ln.strip())]
    return hits[-1][:400] if hits else None


class SGLang(Server):
    name = "sglang"
    # A candidate is stopped as Ctrl-C stops SGLang: on SIGINT its HTTP server exits at once and launch_server's
    # `finally` kills its scheduler and detokenizer (~2 s here). On SIGTERM it drains first, and notices only at its
    # watchdog's next 5 s tick (~6 s): worth it for production's requests, not for a candidate already measured.
    stop_signal = signal.SIGINT

    def precheck(self, spec: Deployment, longest: int, buckets: list[int]) -> PreCheck:
        return self.precheck_many([spec], longest, buckets)[0]

    def precheck_many(self, specs: list[Deployment], longest: int, buckets: list[int]) -> list[PreCheck]:
        out: list[PreCheck | None] = [None] * len(specs)
        units: dict[int, Any] = {}
        for i, spec in enumerate(specs):
            try:
                units[i] = service.build(spec).unit
            except (InputError, SpecError) as e:
                out[i] = PreCheck("skipped", f"the unit cannot be built: {e}")
        idx = sorted(units)
        for i, (why, found) in zip(idx, _parsers([specs[i] for i in idx], [units[i] for i in idx]), strict=True):
            unit = units[i]
            if why:
                out[i] = PreCheck("skipped", why, found, argv=unit.argv, unit_text=unit.text)
                continue
            why, pred, plan_found = _plan(specs[i], longest, buckets)
            out[i] = PreCheck("skipped" if why else "ok", why or "", found + plan_found, pred, unit.argv, unit.text)
        return [p for p in out if p is not None]

    def launch_env(self, spec: Deployment) -> tuple[list[str], dict[str, str]]:
        """The unit's ExecStart with ${VAR} filled from serving.env and env_file (systemd would expand it the same
        way), and the unit's environment."""
        return expand_unit_argv(spec, service.build(spec).unit.argv)

    def ready_path(self, spec: Deployment) -> str:
        return spec.systemd.ready_path

    def startup(self, spec: Deployment, log_path: Any, pre: PreCheck) -> Startup:
        rep = verify.assess(spec, log=str(log_path))
        bad = [f for f in rep.findings if f.id in FAILURES and f.status == "fail"]
        failure = f"{bad[0].title}; {bad[0].remedy}" if bad else _raised(log_path)
        return Startup({k: rep.observed.get(k) for k in ("kv_dtype", "max_total_num_tokens", "max_running_requests",
                                                         "context_len")},
                       [f.to_dict() for f in rep.findings], failure)

    def live(self, spec: Deployment, url: str) -> dict[str, Any]:
        """/server_info as SGLang itself reports it: version, the pool, its KV dtype and memory (GB), its own
        start-up timestamp; {} when it does not answer (the row then says so by its absence)."""
        try:
            info = fetch_json(url.rstrip("/") + "/server_info", timeout=10.0)
        except (OSError, BadResponse, ValueError):
            return {}
        states = info.get("internal_states")
        first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        out = {k: info.get(k) for k in SERVER_INFO if k in info}
        out.update({k: first.get(k) for k in STATE_KEYS if k in first})
        return out


# What a candidate's row keeps of SGLang's /server_info (its 556 keys are every server argument and more).
SERVER_INFO = ("version", "max_total_num_tokens", "kv_cache_dtype", "chunked_prefill_size", "max_running_requests",
               "schedule_policy", "disable_radix_cache", "context_length", "startup_time")
STATE_KEYS = ("memory_usage", "effective_max_running_requests_per_dp")


ENGINE = SGLang()
