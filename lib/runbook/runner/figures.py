"""The few figures a fleet follows over time, taken from a run's results files into its summary.json,
so the fleet index reads one small file per run. Which figures, and from which results, each stage
declares in the registry (`Stage.figures`): KV pool tokens planned and observed, output tok/s per
benchmark level, the highest load within the SLOs, the accuracy probes' scores. Absent figures are
left out: a run without a server has only the plan."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runbook.core import registry


def _data(run_dir: Path, notebook: str) -> dict[str, Any]:
    try:
        doc = json.loads((run_dir / f"{notebook}.results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    data = doc.get("data") if isinstance(doc, dict) else None
    return data if isinstance(data, dict) else {}


def figures(run_dir: Path, slo: Any = None) -> dict[str, Any]:
    """Every registered stage's figures from its results in `run_dir` (whichever this run measured)."""
    out: dict[str, Any] = {}
    for stage in registry.stages():
        if stage.figures is not None:
            out.update(stage.figures(_data(run_dir, stage.notebook), slo))
    return out
