"""Issue 15 item 2: Mooncake trace replay, open loop at the recorded timestamps."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.rawsse import RawServer, Reply, completion_stream
from runbook import corpus
from runbook.bench import run as bench
from runbook.bench import workloads
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.demo import llama as demo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fast():
    srv = RawServer(lambda b: Reply(completion_stream(int(b.get("max_tokens", 2)), 0.002, 0.001))).start()
    yield srv
    srv.stop()


def write_trace(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parse_lengths_prefixes_and_speed(tmp_path):
    tok = demo.train_tokenizer(vocab_size=2048)
    p = write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [1, 2], "session_id": "a"},
        {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [1, 3]},
        {"timestamp": 3000, "input_length": 100, "output_length": 0},
    ])
    wl = workloads.build(f"trace:{p}", 100, tokenizer=tok, trace_speed=2.0)
    assert wl.schedule == [0.0, 0.25, 1.0]                        # sorted, relative, ÷ speed
    r0, r1, r2 = wl.requests
    assert [len(r.prompt) for r in wl.requests] == [600, 700, 100]  # exact token ids with a tokenizer
    assert r0.prompt[:512] == r1.prompt[:512] and r0.prompt[512:600] != r1.prompt[512:600]   # hash id 1 shared, 2 ≠ 3
    assert (r0.max_tokens, r1.max_tokens, r2.max_tokens) == (3, 5, 1)
    assert r1.meta["session"] == "a" and r1.meta["scheduled_s"] == 0.25
    assert wl.corpus_version.startswith("trace-") and wl.corpus_version.endswith(corpus.VERSION)
    assert len(workloads.build(f"trace:{p}", 2).requests) == 2
    bad = write_trace(tmp_path / "bad.jsonl", [{"timestamp": 1, "input_length": "x", "output_length": 1}])
    with pytest.raises(InputError, match=r"bad.jsonl:1: \"input_length\""):
        workloads.build(f"trace:{bad}", 10)
    with pytest.raises(InputError, match="no such file"):
        workloads.build(f"trace:{tmp_path}/none.jsonl", 10)


def test_shipped_synthetic_trace_is_in_the_manifest():
    assert "trace_synthetic.jsonl" in corpus.manifest()["files"] and corpus.verify() == []
    wl = workloads.build("trace:synthetic", 1 << 30)
    assert len(wl.requests) == len(wl.schedule) >= 50
    assert any("session" in r.meta for r in wl.requests)


@pytest.mark.slow   # real clock: the send schedule measured under whatever else the machine runs
def test_sends_within_5_ms_of_schedule_at_200_per_s(fast, tmp_path):
    n = 200
    p = write_trace(tmp_path / "t.jsonl", [{"timestamp": 5 * i, "input_length": 16, "output_length": 2} for i in range(n)])
    o = BenchSettings(url=fast.url, model="raw", workload=f"trace:{p}", warmup=2, telemetry=False, timeout=30.0)
    res = bench.run(o)
    (lv,) = res.summary["levels"]
    assert lv["label"] == "trace" and lv["completed"] == n and lv["concurrency"] is None
    err = np.array([r.meta["schedule_error_ms"] for r in res.levels[0].records])
    assert len(err) == n and err.min() > -1.0                 # never early
    # the median, not a tail: a stall of the shared 2-core machine (CI saw 200 ms on a tenth of the sends) delays a
    # few sends, and the property is that the open loop does not drift: each quarter of the trace is still on time
    assert np.median(np.abs(err)) < 5.0
    assert all(np.median(q) < 5.0 for q in np.array_split(err, 4))
    assert lv["schedule_error_ms"]["n"] == n and lv["schedule_error_ms"]["p50"] < 5.0
    sched = sorted(r.meta["scheduled_s"] for r in res.levels[0].records)
    assert sched[0] == 0.0 and sched[-1] == pytest.approx(0.995)


def test_trace_speed_and_cli(fast, tmp_path):
    p = write_trace(tmp_path / "t.jsonl", [{"timestamp": 100 * i, "input_length": 8, "output_length": 2} for i in range(10)])
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"))
    proc = subprocess.run([sys.executable, "-m", "runbook", "bench", "--url", fast.url, "--model", "raw", "--workload", f"trace:{p}",
                           "--trace-speed", "4", "--warmup", "0", "--archive", "", "--json"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    doc = json.loads(proc.stdout)
    (lv,) = doc["levels"]
    assert lv["label"] == "trace-x4" and lv["completed"] == 10 and doc["trace_speed"] == 4
    assert 0.2 <= lv["window_s"] < 0.6                       # 0.9 s of trace at ×4, plus the last response
    with pytest.raises(InputError, match=r"rates"):
        bench.run(BenchSettings(url=fast.url, workload=f"trace:{p}", rates=[1.0]))
