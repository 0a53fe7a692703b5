"""Stage 35's contract and entry point: read the last start's log (and /server_info), compare with the plan."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from runbook import kv, service
from runbook.core import registry, secrets
from runbook.core.errors import InputError, SpecError
from runbook.core.findings import Finding
from runbook.core.options import Options, Url
from runbook.core.registry import Stage, register
from runbook.core.settings import Settings, from_spec, options_view
from runbook.core.spec import Deployment
from runbook.verify import compare, fleet, logparse, logsource, replan
from runbook.verify.report import text_table


@dataclass
class VerifyReport:
    findings: list[Finding]
    source: str = ""
    facts: logparse.Facts = field(default_factory=logparse.Facts)
    observed: dict[str, Any] = field(default_factory=dict)
    predicted: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    unit: dict[str, Any] = field(default_factory=dict)          # the unit's kv-cache-dtype, context-length, mem-fraction-static
    bytes_per_token: dict[str, int | None] = field(default_factory=dict)   # predicted/observed (target), *_draft
    replanned: dict[str, Any] | None = None     # the plan re-derived from the log's own inputs (replan.py)
    replicas: list[dict[str, Any]] | None = None   # with a topology: each replica's own verify (fleet.py)
    gateway: dict[str, Any] | None = None           # with a gateway: its worker list and policy (gateway.py)

    def rows(self) -> list[dict[str, Any]]:
        """The predicted-vs-observed table (one row per quantity; `server` from /server_info when read; `replanned`
        the plan re-derived from the memory the log saw)."""
        srv = {"kv_dtype": self.server.get("kv_cache_dtype"), "max_total_num_tokens": self.server.get("max_total_num_tokens"),
               "max_running_requests": self.server.get("max_running_requests"), "context_len": self.server.get("context_length")}
        rp = self.replanned or {}
        rp_cells = {"max_total_num_tokens": rp.get("max_total_num_tokens"), "max_running_requests": rp.get("max_running_requests"),
                    "max_state_slots": rp.get("max_state_slots"), "weights_gib_per_gpu": rp.get("weights_gib")}
        out = [{"quantity": k, "predicted": self.predicted.get(k), "observed": self.observed.get(k), "server": srv.get(k),
                "replanned": rp_cells.get(k)} for k in compare.KEYS]
        b = self.bytes_per_token
        out[1:1] = [{"quantity": "kv_bytes_per_token_per_gpu", "predicted": b.get("predicted"), "observed": b.get("observed"),
                     "server": None, "replanned": None},
                    {"quantity": "draft_kv_bytes_per_token_per_gpu", "predicted": b.get("predicted_draft"),
                     "observed": b.get("observed_draft"), "server": None, "replanned": None}]
        return out

    def warnings(self) -> list[dict[str, str]]:
        return [{"id": w.id, "line": ln} for w in self.facts.warnings.values() for ln in w.lines]

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"observed": {k: self.observed.get(k) for k in compare.KEYS},
                "predicted": {k: self.predicted.get(k) for k in compare.KEYS},
                "log": {"source": self.source, "start_time": self.facts.start_time, "ready": self.facts.ready,
                        "starts_seen": self.facts.starts_seen, "lines": self.facts.lines},
                "warnings": self.warnings(), "rows": self.rows(), "server": self.server, "unit": self.unit,
                "startup": self.facts.to_json(), "replanned": self.replanned}
        if self.replicas is not None:
            out.update(replicas=self.replicas, gateway=self.gateway)
        return out


def _scrub(rep: VerifyReport, spec: Deployment) -> VerifyReport:
    """No secret of the spec's (env_file values, the API key variable) in any line the report carries."""
    vals = secrets.secret_values()
    if spec.serving.env_file:
        vals |= secrets.secret_values({}, secrets.read_env_file(spec.resolve_path(spec.serving.env_file)).values())
    if not vals:
        return rep
    red = lambda s: secrets.redact_text(s, vals) if isinstance(s, str) else s   # noqa: E731
    rep.findings = [Finding(f.id, f.status, red(f.title), red(f.detail), red(f.evidence), red(f.remedy)) for f in rep.findings]
    for w in rep.facts.warnings.values():
        w.lines = [red(ln) for ln in w.lines]
    rep.source = red(rep.source)
    return rep


