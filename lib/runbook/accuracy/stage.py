"""Stage 50's one entry point: the offline KV-quantization study plus the live recall, greedy-identity and
tool-call probes (each a `skip` finding when its endpoint is not given or not reachable)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from runbook.accuracy import kvquant, probes, toolcall
from runbook.core.findings import Finding
from runbook.core.spec import Deployment


@dataclass
class AccuracyReport:
    study: kvquant.Study
    active: tuple[str, str]                       # this deployment's KV (format, scaling)
    recall: dict[str, Any] = field(default_factory=dict)
    identity: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    toolcall: dict[str, Any] = field(default_factory=dict)     # accuracy.toolcall.ToolCallReport.data()

    def data(self) -> dict[str, Any]:
        return {"kvquant": {"rows": self.study.rows, "growth": self.study.growth, "source": self.study.source,
                            "active": list(self.active)},
                "recall": dict(self.recall), "identity": self.identity, "toolcall": dict(self.toolcall)}

    def to_json(self) -> dict[str, Any]:
        return dict(self.data(), findings=[f.to_dict() for f in self.findings])


def evaluate(spec: Deployment, url: Optional[str] = None, compare_url: Optional[str] = None, spec_off_url: Optional[str] = None,
             lengths: Optional[Sequence[int]] = None, depths: Optional[Sequence[float]] = None,
             tokenizer: Optional[str] = None, seed: int = 0, per_cell: int = 1, artifact_dir: Optional[str | Path] = None,
             prompts: int = 8, max_tokens: int = 64, toolcall_max_tokens: int = 1024,
             tool_choice: str = "auto") -> AccuracyReport:
    """Empty or None arguments mean the spec's value (lengths up to its --context-length)."""
    active = probes.deployment_format(spec)
    study = kvquant.run(spec.accuracy, active=active)
    rec, recall_findings = probes.run_recall(url or None, probes.recall_lengths(spec, list(lengths or [])),
                                             list(depths or spec.accuracy.recall_depths), tokenizer or None,
                                             compare_url or None, seed, per_cell, Path(artifact_dir) if artifact_dir else None,
                                             spec.serving.api_key_env)
    rows, identity_findings = probes.run_identity(url or None, spec_off_url or None, prompts, max_tokens, tokenizer or None)
    env = spec.serving.api_key_env
    tc = toolcall.run(url or None, api_key=(os.environ.get(env) or None) if env else None,
                      max_tokens=toolcall_max_tokens, tool_choice=tool_choice)
    return AccuracyReport(study, active, rec, rows, study.findings + recall_findings + identity_findings + tc.findings,
                          tc.data())
