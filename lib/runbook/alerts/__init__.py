"""Alerts from cron (`runbook run --textfile-dir DIR`): every finished run as Prometheus metrics in
node_exporter's textfile collector, for the rules in deploy/prometheus/ and the dashboard in deploy/grafana/.

An upper layer like runner and fleet: it reads a run's summary and results files, never a stage's code
(stages are reached through the registry). `metrics` turns a run into gauges, `textfile` writes them.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from runbook.alerts import metrics, textfile
from runbook.core import registry, secrets
from runbook.core.archive import list_runs

__all__ = ["metrics", "textfile", "publish", "publish_stage"]


def _previous(out_dir: Path, deployment: str, run_id: str) -> dict[str, Any] | None:
    """The deployment's finished run before `run_id` (its summary), for the benchmark's change ratios."""
    older = [r for r in list_runs(out_dir) if r.get("deployment") == deployment and r.get("_dir") != run_id
             and str(r.get("started", "")) and r.get("metrics")]
    return older[0] if older else None


def publish(directory: Path, summary: dict[str, Any], run_dir: Path, spec: Any, scrub: Iterable[str],
            log: Callable[[str], None]) -> Path | None:
    """Write the run's textfile; a failure is logged, never fatal (the archived run is the record)."""
    try:
        prev = _previous(run_dir.parent, spec.name, run_dir.name)
        m = metrics.collect(summary, run_dir, prev, spec.alerts.interval_s, spec.alerts.link_base,
                            spec.benchmark.regression_threshold_pct, scrub)
        path = textfile.write(directory, spec.name, m.registry, scrub)
        for nb in summary.get("notebooks") or []:     # the run supersedes a stage verb's report of a stage it ran
            stage = next((s.name for s in registry.stages() if s.notebook == nb.get("name")), None)
            if stage:
                textfile.path_for(directory, spec.name, stage).unlink(missing_ok=True)
    except (OSError, ValueError) as e:
        log(f"alerts: textfile not written to {directory}: {e}; the previous file is left as it was")
        return None
    log(f"alerts: metrics written to {path}")
    return path


def publish_stage(directory: Path, spec: Any, stage: str, report: Any, log: Callable[[str], None]) -> Path | None:
    """A stage verb's report as runbook_<deployment>.<stage>.prom (source="verb"), until a run of that stage replaces it."""
    try:
        scrub = secrets.of_spec(spec)
        m = metrics.collect_stage(spec.name, stage, list(report.findings), report.data(), time.time(), spec.slo,
                                  spec.benchmark.regression_threshold_pct, scrub)
        path = textfile.write(directory, spec.name, m.registry, scrub, stage=stage)
    except (OSError, ValueError) as e:
        log(f"alerts: textfile not written to {directory}: {e}; the previous file is left as it was")
        return None
    log(f"alerts: metrics written to {path}")
    return path