def assess(spec: Deployment, log: str | Path | None = None, unit: str | None = None, url: str | None = None,
           since: str | None = None, journalctl: str = "journalctl", systemctl: str = "systemctl",
           drift: Callable[..., Any] | None = None) -> VerifyReport:
    """Stage 35: the running server against the plan. `log` (a saved file) wins over `unit` (the journal;
    default: the spec's systemd unit); `url` adds /server_info; `since` bounds what is read."""
    since_dt: dt.datetime | None = None
    if since:
        try:
            since_dt = logsource.parse_since(since)
        except ValueError as e:
            raise InputError(f"{{since}}: {e}") from None
    findings: list[Finding] = []
    # The unit exactly as render/install build it, and the plan for it (the figures `runbook kv` prints).
    flags: dict[str, Any] = dict(spec.serving.flags)
    try:
        flags = dict(service.build(spec).unit.flags)
    except (InputError, SpecError) as e:
        findings.append(Finding("verify.unit", "skip", "the unit could not be built; the spec's flags are used", detail=str(e)))
    unit_name = unit or spec.systemd.unit_name
    src = logsource.from_file(log, since_dt) if log else logsource.from_journal(unit_name, since, journalctl, systemctl)
    parser = logparse.Parser(None if log else unit_name)
    for ln in src.lines:
        parser.feed(ln)
    facts = parser.facts
    cpu = str(flags.get("device", "")).lower() == "cpu"
    # On CPU the pool follows the host's free memory when the server started, which its log tells; memory read now
    # would count the running server's own pool as taken.
    seen = replan.observed_inputs(facts) if cpu else None
    p, pred, bpt_pred = _plan(spec, flags, findings, seen["free_before_weights_gib"] if seen else None)
    plan_frac = p.result.mem_fraction_static if p is not None else None
    findings += src.findings
    rep = VerifyReport(findings, src.source, facts, unit={k: flags.get(k) for k in ("kv-cache-dtype", "context-length",
                                                                                    "mem-fraction-static")})
    rep.predicted = pred
    rep.observed = compare.observed(facts)
    rep.bytes_per_token = {**bpt_pred, "observed": compare.bytes_per_token(facts),
                           "observed_draft": compare.bytes_per_token(facts, draft=True)}
    rep.replanned = replan.replan(p, facts, spec.hardware.gpu_memory_gib, cpu=cpu) if p is not None else None
    if rep.replanned:
        rep.replanned["verdict"] = replan.verdict(rep.replanned, pred.get("weights_gib_per_gpu"),
                                                  rep.observed.get("max_total_num_tokens"),
                                                  pred.get("max_total_num_tokens"))[0] or None
    if not src.findings:
        if src.errors and not facts.lines:
            findings.append(Finding("verify.log", "skip", f"the journal of {unit_name} could not be read", evidence=src.errors[0],
                                    remedy="Run as a user who may read the journal (systemd-journal group), or give --log FILE."))
        elif not facts.lines and not facts.sglang_lines:
            findings.append(Finding("verify.log", "skip", f"no server log lines in {src.source}" + (f" since {since}" if since else ""),
                                    detail="the unit has not run since boot, or the file is not an SGLang log",
                                    remedy="Start the service, or give a saved log with --log FILE."))
        else:
            findings.append(Finding("verify.log", "info", f"read the last start of {src.source}: {facts.lines:,} lines",
                                    detail=(f"started {facts.start_time}" if facts.start_time else "start time not in the log")
                                    + (f"; {facts.starts_seen} starts in the source, only the last is read"
                                       if facts.starts_seen > 1 else "")
                                    + ("; " + src.errors[0] if src.errors else "")))
            if facts.scheduler is None:
                findings.append(Finding("verify.started", "fail" if facts.warnings.keys() & {"oom", "oom_graph_capture",
                                                                                             "not_enough_memory",
                                                                                           "graph_capture_failed"} else "warn",
                                        "the last start never logged the scheduler's pool line (max_total_num_tokens=…)",
                                        detail="the server failed during start-up, is still loading, or the log is cut",
                                        remedy="Read the failure findings below; `journalctl -u " + unit_name + "` has the traceback."))
            elif not facts.ready:
                findings.append(Finding("verify.started", "warn", "the server sized its pools but never logged that it is ready",
                                        remedy="Still starting (CUDA graphs, JIT), or it died after start-up: check `systemctl status`."))
            else:
                findings.append(Finding("verify.started", "pass", "the server started and logged that it is ready",
                                        detail=f"ready at {facts.ready_time}" if facts.ready_time else ""))
            if pred:
                findings += compare.compare(pred, rep.observed, facts, flags, "log", None if cpu else spec.hardware.gpu_memory_gib,
                                            plan_frac,
                                            replanned=rep.replanned)
            findings += compare.pool_findings({"draft": bpt_pred["predicted_draft"]}, facts)
            findings += compare.log_findings(pred, rep.observed, facts, flags.get("quantization-param-path"),
                                             p.checkpoint_kv if p is not None else None)
    if url:
        findings += _server(spec, url, rep, flags, plan_frac, drift or service.drift)
    return _scrub(rep, spec)


