"""A finished run as Prometheus gauges: its summary.json, its notebooks' results files and the previous run's
figures, turned into one CollectorRegistry (prometheus_client writes the exposition format and escapes it).

Every series carries `deployment`; the others are bounded: stage names, finding ids, statuses, benchmark
level labels, check names, quantiles. A value that is not an id (free text, a path, anything holding a
secret) never becomes a label: the finding is still counted in `runbook_findings`, only its own series
is left out. docs/alerts.md lists every metric; the rules and the dashboard use only these names.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runbook.core import registry, secrets
from runbook.core.findings import STATUSES, Finding
from runbook.core.numeric import number

# Ids, levels and names: letters, digits and . _ : + - only, bounded in length (never free text).
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}")
_URL = re.compile(r"(https?://[^\s\"\\?#@]{1,1000})?")      # empty: no link_base in the spec
MAX_FINDING_SERIES = 1000     # per file: far above any run's findings, a bound on what one results file can add
# The stages' own verdicts the alert rules page on: check -> the finding ids that decide it. 1 when one of
# them is warn or fail, 0 when they passed, absent when none ran (skip/info only).
CHECKS = {
    "kv_dtype": r"verify(\.server)?\.kv_dtype",
    "context_len": r"verify(\.server)?\.context_len",
    "kv_tokens": r"verify(\.server)?\.tokens",
    "service_drift": r"service\.drift(\..+)?",
    "bench_regression": r"bench\.regression(\..+)?",
    "recall": r"accuracy\.recall(\..+)?",
    "identity": r"accuracy\.identity(\..+)?",
    "toolcall": r"accuracy\.toolcall\..+",
    "kld": r"accuracy\.kld\.(verdict|record)(\..+)?",
}
# (name, help, extra labels) of every gauge, in the order the textfile lists them.
GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("runbook_last_run_timestamp_seconds", "When the last run of the deployment finished (Unix time).", ()),
    ("runbook_last_run_duration_seconds", "Wall time of the last run.", ()),
    ("runbook_last_run_exit_code", "Exit code of the last run: 0 ok, 1 a check failed, 2 a notebook could not run.", ()),
    ("runbook_last_run_completed", "1 when every notebook of the last run ran to its end, else 0.", ()),
    ("runbook_last_run_info", "The last run's id, host and archive link (value 1).", ("host", "run_id", "url")),
    ("runbook_run_interval_seconds", "How often the runbook is meant to run (the spec's alerts.interval_s).", ()),
    ("runbook_stage_timestamp_seconds", "When the stage's findings below were made (Unix time).", ("stage",)),
    ("runbook_notebook_completed", "1 when the stage's notebook ran to its end in the last run, else 0.", ("stage",)),
    ("runbook_notebook_duration_seconds", "Wall time of the stage's notebook in the last run.", ("stage",)),
    ("runbook_findings", "Findings of the stage per status in the last run.", ("stage", "status")),
    ("runbook_finding", "One finding of the last run (value 1), labelled with its id and status.", ("stage", "id", "status")),
    ("runbook_check_failed", "1 when a stage's own check warned or failed, 0 when it passed (absent: not run).", ("check",)),
    ("runbook_kv_tokens_planned", "KV pool tokens the plan predicts (SGLang's max_total_num_tokens).", ()),
    ("runbook_kv_tokens_observed", "KV pool tokens the running server reports (log, else /server_info).", ()),
    ("runbook_service_drift_flags", "Flags whose running value differs from the unit's (server reached).", ()),
    ("runbook_replica_up", "1 when the topology's replica answered verify (/server_info), else 0.", ("replica",)),
    ("runbook_replica_registered", "1 when the gateway lists the replica among its workers, else 0 (absent: the gateway "
     "could not be read).", ("replica",)),
    ("runbook_replica_healthy", "1 when the gateway lists the replica and counts it healthy, else 0 (absent: the gateway "
     "could not be read).", ("replica",)),
    ("runbook_bench_output_tokens_per_second", "Output throughput of a benchmark level.", ("level",)),
    ("runbook_bench_ttft_seconds", "Time to first token of a benchmark level, per percentile (p50, p99).", ("level", "percentile")),
    ("runbook_bench_tpot_seconds", "Time per output token of a benchmark level, per percentile (p50, p99).", ("level", "percentile")),
    ("runbook_bench_max_concurrency_within_slo", "Highest concurrency meeting the SLOs (0: none did).", ()),
    ("runbook_bench_max_rate_within_slo_requests_per_second", "Highest request rate meeting the SLOs (0: none did).", ()),
    ("runbook_bench_change_ratio", "A benchmark figure against the previous run: now / then - 1.", ("figure", "level")),
    ("runbook_bench_regression_threshold_ratio", "The spec's benchmark.regression_threshold_pct as a ratio.", ()),
    ("runbook_accuracy_recall_ratio", "Share of long-context needles found.", ()),
    ("runbook_accuracy_greedy_identical_ratio", "Share of prompts with identical greedy output (speculative on/off).", ()),
    ("runbook_accuracy_kvquant_attn_rel_error", "Largest attention-output relative error of the deployment's KV format.", ()),
    ("runbook_accuracy_kld_excess_nats", "Mean KL divergence from the reference above its noise floor (nats).", ()),
    ("runbook_accuracy_kld_top1_drop_points", "Same-top-1 agreement with the reference below its floor's (points).", ()),
)
# Run-summary figures (runner/figures.py, the stages' `figures`) -> gauge; output_tok_s is per level below.
_FIGURES = {"kv_tokens_planned": "runbook_kv_tokens_planned", "kv_tokens_observed": "runbook_kv_tokens_observed",
            "max_concurrency_within_slo": "runbook_bench_max_concurrency_within_slo",
            "max_rate_within_slo": "runbook_bench_max_rate_within_slo_requests_per_second",
            "recall": "runbook_accuracy_recall_ratio", "greedy_identical": "runbook_accuracy_greedy_identical_ratio",
            "kvquant_attn_rel_err_max": "runbook_accuracy_kvquant_attn_rel_error",
            "kld_excess": "runbook_accuracy_kld_excess_nats", "kld_top1_drop_pts": "runbook_accuracy_kld_top1_drop_points"}
_CHANGES = ("max_concurrency_within_slo", "max_rate_within_slo")   # besides output_tok_s per level


class Metrics:
    """The gauges of one textfile; `label_ok` decides which values may become labels. `source` is "run" for
    `runbook run`'s file, "verb" for a stage verb's (`runbook verify --textfile-dir`): the same series from
    both never collide in node_exporter, and an alert says which one found it."""

    def __init__(self, deployment: str, source: str = "run", scrub: Iterable[str] = ()):
        from prometheus_client import CollectorRegistry, Gauge  # lazy: prometheus_client (~15 ms) only when metrics are written

        self.registry = CollectorRegistry(auto_describe=True)
        self.forms = secrets.expand(scrub)
        self.deployment, self.source = deployment, source
        if not self.label_ok(deployment):
            raise ValueError(f"deployment name {deployment!r} cannot be a label value")
        self.g = {name: Gauge(name, doc, ("deployment", "source", *labels), registry=self.registry) for name, doc, labels in GAUGES}

    def label_ok(self, value: Any, url: bool = False) -> bool:
        """An id (or, for `url`, the archive link this module builds from the spec's validated link_base)."""
        if not isinstance(value, str) or any(f in value for f in self.forms):
            return False
        return bool((_URL if url else _ID).fullmatch(value))

    def set(self, name: str, value: Any, **labels: str) -> None:
        v = number(value)
        if v is not None and all(self.label_ok(x, url=k == "url") for k, x in labels.items()):
            self.g[name].labels(deployment=self.deployment, source=self.source, **labels).set(v)


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _stage_names() -> dict[str, str]:
    """notebook stem -> stage name (the `stage` label; a notebook outside the registry keeps its stem less its number)."""
    return {s.notebook: s.name for s in registry.stages()}


def _results(run_dir: Path, nb: dict[str, Any]) -> dict[str, Any]:
    name = nb.get("results")
    if not isinstance(name, str) or "/" in name:
        return {}
    try:
        doc = json.loads((run_dir / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _findings(doc: dict[str, Any]) -> list[Finding]:
    out = []
    for f in doc.get("findings") or []:
        try:
            out.append(Finding.from_dict(f))
        except (TypeError, ValueError, AttributeError):
            continue
    return out


def _run(m: Metrics, summary: dict[str, Any], interval_s: float, link_base: str | None) -> float | None:
    """The run's own gauges; returns when it finished."""
    try:
        started: float | None = dt.datetime.fromisoformat(str(summary.get("started"))).timestamp()
    except ValueError:
        started = None
    duration = number(summary.get("duration_s")) or 0.0
    finished = round(started + duration, 3) if started is not None else None
    m.set("runbook_last_run_timestamp_seconds", finished)
    m.set("runbook_last_run_duration_seconds", duration)
    m.set("runbook_last_run_exit_code", summary.get("exit_code"))
    m.set("runbook_last_run_completed", int(all(n.get("status") == "ok" for n in summary.get("notebooks") or [])))
    host, run_id = str(summary.get("host") or ""), str(summary.get("run_id") or "")
    url = f"{link_base}/{host}/{run_id}/summary.html" if link_base and m.label_ok(host) and m.label_ok(run_id) else ""
    m.set("runbook_last_run_info", 1, host=host, run_id=run_id, url=url)
    m.set("runbook_run_interval_seconds", interval_s)
    return finished


def _stage(m: Metrics, stage: str, findings: list[Finding], when: float | None, budget: list[int]) -> None:
    m.set("runbook_stage_timestamp_seconds", when, stage=stage)
    tally = {s: 0 for s in STATUSES}
    for f in findings:
        tally[f.status] += 1
        if budget[0] > 0 and m.label_ok(f.id):
            m.set("runbook_finding", 1, stage=stage, id=f.id, status=f.status)
            budget[0] -= 1
    for status, n in tally.items():
        m.set("runbook_findings", n, stage=stage, status=status)


def _checks(m: Metrics, findings: list[Finding]) -> None:
    for check, pattern in CHECKS.items():
        statuses = {f.status for f in findings if re.fullmatch(pattern, f.id)}
        if statuses & {"warn", "fail"}:
            m.set("runbook_check_failed", 1, check=check)
        elif "pass" in statuses:
            m.set("runbook_check_failed", 0, check=check)


def _levels(m: Metrics, bench: dict[str, Any]) -> None:
    for lv in bench.get("levels") or []:
        label = _dict(lv).get("label")
        if not isinstance(label, str) or not m.label_ok(label):
            continue
        m.set("runbook_bench_output_tokens_per_second", lv.get("output_tok_s"), level=label)
        for key, gauge in (("ttft_ms", "runbook_bench_ttft_seconds"), ("tpot_ms", "runbook_bench_tpot_seconds")):
            q = _dict(lv.get(key))
            for p in ("p50", "p99"):     # `quantile` is reserved for summaries (promtool check metrics)
                ms = number(q.get(p))
                if ms is not None:
                    m.set(gauge, ms / 1000, level=label, percentile=p)


def _figures(m: Metrics, figs: dict[str, Any], previous: dict[str, Any] | None, verify: dict[str, Any]) -> None:
    for key, gauge in _FIGURES.items():
        m.set(gauge, figs.get(key))
    # verify's own reading wins for the pool: the plan it compared with, and the log's (else /server_info's) figure
    pred, obs, srv = (_dict(verify.get(k)) for k in ("predicted", "observed", "server"))
    if number(pred.get("max_total_num_tokens")) is not None:
        m.set("runbook_kv_tokens_planned", pred["max_total_num_tokens"])
    seen = number(obs.get("max_total_num_tokens"))
    m.set("runbook_kv_tokens_observed", seen if seen is not None else srv.get("max_total_num_tokens"))
    prev = (previous or {}).get("metrics") or {}
    now_tps, then_tps = figs.get("output_tok_s") or {}, prev.get("output_tok_s") or {}
    for level, tps in now_tps.items() if isinstance(now_tps, dict) and isinstance(then_tps, dict) else ():
        then = number(then_tps.get(level))
        if then and number(tps) is not None:
            m.set("runbook_bench_change_ratio", round(tps / then - 1, 6), figure="output_tok_s", level=level)
    for key in _CHANGES:
        now, then = number(figs.get(key)), number(prev.get(key))
        if now is not None and then:
            m.set("runbook_bench_change_ratio", round(now / then - 1, 6), figure=key, level="all")


def _replicas(m: Metrics, rows: Any) -> None:
    """verify's replicas (with a topology): answering, and registered and healthy in the gateway's own view."""
    for r in rows if isinstance(rows, list) else ():
        r = _dict(r)
        name = str(r.get("name"))
        if not m.label_ok(name):
            continue
        for key in ("up", "registered", "healthy"):
            if isinstance(r.get(key), bool):
                m.set(f"runbook_replica_{key}", int(r[key]), replica=name)


def _measured(m: Metrics, stages: dict[str, tuple[list[Finding], dict[str, Any]]], figs: dict[str, Any],
              previous: dict[str, Any] | None, threshold_pct: float) -> None:
    """What the stages decided and measured: checks, benchmark levels, figures, drift."""
    _checks(m, [f for found, _ in stages.values() for f in found])
    data = {stage: d for stage, (_, d) in stages.items()}
    _levels(m, data.get("benchmark") or {})
    _figures(m, figs, previous, data.get("verify") or {})
    _replicas(m, _dict(data.get("verify")).get("replicas"))
    drift = data.get("service") or {}
    if drift.get("server") and isinstance(drift.get("drift"), list):
        m.set("runbook_service_drift_flags", len(drift["drift"]))
    if "benchmark" in stages:
        m.set("runbook_bench_regression_threshold_ratio", threshold_pct / 100)


def collect(summary: dict[str, Any], run_dir: Path, previous: dict[str, Any] | None = None, interval_s: float = 86400,
            link_base: str | None = None, threshold_pct: float = 10.0, scrub: Iterable[str] = ()) -> Metrics:
    """The gauges of one finished run. `previous`: the deployment's run before it (its summary), for the
    benchmark's change ratios; `scrub`: secret values no label may contain."""
    m = Metrics(str(summary.get("deployment")), "run", scrub)
    finished = _run(m, summary, interval_s, link_base)
    names = _stage_names()
    stages: dict[str, tuple[list[Finding], dict[str, Any]]] = {}
    budget = [MAX_FINDING_SERIES]
    for nb in summary.get("notebooks") or []:
        stem = str(nb.get("name") or "")
        stage = names.get(stem, re.sub(r"^\d+[_-]", "", stem))
        doc = _results(run_dir, nb)
        stages[stage] = (_findings(doc), _dict(doc.get("data")))
        m.set("runbook_notebook_completed", int(nb.get("status") == "ok"), stage=stage)
        m.set("runbook_notebook_duration_seconds", nb.get("duration_s"), stage=stage)
        _stage(m, stage, stages[stage][0], finished, budget)
    _measured(m, stages, _dict(summary.get("metrics")), previous, threshold_pct)
    return m


def collect_stage(deployment: str, stage: str, findings: list[Finding], data: dict[str, Any], when: float,
                  slo: Any = None, threshold_pct: float = 10.0, scrub: Iterable[str] = ()) -> Metrics:
    """The gauges of one stage verb's report (`runbook verify --textfile-dir DIR`): its findings, checks and
    figures, with source="verb"; no run gauges (the "not run" alert stays the runs' own)."""
    m = Metrics(deployment, "verb", scrub)
    _stage(m, stage, findings, when, [MAX_FINDING_SERIES])
    st = registry.get(stage)
    figs = st.figures(data, slo) if st.figures is not None else {}
    _measured(m, {stage: (findings, data)}, figs, None, threshold_pct)
    return m
