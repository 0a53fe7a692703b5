"""runbook verify with a topology: each replica, and the gateway's own view of them (/workers), against the spec.

Fast: a real HTTP server answers /workers in smg 1.13.0's shape (tests/topology/test_verify_fleet.py runs the real
gateway); hostile answers give one-line findings; the policy is read from smg's own start line and the unit."""
from __future__ import annotations

import json
import socket

import pytest
from conftest import DEFAULT_SPEC, spec_data
from httpfake import serve
from tcpserver import tcp_server

from runbook import verify
from runbook.core import spec
from runbook.core.registry import document
from runbook.verify import fleet, gateway

# smg 1.13.0's start line, as its log wrote it in front of two CPU replicas (runbook.demo.topology)
SMG_START = ("2026-12-05 18:12:33  INFO smg::server: model_gateway/src/server.rs:1555: Starting router on 127.0.0.1:33705 | "
             "mode: Regular { worker_urls: [\"http://127.0.0.1:52869\", \"http://127.0.0.1:57539\"] } | policy: CacheAware "
             "{ cache_threshold: 0.3, balance_abs_threshold: 64, balance_rel_threshold: 1.5, eviction_interval_secs: 60 } "
             "| max_payload: 512MB")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEAD = [_dead_port() for _ in range(3)]      # nothing listens there: a replica at 127.0.0.N refuses at once


def topo(gateway_url: str, names=("r0", "r1"), policy="cache_aware"):
    """The default spec with replicas on ports nothing listens on and a gateway at `gateway_url`."""
    host, port = gateway_url.rsplit("/", 1)[-1].rsplit(":", 1)
    data = spec_data()
    data["topology"] = {"replicas": [{"name": n, "host": f"127.0.0.{i + 1}", "port": DEAD[i]} for i, n in enumerate(names)],
                        "gateway": {"python": "/usr/bin/python3", "host": host, "port": int(port), "policy": policy}}
    return spec.from_dict(data, str(DEFAULT_SPEC))


def smg_worker(url: str, model: str, healthy: bool = True) -> dict:
    """One item of smg 1.13.0's GET /workers (the keys verify reads, and some it does not)."""
    return {"id": "01a2", "model_id": "m", "url": url, "worker_type": "regular", "runtime_type": "sglang",
            "labels": {"served_model_name": "m", "model_path": model, "version": "0.5.23", "tp_size": "8"},
            "is_healthy": healthy, "status": "ready" if healthy else "unhealthy", "load": 0}


def run(d, workers_doc=None, tmp_path=None, status=200):
    """Verify the topology against a real HTTP server answering /workers with `workers_doc`."""
    routes = {"/workers": (status, workers_doc)}
    with serve(routes) as (url, _):
        d = d(url)
        return verify.evaluate(d, verify.VerifyOptions(log_dir=str(tmp_path), url=url))


def by_id(rep, prefix="verify.gateway"):
    return {f.id: f for f in rep.findings if f.id.startswith(prefix)}


def test_every_replica_registered_and_healthy_passes(tmp_path):
    d0 = topo("http://127.0.0.1:1")
    doc = {"workers": [smg_worker(r.url, d0.model.path) for r in d0.topology.replicas], "total": 2}
    rep = run(topo, doc, tmp_path)
    g = by_id(rep)
    assert g["verify.gateway.workers"].status == "pass", g
    assert g["verify.gateway.replica.r0"].status == g["verify.gateway.replica.r1"].status == "pass"
    assert "SGLang 0.5.23" in g["verify.gateway.replica.r0"].title and "verify.gateway.extra" not in g
    # each replica verified as the one server is: its own /server_info (nothing there: a skip titled with its name)
    srv = [f for f in rep.findings if f.id == "verify.server"]
    assert sorted(f.title.split(":")[0] for f in srv) == ["r0", "r1"] and {f.status for f in srv} == {"skip"}
    # ...which the topology makes a failure: the spec says it runs
    down = by_id(rep, "verify.replica.")
    assert {k: f.status for k, f in down.items()} == {"verify.replica.r0": "fail", "verify.replica.r1": "fail"}
    assert down["verify.replica.r0"].title == f"r0: does not answer at http://127.0.0.1:{DEAD[0]}"
    doc = document(rep)
    assert [r["name"] for r in doc["replicas"]] == ["r0", "r1"]
    assert doc["replicas"][0]["registered"] is True and doc["replicas"][0]["healthy"] is True
    assert doc["replicas"][0]["up"] is False
    assert doc["gateway"]["workers"][0]["replica"] == "r0" and doc["gateway"]["error"] is None
    assert "r0" in verify.text_table(rep) and "registered" in verify.text_table(rep)


