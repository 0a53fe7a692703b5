"""What notebook 00 and `runbook env` show: the serving environment and host as one table."""
from __future__ import annotations

from typing import Any


def env_frame(report: Any):
    """The serving interpreter's versions and the host facts, one row each."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    s = report.serving or {}
    rows = {**{k: v for k, v in s.items() if k != "packages"}, **s.get("packages", {}), **report.host}
    return pd.Series(rows, name="value", dtype=object).to_frame()
