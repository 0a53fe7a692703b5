"""A finished run -> gauges: values, bounded labels, the stages' checks, change ratios, no secret anywhere."""
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runbook.alerts import metrics, textfile
from runbook.core.findings import Finding

from .conftest import RESULTS, SECRET, finding, promtool, write_run


def samples(text: str) -> dict[tuple, float]:
    """{(name, frozenset(labels)): value} of an exposition text."""
    return {(s.name, frozenset(s.labels.items())): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def one(got: dict, name: str, source: str = "run", **labels) -> float:
    return got[(name, frozenset({"deployment": "d1", "source": source, **labels}.items()))]


def collect(run_dir, **kw):
    summary = json.loads((run_dir / "summary.json").read_text())
    return textfile.render(metrics.collect(summary, run_dir, **kw).registry, kw.get("scrub", ()))


def test_a_run_becomes_its_gauges(tmp_path):
    text = collect(write_run(tmp_path), interval_s=3600, link_base="https://rb.example.com/fleet", threshold_pct=15)
    got = samples(text)
    assert one(got, "runbook_last_run_timestamp_seconds") == 1767578400 + 60
    assert one(got, "runbook_last_run_duration_seconds") == 60 and one(got, "runbook_last_run_exit_code") == 1
    assert one(got, "runbook_last_run_completed") == 1 and one(got, "runbook_run_interval_seconds") == 3600
    assert one(got, "runbook_last_run_info", host="gpu1", run_id="20260105T020000Z-d1",
               url="https://rb.example.com/fleet/gpu1/20260105T020000Z-d1/summary.html") == 1
    assert one(got, "runbook_bench_regression_threshold_ratio") == 0.15
    assert one(got, "runbook_notebook_duration_seconds", stage="verify") == 1.5
    assert one(got, "runbook_findings", stage="verify", status="fail") == 1
    assert one(got, "runbook_findings", stage="verify", status="skip") == 0
    assert one(got, "runbook_finding", stage="verify", id="verify.kv_dtype", status="fail") == 1
    assert one(got, "runbook_kv_tokens_planned") == 1_000_000 and one(got, "runbook_kv_tokens_observed") == 950_000
    assert one(got, "runbook_bench_output_tokens_per_second", level="c8") == 300
    assert one(got, "runbook_bench_ttft_seconds", level="c8", percentile="p99") == 0.8
    assert one(got, "runbook_bench_tpot_seconds", level="c1", percentile="p50") == 0.02
    assert one(got, "runbook_bench_max_concurrency_within_slo") == 8 and one(got, "runbook_accuracy_recall_ratio") == 0.9
    assert one(got, "runbook_stage_timestamp_seconds", stage="verify") == 1767578400 + 60


def test_checks_are_the_stages_own_verdicts(tmp_path):
    got = samples(collect(write_run(tmp_path)))
    checks = {dict(k[1])["check"]: v for k, v in got.items() if k[0] == "runbook_check_failed"}
    # fail / warn -> 1, pass -> 0, skip or nothing -> absent (identity only skipped; no service drift ran)
    assert checks == {"kv_dtype": 1, "context_len": 0, "kv_tokens": 1, "bench_regression": 1, "recall": 0, "toolcall": 1}


def test_a_notebook_that_did_not_run_is_incomplete(tmp_path):
    d = write_run(tmp_path)
    s = json.loads((d / "summary.json").read_text())
    s["notebooks"][1]["status"] = "failed"
    (d / "summary.json").write_text(json.dumps(s))
    got = samples(collect(d))
    assert one(got, "runbook_last_run_completed") == 0 and one(got, "runbook_notebook_completed", stage="verify") == 0
    assert one(got, "runbook_notebook_completed", stage="kv_memory") == 1


def test_change_ratios_against_the_previous_run(tmp_path):
    now = write_run(tmp_path)
    previous = {"metrics": {"output_tok_s": {"c1": 50.0, "c8": 400.0, "c64": 900.0}, "max_concurrency_within_slo": 16}}
    got = samples(collect(now, previous=previous))
    assert one(got, "runbook_bench_change_ratio", figure="output_tok_s", level="c8") == -0.25
    assert one(got, "runbook_bench_change_ratio", figure="output_tok_s", level="c1") == 0
    assert one(got, "runbook_bench_change_ratio", figure="max_concurrency_within_slo", level="all") == -0.5
    assert not [k for k in got if k[0] == "runbook_bench_change_ratio" and ("level", "c64") in k[1]]   # not measured now
    assert not [k for k in samples(collect(now)) if k[0] == "runbook_bench_change_ratio"]              # no previous run


@pytest.mark.parametrize("bad_id", ["verify kv dtype mismatch: served bf16", "/etc/runbook/secrets.env", "x" * 200,
                                    f"verify.{SECRET}", 'a"b', "multi\nline", ""])
def test_a_finding_id_that_is_not_an_id_is_counted_but_never_a_label(tmp_path, bad_id):
    results = dict(RESULTS, **{"35_verify": ([finding(bad_id, "fail", title=f"secret {SECRET}")], {})})
    text = collect(write_run(tmp_path, results=results), scrub=[SECRET])
    got = samples(text)
    assert one(got, "runbook_findings", stage="verify", status="fail") == 1
    assert not [k for k in got if k[0] == "runbook_finding" and ("stage", "verify") in k[1]]
    assert SECRET not in text and "/etc/runbook" not in text


def test_planted_secrets_reach_no_label(tmp_path):
    """A host name, a run id, a level label holding a secret: left out; the textfile never carries it."""
    results = dict(RESULTS, **{"40_benchmark": ([], {"levels": [{"label": SECRET, "output_tok_s": 1.0}]})})
    d = write_run(tmp_path, results=results, host=f"h-{SECRET}", metrics={"output_tok_s": {SECRET: 1.0}})
    text = collect(d, scrub=[SECRET], link_base="https://rb.example.com", previous={"metrics": {"output_tok_s": {SECRET: 2.0}}})
    assert SECRET not in text
    got = samples(text)
    assert not [k for k in got if k[0].startswith("runbook_bench_") and k[0] != "runbook_bench_regression_threshold_ratio"]
    assert not [k for k in got if k[0] == "runbook_last_run_info"]


def test_bound_on_finding_series(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "MAX_FINDING_SERIES", 3)
    got = samples(collect(write_run(tmp_path)))
    assert len([k for k in got if k[0] == "runbook_finding"]) == 3
    assert sum(v for k, v in got.items() if k[0] == "runbook_findings") == sum(len(f) for f, _ in RESULTS.values())


def test_unreadable_results_leave_the_run_metrics(tmp_path):
    d = write_run(tmp_path)
    (d / "35_verify.results.json").write_text("{not json")
    (d / "40_benchmark.results.json").write_text(json.dumps({"findings": [{"id": "bench.x", "status": "bogus"}], "data": []}))
    got = samples(collect(d))
    assert one(got, "runbook_last_run_exit_code") == 1
    assert one(got, "runbook_findings", stage="verify", status="fail") == 0
    assert one(got, "runbook_findings", stage="benchmark", status="fail") == 0


def test_a_deployment_name_that_is_no_label_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot be a label"):
        metrics.collect({"deployment": "a b"}, tmp_path)
    with pytest.raises(ValueError, match="cannot be a label"):
        metrics.collect_stage(f"d-{SECRET}", "verify", [], {}, 0.0, scrub=[SECRET])


def test_a_stage_verbs_report_is_its_own_source(tmp_path):
    """`runbook bench --textfile-dir`: findings, checks and the stage's figures (the registry's), source="verb",
    and none of the run's gauges (the "not run" alert is the runs' own)."""
    found, data = RESULTS["40_benchmark"]
    m = metrics.collect_stage("d1", "benchmark", [Finding.from_dict(f) for f in found], data, 1767578400.0, threshold_pct=20)
    got = samples(textfile.render(m.registry))
    assert one(got, "runbook_findings", "verb", stage="benchmark", status="warn") == 1
    assert one(got, "runbook_check_failed", "verb", check="bench_regression") == 1
    assert one(got, "runbook_bench_output_tokens_per_second", "verb", level="c8") == 300
    assert one(got, "runbook_bench_regression_threshold_ratio", "verb") == 0.2
    assert one(got, "runbook_stage_timestamp_seconds", "verb", stage="benchmark") == 1767578400
    assert not [k for k in got if k[0].startswith("runbook_last_run") or ("source", "run") in k[1]]


def test_promtool_accepts_the_textfile(tmp_path):
    text = collect(write_run(tmp_path), previous={"metrics": {"output_tok_s": {"c8": 400.0}}}, link_base="https://rb.example.com")
    res = promtool("check", "metrics", stdin=text)
    assert res.returncode == 0, res.stdout + res.stderr
    bad = promtool("check", "metrics", stdin=text.replace("runbook_finding{", "runbook_finding{{", 1))   # the check can fail
    assert bad.returncode != 0


def test_verify_s_replicas_become_replica_gauges(tmp_path):
    """A topology's replicas (verify's `replicas[]`): answering, registered and healthy in the gateway; a value not
    known (the gateway unread: null) is no series, a hostile name no label."""
    found, data = RESULTS["35_verify"]
    rows = [{"name": "r0", "up": True, "registered": True, "healthy": True},
            {"name": "r1", "up": False, "registered": True, "healthy": True},
            {"name": "r2", "up": True, "registered": None, "healthy": None},
            {"name": 'x"} 1\nevil{', "up": False}, "not a row", {"name": SECRET, "up": False}]
    run = write_run(tmp_path, results={**RESULTS, "35_verify": (found, {**data, "replicas": rows})})
    text = collect(run, scrub=[SECRET])
    got = samples(text)
    assert one(got, "runbook_replica_up", replica="r0") == 1 and one(got, "runbook_replica_up", replica="r1") == 0
    assert one(got, "runbook_replica_healthy", replica="r1") == 1 and one(got, "runbook_replica_registered", replica="r0") == 1
    assert ("runbook_replica_registered", frozenset({"deployment": "d1", "source": "run", "replica": "r2"}.items())) not in got
    assert {dict(k[1])["replica"] for k in got if k[0] == "runbook_replica_up"} == {"r0", "r1", "r2"}
    assert SECRET not in text and "evil" not in text
    assert promtool("check", "metrics", stdin=text).returncode == 0
