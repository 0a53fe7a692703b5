"""RunbookGatewayOneReplica with the real programs: a real Prometheus scrapes the two real SGLang replicas'
/metrics (the session's gateway fleet) and evaluates the shipped rule, its window and `for` shortened; every
request goes to one replica and the alert fires for the deployment. The metric the rule reads is SGLang's own,
under the name this Prometheus stores it (Debian's 2.42 asks for OpenMetrics: sglang_num_requests_total)."""
import json
import subprocess
import urllib.parse
import urllib.request

import pytest
import yaml
from conftest import REPO

from .test_end_to_end import _exe, _get, _port, _until

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
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(_rule()))
    targets = [r.url.removeprefix("http://") for r in spec.topology.replicas]
    conf = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(tmp_path / "rules.yml")],
            "scrape_configs": [{"job_name": "sglang", "static_configs": [{"targets": targets,
                                                                          "labels": {"deployment": spec.name}}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(conf))
    port = _port()
    with open(tmp_path / "prometheus.log", "w") as log:
        prom = subprocess.Popen([_exe("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=log)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        def query(q):
            return _get(f"{api}/query?query={urllib.parse.quote(q)}")["data"]["result"]

        _until("both replicas scraped", lambda: len(query("up == 1")) == 2, 60)
        one = spec.topology.replicas[0]
        for i in range(8):
            _chat(one.url, i)            # what a gateway sending everything to r0 does
        got = _until("SGLang's own request counter in Prometheus",
                     lambda: query('{__name__=~"sglang[:_]num_requests_total"}'), 30)
        assert {s["metric"]["instance"] for s in got} >= {targets[0]}
        # what this Prometheus stored: 2.x asks for OpenMetrics, and SGLang's prometheus_client escapes the colon
        print("stored as", sorted({s["metric"]["__name__"] for s in got}))

        def firing():
            return [a for a in _get(f"{api}/alerts")["data"]["alerts"]
                    if a["labels"]["alertname"] == "RunbookGatewayOneReplica" and a["state"] == "firing"]
        alert = _until("RunbookGatewayOneReplica firing", firing, 60)[0]
        assert alert["labels"]["deployment"] == spec.name and alert["labels"]["severity"] == "ticket"
        assert "of its requests to one replica" in alert["annotations"]["summary"]
    finally:
        prom.terminate()
        prom.wait(timeout=20)