def _plan(spec: Deployment, flags: dict[str, Any], findings: list[Finding],
          host_free_gib: float | None = None) -> tuple[Any, dict[str, Any], dict[str, int | None]]:
    """The plan for the unit (kv.assess), its predicted figures and bytes per token (target, draft).
    `host_free_gib`: a CPU server's free host memory at its start."""
    try:
        unit_spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"flags": flags})})
        p = kv.assess(unit_spec, None, gpu_mem_gib=host_free_gib)      # None: the spec's hardware
    except (InputError, SpecError) as e:
        findings.append(Finding("verify.plan", "skip", f"no plan to compare with: {registry.notebook('kv_memory')} could not run",
                                detail=str(e),
                                remedy=f"Fix what {registry.notebook('kv_memory')} reports."))
        return None, {}, {"predicted": None, "predicted_draft": None}
    draft = p.result.draft_kv_bytes_per_token_per_gpu
    # the plan's bytes per token hold the draft's share of the budget (none where the draft's pool is allocated
    # after the target's): the target pool is compared with the rest
    return p, compare.predicted(p.result), {"predicted": p.result.kv_bytes_per_token_per_gpu
                                            - p.result.draft_kv_budget_bytes_per_token_per_gpu,
                                            "predicted_draft": draft if p.result.speculative else None}


def _server(spec: Deployment, url: str, rep: VerifyReport, flags: dict[str, Any], plan_frac: float | None,
            drift: Callable[..., Any]) -> list[Finding]:
    _, dfind, info = drift(spec, url)
    if not info:
        f = dfind[0] if dfind else Finding("verify.server", "skip", f"no answer from {url}")
        return [Finding("verify.server", "fail" if f.status == "fail" else "skip", f.title, f.detail, f.evidence, f.remedy)]
    rep.server = {k: info.get(k) for k in ("kv_cache_dtype", "context_length", "max_total_num_tokens", "max_running_requests",
                                           "version", "served_models", "memory_usage") if k in info}
    mem = info.get("memory_usage")
    obs = {"kv_dtype": info.get("kv_cache_dtype") if info.get("kv_cache_dtype") not in (None, "auto") else rep.observed.get("kv_dtype"),
           "context_len": info.get("context_length"), "max_total_num_tokens": info.get("max_total_num_tokens"),
           "max_running_requests": info.get("max_running_requests")}
    cpu = str(flags.get("device", "")).lower() == "cpu"
    out = compare.compare(rep.predicted, obs, rep.facts, flags, "/server_info", None if cpu else spec.hardware.gpu_memory_gib,
                          plan_frac,
                          id_prefix="verify.server", replanned=rep.replanned) if rep.predicted else []
    if isinstance(mem, dict) and mem.get("token_capacity") is not None:
        out.append(_memory_usage(mem, info.get("max_total_num_tokens")))
    lt, st = rep.observed.get("max_total_num_tokens"), info.get("max_total_num_tokens")
    if lt is not None and st is not None and int(lt) != int(st):
        out.append(Finding("verify.server.restarted", "warn", f"/server_info reports {int(st):,} tokens, the log's last start {int(lt):,}",
                           detail="the log read is not this server's current run (another start, another host, or an old file)",
                           remedy="Read the journal of the unit that serves this URL, or a log of its current start."))
    return out or [Finding("verify.server", "info", f"/server_info read from {url}")]


