"""Tables for 30_service: every unit, what installing would change, the install plan, the drift against the server."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def units_frame(rep: Any) -> pd.DataFrame:
    """Every unit the spec renders, where it goes: each server's (one, each replica's, each node rank's), the gateway's."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame([{"unit": f"{u.unit_name}.service", "role": u.role, "host": u.host or "this host",
                          "replica": u.replica, "node": u.node, "rank": u.rank if u.node else None} for u in rep.units])


def changes_frame(rep: Any) -> pd.DataFrame | None:
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame(rep.changes) if rep.changes else None


def plan_frame(rep: Any) -> pd.DataFrame:
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.DataFrame(rep.install_plan)


def drift_frame(rep: Any) -> pd.DataFrame:
    """Differing flags when there are any; else what the server reports (or why it could not be read)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    if rep.drift:
        return pd.DataFrame(rep.drift)
    why = next((f.title for f in rep.findings if f.id == "service.drift"), "not checked")
    return pd.Series(rep.server or {"server": why}, name="value").to_frame()
