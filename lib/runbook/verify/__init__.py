"""Stage 35: the running server against the plan. `evaluate(spec, ...)` is the entry point
(`runbook verify`, 35_verify): it reads the last start of the server's log (the unit's journal or a
saved file), parses SGLang's own start-up lines (`logparse`), and compares what the server did with
what 20_kv_memory predicted for the unit and with /server_info (`compare`); `report` holds the tables."""
from runbook.verify.report import compare_frame, fleet_frame, plot_memory, startup_frame, text_table, warnings_frame
from runbook.verify.stage import STAGE, VerifyOptions, VerifyReport, assess, evaluate

__all__ = ["STAGE", "VerifyOptions", "VerifyReport", "assess", "compare_frame", "evaluate", "fleet_frame", "plot_memory",
           "startup_frame", "text_table", "warnings_frame"]
