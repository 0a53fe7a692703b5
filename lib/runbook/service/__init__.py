"""Stage 30: the systemd unit — built once from spec + what-ifs + recommendations (`build`), then
rendered, checked, diffed, installed and compared with the running server. `evaluate` is the
stage's entry point: what 30_service shows and `runbook service report` prints."""
# `check`, `diff`, `drift`, `install` and `render` here are the functions: the from-import rebinds each name the
# import system had set to its module.
from runbook.service.check import check, check_flags, check_flags_many, cross_checks, serving_python, verify_unit
from runbook.service.diff import diff
from runbook.service.drift import drift, redact_server_info, server_state
from runbook.service.gateway import argv_groups as gateway_argv
from runbook.service.gateway import render_unit as render_gateway
from runbook.service.gateway import unit_name as gateway_unit_name
from runbook.service.install import InstallResult, install, wait_ready
from runbook.service.render import Build, Rendered, build, effective_flags, parse_args, recommended_flags, render
from runbook.service.report import changes_frame, diff_text, drift_frame, plan_frame, unit_text, units_frame, units_line
from runbook.service.stage import STAGE, ServiceOptions, ServiceReport, assess, evaluate

__all__ = ["STAGE", "Build", "InstallResult", "Rendered", "ServiceOptions", "ServiceReport", "assess", "build",
           "changes_frame", "check", "gateway_argv", "gateway_unit_name", "render_gateway",
           "check_flags", "check_flags_many", "cross_checks", "diff", "drift", "drift_frame", "effective_flags",
           "evaluate", "install", "parse_args", "plan_frame", "recommended_flags", "redact_server_info", "render",
           "server_state", "serving_python", "units_frame", "verify_unit", "wait_ready", "units_line", "unit_text", "diff_text"]