def test_missing_unhealthy_other_model_and_extra_workers_are_named(tmp_path):
    d0 = topo("http://127.0.0.1:1", names=("r0", "r1", "r2"))
    r0, r1, r2 = d0.topology.replicas
    doc = {"workers": [smg_worker(r0.url, d0.model.path, healthy=False),
                       smg_worker(r1.url.upper().replace("HTTP", "http") + "/", "/models/another-model"),
                       smg_worker("http://10.9.9.9:30000", d0.model.path)]}
    rep = run(lambda u: topo(u, names=("r0", "r1", "r2")), doc, tmp_path)
    g = by_id(rep)
    assert g["verify.gateway.workers"].status == "fail" and g["verify.gateway.workers"].title.startswith("0 of 3")
    assert g["verify.gateway.replica.r0"].status == "fail" and "unhealthy" in g["verify.gateway.replica.r0"].title
    assert g["verify.gateway.replica.r1"].status == "fail" and "another-model" in g["verify.gateway.replica.r1"].title
    assert g["verify.gateway.replica.r2"].status == "fail" and "not registered" in g["verify.gateway.replica.r2"].title
    assert g["verify.gateway.extra"].status == "warn" and "10.9.9.9" in g["verify.gateway.extra"].detail
    rows = {r["name"]: r for r in document(rep)["replicas"]}
    assert (rows["r0"]["registered"], rows["r0"]["healthy"]) == (True, False)
    assert (rows["r2"]["registered"], rows["r2"]["healthy"]) == (False, False)


def _raw(body: bytes, status: str = "200 OK"):
    def serve_raw(conn):
        conn.recv(65536)
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
    return serve_raw


