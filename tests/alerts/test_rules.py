"""The alert rules and the dashboard against the metrics the exporter writes: promtool checks and unit tests
(deploy/prometheus/tests/), and every metric name a rule or a panel uses is one metrics.GAUGES declares."""
import json
import re
import shutil

import pytest
import yaml
from conftest import REPO

from runbook.alerts import metrics
from runbook.core import registry

from .conftest import promtool

PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "runbook.rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "runbook.json"
NODE_EXPORTER = {"node_textfile_mtime_seconds", "node_textfile_scrape_error"}   # what its textfile collector adds
# SGLang's own /metrics that a rule reads, as SGLang 0.5.23 names them — sglang:NAME, or sglang_NAME where Prometheus
# asked for OpenMetrics (tests/alerts/test_gateway_share.py scrapes the real replicas with a real Prometheus)
SGLANG = {"sglang[:_]num_requests_total"}
_FUNCS = {"time", "sum", "by", "on", "group_left", "count", "max", "min", "label_values", "and", "or", "unless"}


def metric_names(expr: str) -> set[str]:
    """The runbook_* metric names an expression (or template) reads."""
    return set(re.findall(r"\b(runbook_[a-z0-9_]+)\b", expr))


def test_promtool_checks_the_rules():
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests_pass():
    res = promtool("test", "rules", "tests/runbook.test.yml", cwd=PROM)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_unit_tests_catch_a_broken_rule(tmp_path):
    """The same tests against a rule that no longer fires (failed findings must exceed 5) fail."""
    shutil.copytree(PROM, tmp_path / "prometheus")
    rules = tmp_path / "prometheus" / "runbook.rules.yml"
    rules.write_text(rules.read_text().replace('runbook_findings{status="fail"} > 0', 'runbook_findings{status="fail"} > 5'))
    res = promtool("test", "rules", "tests/runbook.test.yml", cwd=tmp_path / "prometheus")
    assert res.returncode != 0 and "RunbookCheckFailed" in res.stdout + res.stderr


@pytest.mark.parametrize("alert, old, new", [
    # the naive absent() fires only when no deployment of any host is left
    ("RunbookTextfileMissing", "last_over_time(runbook_run_interval_seconds[7d]) unless on(instance, job, deployment) "
     "runbook_run_interval_seconds", "absent(runbook_run_interval_seconds)"),
    ("RunbookTextfileStale", "group_left() 2 * runbook_run_interval_seconds", "group_left() 20 * runbook_run_interval_seconds"),
    ("RunbookTextfileScrapeError", "node_textfile_scrape_error == 1", "node_textfile_scrape_error > 1"),
])
def test_the_unit_tests_catch_a_rule_that_misses_silence(tmp_path, alert, old, new):
    shutil.copytree(PROM, tmp_path / "prometheus")
    rules = tmp_path / "prometheus" / "runbook.rules.yml"
    assert old in rules.read_text()
    rules.write_text(rules.read_text().replace(old, new))
    res = promtool("test", "rules", "tests/runbook.test.yml", cwd=tmp_path / "prometheus")
    assert res.returncode != 0 and alert in res.stdout + res.stderr


@pytest.mark.parametrize("alert, old, new", [
    ("RunbookReplicaUnregistered", "runbook_replica_healthy == 0 and on", "runbook_replica_healthy == 0 or on"),
    ("RunbookReplicaDown", "runbook_replica_up == 0\n", "runbook_replica_up == 0 and runbook_replica_healthy == 0\n"),
    ("RunbookGatewayOneReplica", ") > 0.9\n", ") > 0.99\n"),
    ("RunbookGatewayOneReplica", "count by (job, deployment) (up == 1) >= 2", "count by (job, deployment) (up == 1) >= 1"),
    ("RunbookGatewayOneReplica", 'num_requests_total"}[15m])) > 0.05', 'num_requests_total"}[15m])) > 0'),
    # only the name SGLang writes: Prometheus 2.x stores the escaped one
    ("RunbookGatewayOneReplica", '"sglang[:_]num_requests_total"', '"sglang:num_requests_total"'),
])
def test_the_unit_tests_catch_a_broken_replica_or_gateway_rule(tmp_path, alert, old, new):
    shutil.copytree(PROM, tmp_path / "prometheus")
    rules = tmp_path / "prometheus" / "runbook.rules.yml"
    assert old in rules.read_text()
    rules.write_text(rules.read_text().replace(old, new))
    res = promtool("test", "rules", "tests/runbook.test.yml", cwd=tmp_path / "prometheus")
    assert res.returncode != 0 and alert in res.stdout + res.stderr


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_rule_reads_metrics_the_exporter_writes_and_links_the_run():
    """Each rule reads the exporter's metrics (node_exporter's own textfile metrics besides) and links the run; the
    one rule about the host's textfile directory as a whole has no run to link."""
    known = {name for name, _, _ in metrics.GAUGES}
    for rule in _rules():
        used = metric_names(rule["expr"]) | set().union(*(metric_names(v) for v in rule["annotations"].values()))
        node = set(re.findall(r"\b(node_[a-z0-9_]+)\b", rule["expr"]))
        assert node <= NODE_EXPORTER, (rule["alert"], node - NODE_EXPORTER)
        sglang = set(re.findall(r"\b(sglang\[:_\][a-z0-9_:]+)", rule["expr"]))
        assert sglang <= SGLANG, (rule["alert"], sglang - SGLANG)
        assert used <= known and (used or node or sglang), (rule["alert"], used - known)
        assert {"summary", "description"} | ({"runbook_url"} if used else set()) <= set(rule["annotations"]), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket")


def test_every_check_a_rule_names_is_one_the_exporter_decides():
    named = {c for r in _rules() for alt in re.findall(r'check=~?"([^"]+)"', r["expr"]) for c in alt.split("|")}
    assert named and named <= set(metrics.CHECKS), named - set(metrics.CHECKS)


def test_the_checks_name_findings_the_stages_emit():
    """Each check's pattern matches an id written in its stage's source (an id renamed there breaks this)."""
    src = "\n".join(p.read_text() for p in (REPO / "lib" / "runbook").rglob("*.py") if "alerts" not in p.parts)
    ids = set(re.findall(r'Finding\(\s*f?"([a-z_.{}]+)"', src)) | set(re.findall(r'_agg\("([a-z_.]+)"', src))
    ids = {re.sub(r"\{id_prefix\}", "verify", i) for i in ids}
    for check, pattern in metrics.CHECKS.items():
        assert any(re.fullmatch(pattern, re.sub(r"\{[^}]+\}", "x", i)) for i in ids), check


def _exprs(dash: dict) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])] + \
           [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]


def test_the_dashboard_is_json_over_the_exporters_metrics_with_a_row_per_stage():
    dash = json.loads(DASHBOARD.read_text())
    known = {name for name, _, _ in metrics.GAUGES}
    used = set().union(*(metric_names(e) for e in _exprs(dash)))
    assert used <= known, used - known
    assert known - used <= {"runbook_last_run_info", "runbook_run_interval_seconds", "runbook_bench_regression_threshold_ratio",
                             "runbook_notebook_completed"}, known - used
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows[0].startswith("Fleet") and rows[1:] == [s.notebook for s in registry.stages()]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = [(p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy) for p in dash["panels"]
             for dx in range(p["gridPos"]["w"]) for dy in range(p["gridPos"]["h"])]
    assert len(cells) == len(set(cells)) and max(x for x, _ in cells) < 24     # no two panels overlap, 24 columns
    assert all("$instance" in e for e in _exprs(dash) if "label_values(runbook_last_run_timestamp_seconds," not in e)