def _memory_usage(mem: dict[str, Any], tokens: Any) -> Finding:
    """SGLang's own account of its memory (/server_info internal_states[0].memory_usage, GiB with 3 decimals)."""
    cap = mem.get("token_capacity")
    words = (f"weights {mem.get('weight')} GiB, KV cache {mem.get('kvcache')} GiB for {cap:,} tokens, "
             f"{mem.get('startup_available')} GiB free after start-up")
    if tokens is not None and cap != tokens:
        return Finding("verify.server.memory", "warn", f"/server_info's memory_usage holds {cap:,} tokens, its pool {tokens:,}",
                       detail=words, remedy="Read /server_info again: the two come from one scheduler and should agree.")
    return Finding("verify.server.memory", "info", f"SGLang's memory account: {words}")


def _since(v: str) -> str:
    try:
        logsource.parse_since(v)
    except ValueError:
        raise ValueError("must be a time like 2026-01-05 or '2026-01-05 10:30:00'") from None
    return v.strip()


def _server_url(spec: Deployment | None, given: dict[str, Any]) -> str | None:
    """The spec's own host:port; with replicas none here (fleet.py reads each at its own, the gateway at its own)."""
    return spec.serving.local_url if spec is not None and not spec.topology.replicas else None


class VerifySettings(Settings):
    log_file: str | None = Field(None, alias="log", description="a saved server log (default: the unit's journal)")
    log_dir: str | None = Field(None, description="with a topology: a directory of saved logs, replica-NAME.log per "
                                "replica and gateway.log (default: each unit's journal)")
    unit: str | None = Field(None, description="systemd unit whose journal to read (default: the spec's systemd.unit_name)")
    server_url: Url | None = Field(None, alias="url", json_schema_extra=from_spec(_server_url, at="serving"),
                                   description="compare /server_info of this server (default: the spec's host:port); "
                                   "with a topology: the gateway's URL (default: topology.gateway's)")
    since: Annotated[str, AfterValidator(_since)] | None = Field(
        None, description="read from this time, e.g. '2026-01-05 10:00' (default: the unit's last start)")

    @model_validator(mode="after")
    def _one_source(self) -> VerifySettings:
        if self.log_file and self.unit:
            raise ValueError("{log_file} and {unit} are two sources: give one")
        if self.log_dir and (self.log_file or self.unit):
            raise ValueError("{log_dir} holds every replica's log: give it without {log_file} or {unit}")
        return self


# The flags and notebook parameters: the settings a user sets, None meaning the spec's value.
VerifyOptions = options_view(VerifySettings, "VerifyOptions")


def evaluate(spec: Deployment, options: Options) -> VerifyReport:
    """The same default as the notebook's: the spec's own host:port (no server there is a skip finding). With
    replicas: each one at its own URL, and the gateway at `server_url` (default: topology.gateway's host:port). An
    error names a setting as `{field}`: the flag on the command line, the parameter in the notebook."""
    o = VerifySettings.resolve(spec, options)
    if spec.topology.replicas:
        if o.log_file or o.unit:
            raise InputError(f"{spec.source or 'the spec'}: topology.replicas: each replica has its own log; give "
                             "{log_dir} (replica-NAME.log, gateway.log) or neither (each unit's journal)")
        found, reps, gw = fleet.assess_topology(spec, assess, o.log_dir, o.server_url, o.since)
        return _scrub(VerifyReport(found, "topology", replicas=reps, gateway=gw), spec)
    if o.log_dir:
        raise InputError(f"{{log_dir}}: {spec.source or 'the spec'} declares no topology.replicas; give {{log_file}}")
    return assess(spec, log=o.log_file, unit=o.unit, url=o.server_url, since=o.since)


def text(rep: VerifyReport) -> str:
    """What `runbook verify` prints above its findings: the predicted-vs-observed table."""
    return text_table(rep) or ""


STAGE = register(Stage(35, "verify", "verify", "the running server against the plan: its start-up log and /server_info",
                       VerifyOptions, evaluate, text=text))