HOSTILE = {
    "not JSON": (b"<html>Traceback (most recent call last)\n  oops</html>", "not JSON"),
    "a list": (b"[1, 2]", "a JSON list"),
    "workers missing": (b'{"total": 2}', "`workers` is missing"),
    "workers a string": (b'{"workers": "r0,r1"}', "`workers` is a str"),
    "a worker a number": (b'{"workers": [7]}', "workers[0] is a int"),
    "url not a string": (b'{"workers": [{"url": 5, "is_healthy": true}]}', "workers[0].url"),
    "health a string": (b'{"workers": [{"url": "http://a:1", "is_healthy": "yes"}]}', "workers[0].is_healthy is str"),
    "health missing": (b'{"workers": [{"url": "http://a:1"}]}', "workers[0].is_healthy is missing"),
    "huge": (b'{"workers": [' + b'{"url": "http://a:1", "is_healthy": true},' * 120_000 + b'{}]}', "larger than 4 MiB"),
    "too many workers": (b'{"workers": [' + b",".join([b'{"url": "http://a:1", "is_healthy": true}'] * 5000) + b"]}",
                         "5,000 workers"),
    "invalid utf-8": (b'\xff\xfe{"workers": []}', "not JSON"),
    "hostile port": (b'{"workers": [{"url": "http://a:99999999", "is_healthy": true}]}', None),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_workers_answers_give_one_line_findings(tmp_path, case):
    body, words = HOSTILE[case]
    with tcp_server(_raw(body)) as url:
        d = topo(url)
        rep = verify.evaluate(d, verify.VerifyOptions(log_dir=str(tmp_path)))
    g = by_id(rep)
    f = g["verify.gateway.workers"]
    assert f.status == "fail" and "\n" not in f.title and len(f.title) < 300, f
    if words:
        assert words in f.title and "could not be read" in f.title
        assert document(rep)["gateway"]["workers"] is None and document(rep)["replicas"][0]["registered"] is None
    else:   # a worker at a URL no replica has: both replicas unregistered, the stranger an extra worker
        assert g["verify.gateway.extra"].status == "warn" and g["verify.gateway.replica.r0"].status == "fail"


@pytest.mark.parametrize("status, words", [("500 Internal Server Error", "HTTP 500"), ("401 Unauthorized", "API key"),
                                           ("404 Not Found", "no /workers")])
def test_http_errors_name_the_status(tmp_path, status, words):
    with tcp_server(_raw(b"{}", status)) as url:
        rep = verify.evaluate(topo(url), verify.VerifyOptions(log_dir=str(tmp_path)))
    f = by_id(rep)["verify.gateway.workers"]
    assert f.status == "fail" and words in f.title


def test_no_gateway_there_is_a_failed_finding_with_the_remedy(tmp_path):
    d = topo(f"http://127.0.0.1:{_dead_port()}")
    rep = verify.evaluate(d, verify.VerifyOptions(log_dir=str(tmp_path)))
    f = by_id(rep)["verify.gateway.workers"]
    assert f.status == "fail" and "no answer" in f.title
    assert f"systemctl start {d.systemd.unit_name}-gateway" in f.remedy


def test_api_key_is_sent_from_its_variable_and_never_shown(tmp_path, monkeypatch):
    key = "sk-gateway-SECRET-4242"
    monkeypatch.setenv("GW_KEY", key)
    with serve({"/workers": (200, {"workers": []})}, require_bearer=key) as (url, seen):
        d = topo(url)
        data = d.model_dump()
        data["topology"]["gateway"]["api_key_env"] = "GW_KEY"
        d = spec.from_dict({k: v for k, v in data.items() if k != "source"}, str(DEFAULT_SPEC))
        rep = verify.evaluate(d, verify.VerifyOptions(log_dir=str(tmp_path)))
    assert ("/workers", f"Bearer {key}") in seen
    assert by_id(rep)["verify.gateway.workers"].title.startswith("0 of 2")
    assert key not in json.dumps(document(rep))


def test_policy_from_the_gateway_log_and_from_its_installed_unit(tmp_path):
    (tmp_path / fleet.GATEWAY_LOG).write_text("banner\n" + SMG_START + "\n")
    rep = run(topo, {"workers": []}, tmp_path)
    p = by_id(rep)["verify.gateway.policy"]
    assert p.status == "pass" and "cache_aware" in p.title and "gateway.log" in p.title
    rep = run(lambda u: topo(u, policy="round_robin"), {"workers": []}, tmp_path)
    p = by_id(rep)["verify.gateway.policy"]
    assert p.status == "fail" and "the spec says round_robin" in p.title
    # the last start counts: a restart with another policy
    (tmp_path / fleet.GATEWAY_LOG).write_text(SMG_START + "\n" + SMG_START.replace("CacheAware {", "RoundRobin {") + "\n")
    assert by_id(run(lambda u: topo(u, policy="round_robin"), {"workers": []}, tmp_path))["verify.gateway.policy"].status == "pass"
    assert gateway.policy_from_log(["policy: PowerOfTwo { }", "x"]) == "power_of_two"
    assert gateway.policy_from_log(["policy: ConsistentHashing"]) == "consistent_hashing"


def test_policy_from_the_rendered_unit_as_installed(tmp_path):
    from runbook.service import gateway as gw_unit

    d = topo("http://127.0.0.1:1", policy="prefix_hash")
    path = tmp_path / "runbook-qwen.service"
    path.write_text(gw_unit.render_unit(d).text)
    assert gateway.policy_from_unit(path) == "prefix_hash"
    assert gateway.policy_from_unit(tmp_path / "none.service") is None
    path.write_text("[Service]\nExecStart=/x \"unbalanced --policy a\n")
    assert gateway.policy_from_unit(path) is None
    f = gateway.check_policy(topo("http://127.0.0.1:1"), None, "no policy line")
    assert f.status == "skip" and "--log-dir" in f.remedy


def test_same_url():
    assert gateway.same_url("http://127.0.0.1:30000/", "HTTP://127.0.0.1:30000")
    assert gateway.same_url("http://[::1]:80", "http://[::1]")
    assert not gateway.same_url("http://127.0.0.1:30000", "http://127.0.0.1:30001")
    assert not gateway.same_url("http://a:99999999", "http://a:1")


def test_one_log_per_replica_from_the_log_dir(tmp_path):
    (tmp_path / "replica-r0.log").write_text("not an SGLang log\n")
    rep = run(topo, {"workers": []}, tmp_path)
    logs = {f.title.split(":")[0]: f for f in rep.findings if f.id == "verify.log"}
    assert str(tmp_path / "replica-r0.log") in document(rep)["replicas"][0]["log"]["source"]
    assert "replica-r1.log is not there" in logs["r1"].title


def test_log_options_that_do_not_fit_the_topology(tmp_path, cli):
    d = topo("http://127.0.0.1:1")
    p = tmp_path / "d.yaml"
    import yaml

    data = d.model_dump(exclude={"source"})
    data["model"]["card"] = str((DEFAULT_SPEC.parent / data["model"]["card"]).resolve())
    p.write_text(yaml.safe_dump(data))
    cp = cli("verify", "--deployment", p, "--log", tmp_path / "x.log")
    assert cp.returncode == 2 and "--log-dir" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
    cp = cli("verify", "--deployment", DEFAULT_SPEC, "--log-dir", tmp_path)
    assert cp.returncode == 2 and "no topology.replicas" in cp.stderr
    assert cli("verify", "--log-dir", tmp_path, "--unit", "x").returncode == 2
    cp = cli("verify", "--deployment", p, "--log-dir", tmp_path, "--json")
    assert cp.returncode == 1 and json.loads(cp.stdout)["gateway"]["error"]
