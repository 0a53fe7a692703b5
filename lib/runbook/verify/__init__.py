"""Stage 35: the running server against the plan. `evaluate(spec, ...)` is the entry point
(`runbook verify`, 35_verify): it reads the last start of the server's log (the unit's journal or a
saved file), parses SGLang's own start-up lines (`logparse`), and compares what the server did with
what 20_kv_memory predicted for the unit and with /server_info (`compare`); `report` holds the tables."""
from runbook.core.lazy import exports
from runbook.verify.stage import STAGE, VerifyOptions, evaluate

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"compare_frame": "report", "fleet_frame": "report", "plot_memory": "report",
    "startup_frame": "report", "text_table": "report", "warnings_frame": "report", "VerifyReport": "stage",
    "inspect": "stage"})

__all__ = ["STAGE", "VerifyOptions", "VerifyReport", "inspect", "compare_frame", "evaluate", "fleet_frame", "plot_memory",
           "startup_frame", "text_table", "warnings_frame"]
