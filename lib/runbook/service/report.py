"""Tables and text for 30_service: every unit, what installing would change, the install plan, the drift against the
server. Each takes the stage's report and returns None for an empty one (an input error: `registry.display`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from runbook.core.registry import display


@display
def units_line(rep: Any) -> str:
    """How many units the spec renders and their names, on one line."""
    return f"{len(rep.units)} unit(s): " + ", ".join(u.unit_name + ".service" for u in rep.units)


@display
def unit_text(rep: Any) -> str:
    """The first unit file as it would be installed."""
    return str(rep.units[0].text)


@display
def diff_text(rep: Any) -> str:
    """The unified diff against the installed unit, or why there is none."""
    return str(rep.diff_text or "no installed unit to diff, or no change")


@display
def units_frame(rep: Any) -> pd.DataFrame:
    """Every unit the spec renders, where it goes: each server's (one, each replica's, each node rank's), the gateway's."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame([{"unit": f"{u.unit_name}.service", "role": u.role, "host": u.host or "this host",
                          "replica": u.replica, "node": u.node, "rank": u.rank if u.node else None} for u in rep.units])


@display
def changes_frame(rep: Any) -> pd.DataFrame | None:
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame(rep.changes) if rep.changes else None


@display
def plan_frame(rep: Any) -> pd.DataFrame:
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame(rep.install_plan)


@display
def drift_frame(rep: Any) -> pd.DataFrame:
    """Differing flags when there are any; else what the server reports (or why it could not be read)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    if rep.drift:
        return pd.DataFrame(rep.drift)
    why = next((f.title for f in rep.findings if f.id == "service.drift"), "not checked")
    return pd.Series(rep.server or {"server": why}, name="value").to_frame()
