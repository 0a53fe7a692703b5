"""What notebook 00 and `runbook env` show: the GPUs, their processes and topology, the serving environment and host.
Each takes the stage's report and returns None for an empty one (an input error: `registry.display`)."""
from __future__ import annotations

from typing import Any

from runbook.core.registry import display


@display
def gpus_frame(report: Any):
    """One row per visible GPU; without any, one row saying why (the first finding)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    if report.gpus:
        return pd.DataFrame(report.gpus)
    return pd.DataFrame([{"GPUs": f"none visible: {report.findings[0].title}" if report.findings else "none visible"}])


@display
def processes_frame(report: Any):
    """The processes holding GPU memory ("none" when there are none)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame(report.processes or [{"note": "none"}])


@display
def topology_frame(report: Any):
    """How the GPUs are linked (NVLink, PCIe), when there are two or more."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame(report.topology or [{"note": "no topology (fewer than 2 GPUs or no driver)"}])


@display
def env_frame(report: Any):
    """The serving interpreter's versions and the host facts, one row each."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    s = report.serving or {}
    rows = {**{k: v for k, v in s.items() if k != "packages"}, **s.get("packages", {}), **report.host}
    return pd.Series(rows, name="value", dtype=object).to_frame()
