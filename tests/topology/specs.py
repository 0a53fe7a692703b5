"""Topology specs the tests share: replicas behind a gateway, and one server across two nodes."""
import os

import pytest
from conftest import DEFAULT_SPEC, spec_data

from runbook.core import spec

GATEWAY_PY = os.environ.get("RUNBOOK_GATEWAY_PYTHON")
needs_gateway = pytest.mark.skipif(not (GATEWAY_PY and os.path.exists(GATEWAY_PY)),
                                   reason="the gateway's env is missing: `make gateway-env` (make test builds it)")


def topo(gateway_flags=None, gateway_python=None, **changes):
    """The default spec at TP 4: two replicas sharing gpu-01 (GPUs 0-3, 4-7), one on gpu-02, smg on gw-01."""
    data = spec_data(**{"parallelism.tp": 4, **changes})
    data["topology"] = {
        "replicas": [{"name": "r0", "host": "gpu-01", "port": 30000, "gpus": [0, 1, 2, 3]},
                     {"name": "r1", "host": "gpu-01", "port": 30001, "gpus": [4, 5, 6, 7]},
                     {"name": "r2", "host": "gpu-02", "port": 30000}],
        "gateway": {"python": gateway_python or GATEWAY_PY or "/opt/smg/bin/python", "host": "gw-01", "port": 8000,
                    "prometheus_port": 29000, "api_key_env": "GATEWAY_API_KEY",
                    "flags": gateway_flags if gateway_flags is not None else {"health-check-interval-secs": 30}}}
    return spec.from_dict(data, str(DEFAULT_SPEC))


def nodes_dep():
    return spec.from_dict(spec_data(**{"parallelism.tp": 16, "parallelism.nodes": [
        {"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2"}]}), str(DEFAULT_SPEC))


def loopback(replica_ports, gateway_port, policy="cache_aware"):
    """Two replicas and the gateway on 127.0.0.1 at the given ports (fake servers stand behind them)."""
    data = spec_data(**{"parallelism.tp": 4})
    data["topology"] = {
        "replicas": [{"name": f"r{i}", "host": "127.0.0.1", "port": p, "gpus": [4 * i + j for j in range(4)]}
                     for i, p in enumerate(replica_ports)],
        "gateway": {"python": GATEWAY_PY or "/opt/smg/bin/python", "host": "127.0.0.1", "port": gateway_port, "policy": policy}}
    return spec.from_dict(data, str(DEFAULT_SPEC))
