"""Stage 30's one entry point: check + diff + install plan (dry run) + drift, over one built unit."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.service.check import check
from runbook.service.diff import diff
from runbook.service.drift import drift
from runbook.service.install import install
from runbook.service.render import Rendered, build


@dataclass
class ServiceReport:
    units: list[Rendered]
    findings: list[Finding]
    diff_text: str = ""
    changes: list[dict[str, str]] = field(default_factory=list)
    install_plan: list[dict[str, str]] = field(default_factory=list)
    drift: list[dict[str, str]] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        """The results-JSON data (the notebook's and `service report --json`'s, less the findings)."""
        return {"units": [{"unit": u.unit_name, "node": u.node, "argv": u.argv} for u in self.units],
                "diff": self.diff_text, "changes": self.changes, "install_plan": self.install_plan,
                "drift": self.drift, "server": self.server}

    def to_json(self) -> dict[str, Any]:
        return dict(self.data(), findings=[f.to_dict() for f in self.findings])


def evaluate(spec: Deployment, args: Optional[dict[str, Any]] = None, installed: Optional[str | Path] = None,
             url: Optional[str] = None) -> ServiceReport:
    """Everything 30_service shows, built from one unit (checkpoint read once)."""
    b = build(spec, args, with_quant=True)
    units, findings = check(spec, args, built=b)
    text, changes, diff_findings = diff(b.unit, Path(installed or spec.systemd.installed_path))
    plan = install(spec, b.unit, dry_run=True)  # its "dry run: nothing changed" is not a finding of the check
    rows, drift_findings, server = drift(spec, url or None, args, built=b)
    return ServiceReport(units, findings + diff_findings + drift_findings, text, changes,
                         plan.steps, rows, server)
