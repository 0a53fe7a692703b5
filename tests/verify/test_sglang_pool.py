"""The plan against the pool of the real SGLang server on CPU, started without --max-total-tokens.

On CPU SGLang sizes its pool from the host's free memory (/proc/meminfo's MemAvailable), which it reads several
times during start-up while its own processes start and other work on the host takes and frees memory. Where the
inputs are known — the free memory pinned for the server (demo.sglang.pinned_meminfo) — `kv` predicts and `verify`
re-plans the live pool to the token, at two memory fractions. Unpinned, `verify` confirms the pool within what the
log's readings allow (replan.cpu_bounds). Both read the pool and SGLang's memory account from /server_info."""
from pathlib import Path

import psutil
import pytest

from runbook import kv, verify
from runbook.core import oscalls
from runbook.core.units import GIB
from runbook.demo import sglang
from runbook.verify import replan

pytestmark = [pytest.mark.sglang]

PINNED_GIB = 20.0   # what /proc/meminfo tells the server is available: a whole number of KiB, two decimals in its log


def _verify(srv):
    live = srv.server_info()["max_total_num_tokens"]
    rep = verify.assess(srv.spec, log=srv.log, url=srv.url)
    found = {f.id: f for f in rep.findings}
    for fid in ("verify.tokens", "verify.server.tokens"):
        assert found[fid].status == "pass", (found[fid].title, found[fid].detail)
    assert rep.observed["max_total_num_tokens"] == live and rep.server["max_total_num_tokens"] == live
    mem = rep.server["memory_usage"]
    assert mem["token_capacity"] == live and found["verify.server.memory"].status == "info"
    assert mem["kvcache"] == pytest.approx(live * 2048 / GIB, abs=0.0015)      # GiB with 3 decimals
    return live, rep


@pytest.mark.parametrize("fraction", [0.02, 0.05])
def test_plan_equals_the_live_pool_to_the_token_where_the_free_memory_is_known(tmp_path, fraction):
    srv = sglang.start(flags={"mem-fraction-static": fraction}, log_path=tmp_path / "server.log", host_free_gib=PINNED_GIB)
    try:
        pids = srv.pids()       # the server, its scheduler and detokenizer, multiprocessing's resource tracker
        assert srv.pid in pids and len(pids) >= 3, [psutil.Process(p).name() for p in pids]
        assert srv.server_info()["mem_fraction_static"] == fraction          # its own flag reached it
        live, rep = _verify(srv)
    finally:
        srv.stop()
    # Stopping a server leaves none of its processes and keeps its log: checked on this start rather than on one of
    # its own (tests/test_sglang_engine.py started a third server for it, ~40 s).
    assert not [p for p in pids if oscalls.pid_running(p)]
    assert srv.proc.returncode is not None and oscalls.group_pids(srv.pid) == []
    assert "The server is fired up" in (tmp_path / "server.log").read_text()
    # kv before the start, given what the host has free and that loading takes none of it (SGLang measures the
    # weights as the drop in free memory, and the pinned figure does not drop)
    plan = kv.assess(srv.spec, gpu_mem_gib=PINNED_GIB, weights_gib=0)
    assert plan.result.max_total_num_tokens == live == int(PINNED_GIB * fraction * GIB) // 2048
    rp = rep.replanned       # verify, from the log's own readings
    assert (rp["free_before_weights_gib"], rp["weights_gib"], rp["verdict"]) == (PINNED_GIB, 0.0, "agrees")
    assert rp["max_total_num_tokens"] == live and rp["gpu_memory_gib"] is None
    rows = {r["quantity"]: r for r in rep.rows()}
    assert rows["max_total_num_tokens"]["replanned"] == rows["max_total_num_tokens"]["server"] == live


def test_an_unpinned_pool_is_confirmed_within_what_the_logs_readings_allow(sglang_server):
    live, rep = _verify(sglang_server)
    rp = rep.replanned
    lo, hi = replan.cpu_bounds(rp)
    assert rp["cpu"] and lo <= live <= hi and rp["verdict"] == "agrees", (live, rp)
    # verify's plan is kv's from the free memory the log read at start-up (not the host's now, which the running
    # server's own pool has shrunk)
    plan = kv.assess(sglang_server.spec, gpu_mem_gib=rp["free_before_weights_gib"])
    assert plan.result.max_total_num_tokens == rep.predicted["max_total_num_tokens"]


def test_kv_plans_a_cpu_server_from_this_hosts_free_memory(monkeypatch):
    """Without a given memory, `kv` reads the host's free memory now (SGLang's get_free_cpu_memory), not
    hardware.gpu_memory_gib (1 GiB in the demo spec)."""
    from runbook.kv import plan as kvplan

    dep = sglang.deployment()
    sglang.tiny_model(Path(dep.model.path))
    monkeypatch.setattr(kvplan, "host_free_gib", lambda: 10.0)
    p = kv.assess(dep)
    assert p.inputs.gpu_mem_gib == 10.0 and "10.00 GiB now" in next(f.title for f in p.findings if f.id == "kv.cpu_memory")
    frac = dep.serving.flags["mem-fraction-static"]
    assert p.result.max_total_num_tokens == int(int((10.0 * frac - p.inputs.weights_bytes_per_gpu / GIB) * GIB) // 2048)
    assert dep.hardware.gpu_memory_gib == 1
