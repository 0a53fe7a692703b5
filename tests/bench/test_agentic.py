"""Issue 15 item 1: multi-turn agentic sessions against a scripted server that remembers prefixes,
so TTFT grows with the *uncached* part of the input and cache hits are visible per turn."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.rawsse import RawServer, Reply, sse
from runbook.bench import report
from runbook.bench import run as bench
from runbook.bench.sessions import SYSTEM_PROMPT
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError

BASE_S = 0.010          # scripted TTFT: BASE_S + PER_TOKEN_S × uncached prompt tokens
PER_TOKEN_S = 0.0002
GAP_S = 0.002
REPO = Path(__file__).resolve().parents[2]


class PrefixServer:
    """Prompt tokens = characters / 4; a prefix seen in an earlier request is cached (64-character pages)."""

    def __init__(self, report_cache: bool = True):
        self.seen: list[str] = []
        self.report_cache = report_cache
        self.lock = threading.Lock()

    def __call__(self, body: dict) -> Reply:
        msgs = body.get("messages") or []
        text = "".join(f"<{m['role']}>{m['content']}" for m in msgs)
        with self.lock:
            best = max((len(os.path.commonprefix([text, p])) for p in self.seen), default=0)
            self.seen.append(text)
        cached_chars = best // 64 * 64
        n_in, cached = len(text) // 4, cached_chars // 4
        ttft = BASE_S + PER_TOKEN_S * (n_in - cached)
        n_out = int(body.get("max_tokens", 8))
        usage_base = {"prompt_tokens": n_in}
        if self.report_cache:
            usage_base["prompt_tokens_details"] = {"cached_tokens": cached}
        writes = []
        for k in range(n_out):
            msg = {"choices": [{"index": 0, "delta": {"content": f" w{k}"}, "finish_reason": "length" if k == n_out - 1 else None}],
                   "usage": dict(usage_base, completion_tokens=k + 1)}
            writes.append((ttft + k * GAP_S, sse(msg)))
        writes.append((ttft + n_out * GAP_S, b"data: [DONE]\n\n"))
        return Reply(writes)


@pytest.fixture
def server():
    started = []

    def make(report_cache=True):
        h = PrefixServer(report_cache)
        srv = RawServer(h).start()
        started.append(srv)
        return srv, h
    yield make
    for s in started:
        s.stop()


def opts(url, **kw):
    base = dict(url=url, model="raw", concurrency=[3], workload="agentic", input_len=300, output_len=8, turns=4,
                tool_result_len=60, warmup=1, telemetry=False, timeout=30.0)
    base.update(kw)
    return BenchSettings(**base)


def test_sessions_grow_turn_by_turn_and_cache_hits_show_in_ttft(server):
    srv, h = server()
    res = bench.run(opts(srv.url, think_time=0.05))
    (lv,) = res.summary["levels"]
    assert lv["completed"] == 12 and lv["failed"] == 0
    turns = lv["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4] and all(t["requests"] == 3 for t in turns)
    # the whole conversation is re-sent: input grows every turn
    means = [t["input_tokens"]["mean"] for t in turns]
    assert means == sorted(means) and means[-1] > means[0] + 150
    # turn 1 shares only the system prompt across sessions; later turns are mostly cached
    assert turns[0]["cache_hit_rate"] < 0.3
    assert all(t["cache_hit_rate"] > 0.7 for t in turns[1:])
    # TTFT follows the uncached input, not the whole input: later turns are longer but faster
    assert all(t["ttft_ms"]["p50"] < turns[0]["ttft_ms"]["p50"] * 0.7 for t in turns[1:])
    # scripted TTFT = base + per-token × uncached tokens (the client adds only its send overhead)
    for r in res.levels[0].records:
        want = (BASE_S + PER_TOKEN_S * (r.input_tokens - r.cached_tokens)) * 1000
        assert want - 1.0 <= (r.chunk_times[0] - r.send_time) * 1000 <= want + 40.0
    # each turn's request: system + user, then + assistant (the previous answer verbatim) + tool result/question
    bodies = [b for b in srv.bodies if b.get("messages") and b["messages"][0]["role"] == "system"]
    by_len = sorted({len(b["messages"]) for b in bodies})
    assert by_len == [2, 4, 6, 8]
    last = max(bodies, key=lambda b: len(b["messages"]))["messages"]
    assert last[0]["content"].startswith(SYSTEM_PROMPT) and "# Repository context" in last[0]["content"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert last[2]["content"] == " w0 w1 w2 w3 w4 w5 w6 w7" and last[3]["content"].startswith("Tool result (")
    # think time: a session's next turn is sent at least think_time after its previous answer
    recs = sorted(res.levels[0].records, key=lambda r: (r.meta["session"], r.meta["turn"]))
    for a, b in zip(recs, recs[1:], strict=False):
        if a.meta["session"] == b.meta["session"]:
            assert b.send_time - a.chunk_times[-1] >= 0.05 - 0.002
    json.dumps(res.summary, allow_nan=False)
    fig = report.plot_turns(res.summary)
    assert fig.axes[0].lines and len(report.turns_frame(res.summary)) == 4


def test_no_cache_report_means_no_hit_rate_and_exponential_think(server):
    srv, _ = server(report_cache=False)
    res = bench.run(opts(srv.url, concurrency=[2], turns=2, think_time=0.01, think_dist="exp", requests=6))
    (lv,) = res.summary["levels"]
    assert lv["completed"] == 6          # --requests 6 with 2 turns: 3 sessions on 2 workers
    assert all(t["cache_hit_rate"] is None for t in lv["turns"])


def _think_gaps(res):
    """Per session: next turn's send − the previous turn's end (the think time as the server saw it)."""
    by: dict[int, list] = {}
    for r in res.levels[0].records:
        by.setdefault(r.meta["session"], []).append(r)
    gaps = []
    for rs in by.values():
        rs.sort(key=lambda r: r.meta["turn"])
        gaps += [rs[k + 1].send_time - rs[k].end_time for k in range(len(rs) - 1)]
    return gaps


def test_think_time_fixed_and_exponential(server):
    import numpy as np

    from runbook.bench.sessions import SessionPlan

    srv, _ = server()
    fixed = _think_gaps(bench.run(opts(srv.url, concurrency=[2], turns=4, think_time=0.04, requests=8)))
    assert len(fixed) == 6 and all(0.04 <= g < 0.04 + 0.1 for g in fixed)         # never shorter than asked
    exp = _think_gaps(bench.run(opts(srv.url, concurrency=[2], turns=4, think_time=0.04, think_dist="exp", requests=8)))
    assert len(exp) == 6 and max(exp) - min(exp) > 0.01            # not the fixed pause
    plan = SessionPlan(1, BenchSettings(turns=2, input_len=100, output_len=4, tool_result_len=10, think_time=0.04, think_dist="exp"))
    rng = np.random.default_rng(5)
    draws = np.array([plan.think(rng) for _ in range(4000)])
    assert abs(draws.mean() - 0.04) < 0.004 and abs(draws.std() / draws.mean() - 1) < 0.1   # exponential: CV 1


def test_agentic_refuses_what_it_cannot_measure():
    with pytest.raises(InputError, match=r"\brates\b"):
        bench.run(opts("http://127.0.0.1:9", rates=[2.0]))
    with pytest.raises(InputError, match="think_dist must be 'fixed' or 'exp'"):
        BenchSettings.resolve(None, think_dist="pareto")
    with pytest.raises(InputError, match=r"\bcompare_url\b"):
        bench.run(opts("http://127.0.0.1:9", compare_url="http://127.0.0.1:8"))


@pytest.mark.slow  # a CLI benchmark run with real-clock turns
def test_cli_json_has_levels_turns(server, tmp_path):
    srv, _ = server()
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"))
    p = subprocess.run([sys.executable, "-m", "runbook", "bench", "--url", srv.url, "--model", "raw", "--workload", "agentic",
                        "--concurrency", "2", "--turns", "3", "--input-len", "200", "--output-len", "4",
                        "--tool-result-len", "40", "--think-time", "0", "--think-dist", "fixed", "--warmup", "0",
                        "--archive", "", "--json"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    doc = json.loads(p.stdout)
    (lv,) = doc["levels"]
    t = lv["turns"]
    assert [x["turn"] for x in t] == [1, 2, 3]
    assert all(x["ttft_ms"]["p50"] is not None and x["input_tokens"]["mean"] > 0 and "cache_hit_rate" in x for x in t)
    assert doc["workload"] == "agentic" and doc["turns"] == 3
