"""Stage 30's contract: its settings and `evaluate`, check + diff + install plan (dry run) + drift over
one built unit (what 30_service shows and `runbook service report` prints). The other actions
(render, check, diff, install, drift) are the verb's, over the same options and the same built unit."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from runbook.core.findings import Finding
from runbook.core.fsutil import write_output
from runbook.core.numeric import number
from runbook.core.options import Options, PosFloat, Url
from runbook.core.registry import Outcome, Stage, register
from runbook.core.settings import Settings, options_view
from runbook.core.spec import Deployment
from runbook.service import gateway, kubernetes
from runbook.service.check import check
from runbook.service.diff import diff
from runbook.service.install import install, local_units, unit_path
from runbook.service.render import Rendered, build, parse_args
from runbook.service.topodrift import drift_all


@dataclass
class ServiceReport:
    units: list[Rendered]
    findings: list[Finding]
    diff_text: str = ""
    changes: list[dict[str, str]] = field(default_factory=list)
    install_plan: list[dict[str, str]] = field(default_factory=list)
    drift: list[dict[str, str]] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        """The results-JSON data (the notebook's and `service report --json`'s, less the findings)."""
        return {"units": [unit_row(u) for u in self.units],
                "diff": self.diff_text, "changes": self.changes, "install_plan": self.install_plan,
                "drift": self.drift, "server": self.server}


def unit_row(u: Rendered) -> dict[str, Any]:
    """One unit in --json and the results: where it goes (host, replica, node rank, role) and its argv."""
    return {"unit": u.unit_name, "node": u.node, "argv": u.argv, "role": u.role,
            "replica": u.replica, "host": u.host, "rank": u.rank}


def all_units(spec: Deployment, args: dict[str, Any] | None = None) -> list[Rendered]:
    """Every unit the spec renders: each server's (one, each replica's or each node rank's), then the gateway's."""
    units = build(spec, args).units
    return units + ([gateway.render_unit(spec)] if spec.topology.gateway is not None else [])


def assess(spec: Deployment, args: dict[str, Any] | None = None, installed: str | Path | None = None,
           url: str | None = None) -> ServiceReport:
    """Everything 30_service shows, built from one unit (checkpoint read once)."""
    b = build(spec, args, with_quant=True)
    units, findings = check(spec, args, built=b)
    text, changes, diff_findings = diff(b.unit, Path(installed or spec.systemd.installed_path))
    plan = install(spec, b.unit, dry_run=True)  # its "dry run: nothing changed" is not a finding of the check
    rows, drift_findings, server = drift_all(spec, url or None, args, built=b)
    return ServiceReport(units, findings + diff_findings + drift_findings, text, changes,
                         plan.steps, rows, server)


class ServiceSettings(Settings):
    action: Literal["render", "check", "diff", "install", "drift", "k8s", "report"] = Field(
        "report", description="report: check + diff + install plan + drift, what 30_service shows",
        json_schema_extra={"positional": "ACTION"})
    args: list[str] = Field([], alias="arg", description="add or override one SGLang flag, NAME=VALUE "
                            "(what-if; default: the spec's flags as they are)",
                            json_schema_extra={"metavar": "NAME=VALUE", "each": True})   # a value may hold commas
    installed_unit: str | None = Field(None, alias="installed", description="diff, report: the installed unit "
                                          "(default: systemd.unit_path or /etc/systemd/system/<name>.service)")
    server_url: Url | None = Field(None, alias="url",
                                   description="drift, report: server base URL (default: http://host:port from the spec)")
    # None in the next four: each unit's own (its installed path, its host:port, ...), worked out per unit.
    # The settings of the verb's other actions (render, k8s, install) are no parameter of notebook 30 ("notebook": False).
    out: str | None = Field(None, description="render: write the unit here (a directory when the spec renders more than "
                            "one unit: node ranks, replicas, the gateway); k8s: write the manifests here (a directory)",
                            json_schema_extra={"notebook": False})
    image: str = Field(kubernetes.DEFAULT_IMAGE, description="k8s: the SGLang container image",
                              json_schema_extra={"notebook": False})
    gateway_image: str | None = Field(None, description="k8s: the gateway's container image, holding its wheel "
                                      "(default: --image)", json_schema_extra={"notebook": False})
    yes: bool = Field(False, description="install: really do it (default: dry run)",
                             json_schema_extra={"switch": True, "notebook": False})
    root: str | None = Field(None, description="install: prefix for the unit path (testing, chroots)",
                             json_schema_extra={"notebook": False})
    systemctl: str = Field("systemctl", description="install: systemctl command to use", json_schema_extra={"notebook": False})
    ready_url: Url | None = Field(None, description="install: readiness URL (default: http://host:port + systemd.ready_path)",
                                  json_schema_extra={"notebook": False})
    ready_timeout: PosFloat | None = Field(None, description="install: readiness timeout (default: systemd.timeout_start_sec)",
                                         json_schema_extra={"notebook": False})


# The flags and notebook parameters: the settings a user sets, None meaning the default (each unit's own where it is).
ServiceOptions = options_view(ServiceSettings, "ServiceOptions")


def evaluate(spec: Deployment, options: Options) -> ServiceReport:
    s = ServiceSettings.resolve(spec, options)
    return assess(spec, parse_args(s.args), s.installed_unit, s.server_url)


def _render(spec: Deployment, options: Options) -> Outcome:
    """The unit files: written under --out (a line on stderr each), else printed; --json lists them."""
    o = ServiceSettings.resolve(spec, options)
    units = all_units(spec, parse_args(o.args))
    if o.out:
        out = Path(o.out)
        for u in units:
            target = out if len(units) == 1 else out / f"{u.unit_name}.service"
            write_output(target, u.text)   # one line naming --out when it is a directory or not writable
            print(f"wrote {target}", file=sys.stderr)
    return Outcome([], {"units": [{**unit_row(u), "text": u.text} for u in units]},
                   shown="" if o.out else "\n".join(u.text for u in units), listed=False)


def _check(spec: Deployment, options: Options) -> Outcome:
    o = ServiceSettings.resolve(spec, options)
    return Outcome(check(spec, parse_args(o.args))[1], {})


def _diff(spec: Deployment, options: Options) -> Outcome:
    """The diff against the installed unit, printed in place of the findings when there is one."""
    o = ServiceSettings.resolve(spec, options)
    unit = local_units(spec, parse_args(o.args), one=o.installed_unit is not None)[0]
    text, rows, findings = diff(unit, Path(o.installed_unit or unit_path(spec, unit)))
    return Outcome(findings, {"diff": text, "changes": rows}, shown=text + "\n" if text else None)


def _install(spec: Deployment, options: Options) -> Outcome:
    """This host's units (the one server's; with a topology, the replicas, node ranks and gateway placed on it)."""
    o = ServiceSettings.resolve(spec, options)
    findings: list[Any] = []
    data: dict[str, Any] = {"steps": [], "rolled_back": False, "backup": None}
    for unit in local_units(spec, parse_args(o.args), one=o.ready_url is not None):
        res = install(spec, unit, dry_run=not o.yes, root=Path(o.root) if o.root else None,
                      systemctl=o.systemctl.split() or ["systemctl"], ready_url=o.ready_url,
                      ready_timeout=o.ready_timeout, log=lambda m: print(m, file=sys.stderr))
        findings += res.findings
        data["steps"] += res.steps
        data["rolled_back"] = data["rolled_back"] or res.rolled_back
        data["backup"] = data["backup"] or res.backup
        if any(f.status == "fail" for f in res.findings):
            break       # the next unit is not touched after one failed (and was rolled back)
    return Outcome(findings, data)


def _k8s(spec: Deployment, options: Options) -> Outcome:
    """Kubernetes manifests from the spec: validated against the schemas, their commands by the programs' parsers;
    written to --out DIR/<name>.yaml, else printed."""
    o = ServiceSettings.resolve(spec, options)
    docs = kubernetes.manifests(spec, o.image, o.gateway_image)
    findings = kubernetes.validate(docs) + kubernetes.check_commands(spec, docs)
    text = kubernetes.to_yaml(spec, docs)
    target = None
    if o.out:
        target = Path(o.out) / f"{kubernetes.base_name(spec)}.yaml"
        write_output(target, text)
        print(f"wrote {target}", file=sys.stderr)
    else:   # the YAML is stdout: what failed goes to stderr
        for f in findings:
            if f.status == "fail":
                print(f"fail {f.id}: {f.title}", file=sys.stderr)
    return Outcome(findings, {"manifests": [kubernetes.plain(d) for d in docs], "file": str(target) if target else None},
                   shown=None if o.out else text)


def _drift(spec: Deployment, options: Options) -> Outcome:
    o = ServiceSettings.resolve(spec, options)
    rows, findings, info = drift_all(spec, o.server_url, parse_args(o.args))
    return Outcome(findings, {"differences": rows, "server": info})


def figures(data: dict[str, Any], slo: Any = None) -> dict[str, Any]:
    """The token pool the running server reports (/server_info, read by the drift check)."""
    server = data.get("server") or {}
    tokens = number(server.get("max_total_num_tokens") if isinstance(server, dict) else None)
    return {"kv_tokens_observed": int(tokens)} if tokens is not None else {}


STAGE = register(Stage(30, "service", "service", "render, check, diff, install or drift-check the systemd unit",
                       ServiceOptions, evaluate, figures=figures, trends=("kv_tokens_observed",),
                       actions={"render": _render, "check": _check, "diff": _diff, "install": _install, "drift": _drift,
                                "k8s": _k8s},
                       action_field="action"))
