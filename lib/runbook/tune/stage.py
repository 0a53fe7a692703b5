"""Stage 60's contract: its settings (settings.py) and `evaluate`, the tune run (pre-check, launches, recommendation)."""
from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field
from typing import Any

from runbook.core.findings import Finding
from runbook.core.numeric import number
from runbook.core.options import Options
from runbook.core.registry import Stage, register
from runbook.core.spec import SLO, Deployment
from runbook.tune.settings import TuneOptions, TuneSettings


@dataclass
class TuneReport:
    findings: list[Finding]
    rows: list[dict[str, Any]] = field(default_factory=list)
    recommendation: dict[str, Any] | None = None
    run_id: str | None = None
    run_dir: str | None = None
    plan_only: bool = False
    engine: str = "sglang"
    resumed: list[str] = field(default_factory=list)

    def data(self) -> dict[str, Any]:
        rows = [{k: v for k, v in r.items() if k != "guard_outputs"} for r in self.rows]
        return {"engine": self.engine, "plan_only": self.plan_only, "run_id": self.run_id, "run_dir": self.run_dir,
                "resumed": self.resumed, "candidates": rows, "recommendation": self.recommendation}


def _progress(msg: str) -> None:
    """One line per candidate on stderr: a tune run takes minutes to hours."""
    print(f"{dt.datetime.now(dt.timezone.utc):%H:%M:%SZ} tune: {msg}", file=sys.stderr, flush=True)


def evaluate(spec: Deployment, options: Options) -> TuneReport:
    """The tune run under the options (a test's own systemctl or NVML goes to `assess`)."""
    return assess(spec, TuneSettings.resolve(spec, options))


def assess(spec: Deployment, s: TuneSettings, **hooks: Any) -> TuneReport:
    """The tune run under its settings: the candidates tried (trials.tune) and their findings."""
    from runbook.tune.findings import findings  # lazy: the run's modules (launch, engines, bench) load with the run
    from runbook.tune.trials import tune  # lazy: as above; the registry imports this module for every CLI verb

    hooks.setdefault("log", _progress)
    res = tune(spec, s, **hooks)
    return TuneReport(findings(spec, res), res["rows"], res["recommendation"], res["run_id"], res["run_dir"],
                      res["plan_only"], spec.tune.engine, res["resumed"])


def text(rep: TuneReport) -> str:
    """What `runbook tune` prints above its findings: the candidates' table and the recommendation."""
    from runbook.tune.report import text_table  # lazy: the report module only when a table is printed

    return text_table(rep)


def figures(data: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    """The recommendation for the run summary and the fleet index."""
    rec = data.get("recommendation")
    if not isinstance(rec, dict) or not rec.get("name"):
        return {}
    out: dict[str, Any] = {"tune_recommended": str(rec["name"])}
    limit, tps = number(rec.get("slo_limit")), number(rec.get("output_tok_s"))
    if limit is not None:
        out["tune_max_concurrency_within_slo"] = int(limit)
    if tps is not None:
        out["tune_output_tok_s"] = round(float(tps), 2)
    return out


STAGE = register(Stage(60, "tune", "tune", "find the configuration to serve: pre-check, launch, measure and guard candidates "
                       "(takes the server down)", TuneOptions, evaluate, figures=figures,
                       in_default_run=False, text=text))
