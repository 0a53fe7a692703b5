"""`service drift` over a topology: every replica against its own unit, the gateway's own worker list against the
spec's replicas. Fake servers here (each answer chosen); the live fleet in test_fleet_drift.py."""
import contextlib
import importlib

import pytest
from httpfake import serve

from runbook import service
from runbook.core.errors import InputError
from runbook.service.topodrift import drift_all

from .specs import loopback

INFO = {"model_path": "nvidia/Qwen3.5-397B-A17B-NVFP4", "kv_cache_dtype": "bf16", "tp_size": 4, "version": "0.5.23"}


@contextlib.contextmanager
def fleet(r1_info=None, workers=None):
    """Two fake replicas and a fake gateway; the gateway lists both replicas unless `workers` says otherwise."""
    with serve({"/server_info": (200, INFO)}) as (u0, _), \
         serve({"/server_info": (200, r1_info or INFO)}) as (u1, _):
        listed = workers(u0, u1) if workers else [u0, u1]
        body = {"workers": [{"url": u, "is_healthy": True} for u in listed], "total": len(listed)}
        with serve({"/workers": (200, body)}) as (ug, seen):
            port = lambda u: int(u.rsplit(":", 1)[1])   # noqa: E731
            yield loopback([port(u0), port(u1)], port(ug)), (u0, u1), seen


def test_every_replica_and_the_gateway_match_the_spec():
    with fleet() as (d, urls, seen):
        rows, f, info = drift_all(d)
    assert rows == [] and [(x.id, x.status) for x in f] == [("service.drift", "pass"), ("service.drift", "pass"),
                                                            ("service.drift.gateway", "pass")]
    assert [x.title.split(":")[0] for x in f[:2]] == ["r0", "r1"]
    assert set(info["replicas"]) == {"r0", "r1"} and [w["url"] for w in info["gateway"]["workers"]] == list(urls)
    assert [p for p, _ in seen] == ["/workers"]


def test_a_replica_running_other_flags_is_named_with_its_flag():
    with fleet(r1_info=dict(INFO, kv_cache_dtype="fp8_e4m3")) as (d, _, _):
        rows, f, _ = drift_all(d)
    assert rows == [{"replica": "r1", "flag": "kv-cache-dtype", "spec": "bf16", "server": "fp8_e4m3"}]
    bad = [x for x in f if x.status == "fail"]
    assert [(x.id, x.title) for x in bad] == [
        ("service.drift.kv-cache-dtype", "r1: server runs --kv-cache-dtype fp8_e4m3, the spec says bf16")]


def test_the_gateway_missing_a_replica_or_routing_elsewhere_is_named():
    with fleet(workers=lambda u0, u1: [u0, "http://10.9.9.9:30000"]) as (d, (u0, u1), _):
        _, f, _ = drift_all(d)
    by = {x.id: x for x in f}
    assert by["service.drift.gateway.missing"].status == "fail" and by["service.drift.gateway.missing"].title.startswith(f"r1: {u1}")
    assert by["service.drift.gateway.extra"].status == "fail" and "http://10.9.9.9:30000" in by["service.drift.gateway.extra"].title
    assert "service.drift.gateway" not in by


def test_no_gateway_and_no_replicas_are_skips_not_passes():
    d = loopback([9, 9 + 1], 9 + 2)   # the discard port: nothing answers
    _, f, _ = drift_all(d)
    assert [(x.id, x.status) for x in f] == [("service.drift", "skip"), ("service.drift", "skip"), ("service.drift.gateway", "skip")]


def test_url_with_replicas_is_refused_in_one_line():
    with pytest.raises(InputError, match=r"^server_url: this deployment declares topology.replicas"):
        drift_all(loopback([9, 10], 11), "http://127.0.0.1:9")


def test_the_report_carries_every_replica_and_the_gateway(tmp_path, monkeypatch):
    check = importlib.import_module("runbook.service.check")   # the package binds `check` to the function
    monkeypatch.setattr(check, "serving_python", lambda spec: (None, []))   # SGLang's parser is not this test's subject
    with fleet() as (d, _, _):
        rep = service.assess(d, installed=tmp_path / "none.service")
    data = rep.data()
    assert [u["role"] for u in data["units"]] == ["server", "server", "gateway"]
    ids = {f.id for f in rep.findings}
    assert ids >= {"service.gateway.parser", "service.drift.gateway"}
    assert any(i.startswith("service.systemd") for i in ids)    # systemd-analyze read each unit (binaries may be absent here)
    assert set(data["server"]["replicas"]) == {"r0", "r1"} and len(data["server"]["gateway"]["workers"]) == 2
