"""Reading the run archive (outputs/): finished runs and a notebook's results in an earlier run.

The write side (HTML, index, retention) is the runner's; stages only ever read earlier results.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

INPROGRESS = ".inprogress-"



def list_runs(out_dir: Path) -> list[dict[str, Any]]:
    """Finished runs (a visible folder with summary.json), newest first."""
    runs: list[dict[str, Any]] = []
    if not out_dir.is_dir():
        return runs
    for d in out_dir.iterdir():
        if d.name.startswith(".") or d.is_symlink() or not d.is_dir():
            continue
        s = d / "summary.json"
        try:
            doc = json.loads(s.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        doc["_dir"] = d.name
        runs.append(doc)
    runs.sort(key=lambda r: r.get("started", ""), reverse=True)
    return runs


def previous_data(out_dir: Path, deployment: str, notebook: str, exclude: str | None = None,
                  usable: Callable[[dict[str, Any]], bool] = bool) -> dict[str, Any] | None:
    """The newest archived results `data` of one notebook for this deployment (not the run being written)."""
    for run in list_runs(out_dir):
        if run.get("deployment") != deployment or run.get("_dir") == exclude:
            continue
        p = out_dir / run["_dir"] / f"{notebook}.results.json"
        try:
            data = json.loads(p.read_text())["data"]
        except (OSError, ValueError, KeyError):
            continue
        if isinstance(data, dict) and usable(data):
            return data
    return None
