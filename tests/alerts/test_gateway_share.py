"""RunbookGatewayOneReplica with the real programs: a real Prometheus scrapes the two real SGLang replicas'
/metrics (the session's gateway fleet) and evaluates the shipped rule, its window and `for` shortened; every
request goes to one replica and the alert fires for the deployment. The metric the rule reads is SGLang's own,
under the name this Prometheus stores it (Debian's 2.42 asks for OpenMetrics: sglang_num_requests_total)."""
import json
import urllib.request

import pytest
import yaml
from conftest import REPO

from runbook.demo import prometheus

from .test_end_to_end import _until

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]


def _rule() -> dict:
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "runbook.rules.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == "RunbookGatewayOneReplica")
    assert "[15m]" in rule["expr"]
    rule["expr"] = rule["expr"].replace("[15m]", "[30s]")      # the same rule over seconds, not a quarter hour
    rule["for"] = "1s"
    return {"groups": [{"name": "share", "rules": [rule]}]}


def _chat(url: str, i: int) -> None:
    body = json.dumps({"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": f"share {i}"}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200


def test_one_replica_taking_every_request_fires(gateway_fleet, tmp_path):
    spec = gateway_fleet.spec
    targets = [r.url.removeprefix("http://") for r in spec.topology.replicas]
    job = {"job_name": "sglang", "static_configs": [{"targets": targets, "labels": {"deployment": spec.name}}]}
    try:
        stack = prometheus.Stack(tmp_path, rules=_rule(), jobs=[job])
    except prometheus.Missing as e:
        pytest.skip(str(e))
    try:
        query = stack.query
        _until("both replicas scraped", lambda: len(query('up{job="sglang"} == 1')) == 2, 60)
        one = spec.topology.replicas[0]
        for i in range(8):
            _chat(one.url, i)            # what a gateway sending everything to r0 does
        got = _until("SGLang's own request counter in Prometheus",
                     lambda: query('{__name__=~"sglang[:_]num_requests_total"}'), 30)
        assert {s["metric"]["instance"] for s in got} >= {targets[0]}
        # what this Prometheus stored: 2.x asks for OpenMetrics, and SGLang's prometheus_client escapes the colon
        print("stored as", sorted({s["metric"]["__name__"] for s in got}))

        alert = _until("RunbookGatewayOneReplica firing", lambda: stack.alerts("RunbookGatewayOneReplica"), 60)[0]
        assert alert["labels"]["deployment"] == spec.name and alert["labels"]["severity"] == "ticket"
        assert "of its requests to one replica" in alert["annotations"]["summary"]
    finally:
        stack.stop()
