"""Stage 30: the systemd unit — built once from spec + what-ifs + recommendations (`build`), then
rendered, checked, diffed, installed and compared with the running server. `evaluate` is the
stage's entry point: what 30_service shows and `runbook service report` prints."""
from runbook.core.lazy import exports

# Functions named like their module are bound here, after the import system has set the module as the
# package attribute (stage.py imports all five anyway).
from runbook.service.check import check
from runbook.service.diff import diff
from runbook.service.drift import drift
from runbook.service.gateway import argv_groups as gateway_argv
from runbook.service.gateway import render_unit as render_gateway
from runbook.service.gateway import unit_name as gateway_unit_name
from runbook.service.install import install
from runbook.service.render import render
from runbook.service.stage import STAGE, ServiceOptions, evaluate

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"check_flags": "check", "check_flags_many": "check", "cross_checks": "check",
    "serving_python": "check", "verify_unit": "check", "redact_server_info": "drift",
    "server_state": "drift", "InstallResult": "install", "wait_ready": "install",
    "Build": "render", "Rendered": "render", "build": "render", "effective_flags": "render", "parse_args": "render",
    "recommended_flags": "render", "changes_frame": "report", "units_frame": "report", "drift_frame": "report",
    "plan_frame": "report", "units_line": "report", "unit_text": "report", "diff_text": "report", "ServiceReport": "stage",
    "assemble": "stage"})

__all__ = ["STAGE", "Build", "InstallResult", "Rendered", "ServiceOptions", "ServiceReport", "assemble", "build",
           "changes_frame", "check", "gateway_argv", "gateway_unit_name", "render_gateway",
           "check_flags", "check_flags_many", "cross_checks", "diff", "diff_text", "drift", "drift_frame", "effective_flags",
           "evaluate", "install", "parse_args", "plan_frame", "recommended_flags", "redact_server_info", "render",
           "server_state", "serving_python", "unit_text", "units_frame", "units_line", "verify_unit", "wait_ready"]
