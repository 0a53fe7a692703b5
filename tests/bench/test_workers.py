"""Issue 15 item 5: several load-generator processes for one level, one clock, records merged."""
import json
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from bench.rawsse import Reply, completion_stream
from runbook.bench import run as bench
from runbook.bench import workers, workloads
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.endpoint.client import TRANSPORTS


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_workers_merge_into_one_level_on_one_clock(raw, tmp_path, transport):
    scripted = raw(lambda b: Reply(completion_stream(int(b.get("max_tokens", 2)), 0.050, 0.005)))
    o = BenchSettings(url=scripted.url, model="raw", concurrency=[4], requests=16, output_len=6, workload="random",
                           input_len=16, warmup=1, telemetry=False, timeout=30.0, workers=2, out=tmp_path,
                           transport=transport)
    res = bench.run(o)
    (lv,) = res.summary["levels"]
    assert lv["completed"] == 16 and lv["failed"] == 0
    recs = res.levels[0].records
    assert len({r.meta["worker"] for r in recs}) == 2                     # two processes did the sending
    assert sorted(r.id for r in recs) == list(range(16))                  # every request once
    send = [r.send_time for r in recs]
    assert send == sorted(send)
    # one clock: the two workers' sends interleave in time (they ran side by side, not one after another)
    by = {}
    for r in recs:
        by.setdefault(r.meta["worker"], []).append(r.send_time)
    a, b = by.values()
    assert min(a) < max(b) and min(b) < max(a)
    ttft = np.median([r.chunk_times[0] - r.send_time for r in recs])
    assert 0.045 < ttft < 0.150                                          # the scripted 50 ms, measured from either process
    assert res.summary["client"]["workers"] == 2 and res.summary["client"]["transport"] == transport
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 16
    assert all(json.loads(x)["meta"]["worker"] for x in (tmp_path / "records.jsonl").read_text().splitlines())


def test_shares_and_refusals():
    assert workers.shares(5, 2) == [3, 2] and workers.shares(2, 4) == [1, 1] and sum(workers.shares(256, 3)) == 256
    for kw in ({"rates": [2.0]}, {"duration": 5.0}, {"workload": "agentic"}, {"workload": "trace:synthetic"},
               {"compare_url": "http://127.0.0.1:9"}, {"workers": 0}, {"workers": 65}):
        with pytest.raises(InputError, match="workers"):   # a rule names the flag (--workers); a bound, the setting
            workloads.check(BenchSettings.resolve(None, url="http://127.0.0.1:9", **{"workers": 2, **kw}))


def test_unknown_transport_is_an_input_error():
    with pytest.raises(InputError, match="transport must be one of h1, aiohttp"):
        workloads.check(BenchSettings.resolve(None, url="http://127.0.0.1:9", transport="h2"))


@pytest.mark.slow  # worker processes and a real-clock level
def test_a_worker_killed_mid_level_fails_its_level_and_the_run_goes_on(raw, tmp_path):
    """SIGKILL one worker (as the OOM killer would): no level aborts the run, nothing already written is
    lost, the broken level says why per request, and the next level runs on a fresh pool."""
    seen = {"n": 0}

    def h(b):
        seen["n"] += 1
        first = seen["n"] <= 4                  # the first level's requests hang until the kill
        return Reply(completion_stream(int(b.get("max_tokens", 2)), 0.020, 0.002), hold_s=5.0 if first else 0.0)
    scripted = raw(h)

    def killer():
        deadline = time.time() + 30
        while scripted.in_flight < 2 and time.time() < deadline:
            time.sleep(0.02)
        os.kill(mp.active_children()[0].pid, signal.SIGKILL)
    threading.Thread(target=killer, daemon=True).start()
    o = BenchSettings(url=scripted.url, model="raw", concurrency=[4, 2], requests=8, output_len=4, workload="random",
                           input_len=16, warmup=0, telemetry=False, timeout=30.0, workers=2, out=tmp_path)
    res = bench.run(o)
    first, second = res.summary["levels"]
    assert first["failed"] == 8 and first["errors"] == {"client_error": 8} and first["client_bound"]
    assert all("died before reporting its share" in r.error for r in res.levels[0].records)
    assert second["completed"] == 8 and second["failed"] == 0 and not res.levels[1].workers_lost
    assert len({r.meta["worker"] for r in res.levels[1].records}) == 2
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 16
    assert first["workers_lost"] == 2 and "workers_lost" not in second      # the pool broke: both shares are lost
    (f,) = [f for f in res.findings if f.id == "bench.client_bound.c4"]
    assert f.status == "fail" and "a worker process died" in f.title
