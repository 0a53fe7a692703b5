"""Issue 50 item 1: `--find-max warm` — how many agent sessions stay warm — against a scripted server whose prefix
cache is an LRU pool of a known size in tokens, so the knee is known before the search runs."""
import json
import os
import threading
from collections import OrderedDict

import pytest
from aiohttp import web

from bench.rawsse import RawServer, Reply, sse
from runbook.bench import report, warm
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.bench.sweep import Level
from runbook.core.errors import InputError
from runbook.endpoint.records import RequestRecord

PAGE = 16


class PoolServer:
    """Tokens = characters / 4. A finished request's prompt and answer stay cached, least recently used evicted first
    while the cache holds more than `pool` tokens; a prompt's cached part is its longest common prefix with a cached
    conversation, in whole pages. /server_info reports the pool as SGLang does."""

    def __init__(self, pool: int, context_length: int = 8192):
        self.pool, self.context_length = pool, context_length
        self.held: OrderedDict[str, int] = OrderedDict()     # conversation text -> tokens, least recent first
        self.flushes = 0
        self.lock = threading.Lock()

    def info(self) -> dict:
        return {"max_total_num_tokens": self.pool, "page_size": PAGE, "context_length": self.context_length,
                "radix_eviction_policy": "lru", "disable_radix_cache": False}

    def __call__(self, body: dict) -> Reply:
        text = "".join(f"<{m['role']}>{m['content']}" for m in body.get("messages") or [])
        n_out = int(body.get("max_tokens", 8))
        answer = "".join(f" w{k}" for k in range(n_out))
        with self.lock:
            best, key = 0, None
            for held in self.held:
                c = len(os.path.commonprefix([text, held]))
                if c > best:
                    best, key = c, held
            if key is not None:
                self.held.move_to_end(key)
            done = text + f"<assistant>{answer}"
            self.held.pop(key, None) if key is not None and done.startswith(key) else None
            self.held[done] = len(done) // 4
            while sum(self.held.values()) > self.pool and len(self.held) > 1:
                self.held.popitem(last=False)
        n_in, cached = len(text) // 4, best // 4 // PAGE * PAGE
        usage = {"prompt_tokens": n_in, "prompt_tokens_details": {"cached_tokens": cached}}
        writes = [(0.002 + k * 0.001, sse({"choices": [{"index": 0, "delta": {"content": f" w{k}"},
                                                         "finish_reason": "length" if k == n_out - 1 else None}],
                                            "usage": dict(usage, completion_tokens=k + 1)}))
                  for k in range(n_out)]
        return Reply([*writes, (0.002 + n_out * 0.001, b"data: [DONE]\n\n")])


class PoolHTTP(RawServer):
    def __init__(self, pool: PoolServer):
        super().__init__(pool)
        self.pool = pool

    async def _any(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/server_info":
            return web.json_response(self.pool.info())
        if request.path == "/flush_cache":
            with self.pool.lock:
                self.pool.held.clear()
                self.pool.flushes += 1
            return web.Response(text="Cache flushed.")
        return await super()._any(request)


def opts(url, **kw):
    base = dict(url=url, model="raw", concurrency=[1], workload="agentic", input_len=300, output_len=8, turns=3,
                tool_result_len=60, warmup=0, telemetry=False, timeout=30.0, find_max="warm", find_max_levels=8)
    base.update(kw)
    return BenchSettings(**base)


def serve(pool_tokens):
    p = PoolServer(pool_tokens)
    return p, PoolHTTP(p).start()


def context_of(url):
    """The context a session's last turn comes back to on the scripted server (its own counts): one session."""
    p, srv = serve(10**9)
    try:
        res = bench.run(opts(srv.url, find_max=None, concurrency=[1]))
    finally:
        srv.stop()
    rs = res.levels[0].sound
    return max((r.input_tokens or 0) + r.output_tokens for r in rs if r.meta["turn"] < 3)


def test_knee_within_one_step_of_the_plan():
    ctx = context_of(None)
    pages = -(-ctx // PAGE) * PAGE
    p, srv = serve(pages * 5 + pages // 2)             # the plan: 5 sessions' contexts fit
    try:
        res = bench.run(opts(srv.url))
    finally:
        srv.stop()
    r = res.summary["warm_sessions"]
    assert r["predicted_sessions"] == 5 and r["pool_tokens"] == p.pool and r["page_size"] == PAGE
    assert r["reached"] and r["resolved"] and abs(r["knee_sessions"] - 5) <= 1, r["levels"]
    assert r["first_cold"] == r["knee_sessions"] + 1
    assert p.flushes == len(r["levels"])                           # each level from an empty cache
    rows = {x["sessions"]: x for x in r["levels"]}
    assert [x["sessions"] for x in r["levels"]] == sorted(rows)
    assert all(x["warm"] == (n <= r["knee_sessions"]) for n, x in rows.items())
    warm_row, cold_row = rows[r["knee_sessions"]], rows[r["first_cold"]]
    assert warm_row["cache_hit_rate"] > cold_row["cache_hit_rate"]
    assert cold_row["reprefill_tokens_per_turn"] > warm_row["reprefill_tokens_per_turn"]
    # exactly N sessions per level, each to its last turn: turns 2+ = N × (turns − 1)
    assert all(x["turns_measured"] == n * 2 for n, x in rows.items())
    assert r["eviction_policy"] == "lru" and "idle longest" in r["evicts_first"] and "radix_cache.py" in r["policy_source"]
    f = {x.id: x for x in res.findings}["bench.warm_sessions"]
    assert f.status == "pass" and f"{r['knee_sessions']} agent sessions stay warm" in f.title
    assert "the plan predicts 5" in f.title
    json.dumps(res.summary, allow_nan=False)
    assert len(report.warm_frame(res.summary)) == len(rows)
    ax = report.plot_warm(res.summary).axes[0]
    assert {line.get_label() for line in ax.get_lines()} >= {"plan: 5 warm", f"measured knee: {r['knee_sessions']}"}


def test_a_sweep_that_cannot_reach_the_knee_says_so_and_makes_none_up():
    ctx = context_of(None)
    p, srv = serve(-(-ctx // PAGE) * PAGE * 40)
    try:
        with pytest.raises(InputError, match=r"the plan predicts \d+ warm sessions at ~\d+ tokens, but 3 levels from 1 reach 4: start at"):
            bench.run(opts(srv.url, find_max_levels=3))
        assert p.flushes == 0                          # refused before any level ran
    finally:
        srv.stop()


def test_search_with_a_fake_measure_brackets_and_bisects():
    """The search logic alone: warm up to 6 sessions, cold from 7."""
    import asyncio

    p = warm.pool({"s": {"max_total_num_tokens": 6 * 672 + 100, "page_size": 16, "context_length": 8192}})
    asked = []

    async def measure(lv: Level):
        n = lv.concurrency
        asked.append(n)
        return {}, session_records(n, warm_turns=n <= 6)

    r = asyncio.run(warm.search(measure, opts("http://x", turns=3), p, 1000))
    assert asked[:4] == [1, 2, 4, 8] and r["knee_sessions"] == 6 and r["first_cold"] == 7 and r["resolved"]
    assert r["predicted_sessions"] == 6 and r["context_tokens"] == 666     # measured (turn 2's 658 + 8), not the estimate
    assert warm.findings(r)[0].status == "pass"
    # cold already at one session: a fail, no knee
    asked.clear()

    async def cold(lv: Level):
        asked.append(lv.concurrency)
        return {}, session_records(lv.concurrency, warm_turns=False)
    r = asyncio.run(warm.search(cold, opts("http://x", concurrency=[4]), p, 1000))
    assert asked == [4, 2, 1] and r["knee_sessions"] is None and r["first_cold"] == 1
    assert warm.findings(r)[0].status == "fail"
    # warm at every level the search may run: no knee made up, a warn that says the knee is above the sweep
    async def always(lv: Level):
        return {}, session_records(lv.concurrency, warm_turns=True)
    r = asyncio.run(warm.search(always, opts("http://x", concurrency=[4], find_max_levels=2), p, 1000))
    assert r["knee_sessions"] is None and not r["reached"] and r["warm_at_least"] == 8
    f = warm.findings(r)[0]
    assert f.status == "warn" and "above the sweep" in f.title
    # a server keeping fewer than the plan: named in the verdict
    async def fewer(lv: Level):
        return {}, session_records(lv.concurrency, warm_turns=lv.concurrency <= 3)
    f = warm.findings(asyncio.run(warm.search(fewer, opts("http://x"), p, 1000)))[0]
    assert f.status == "warn" and "keeps 3 fewer" in f.title


def session_records(n, warm_turns, turns=3, context=1000):
    """n sessions of `turns` turns, the last coming back to ~2/3 of `context`; turns 2+ hit all (warm) or nothing."""
    out, rid = [], 0
    step = context // turns
    for s in range(n):
        for t in range(1, turns + 1):
            n_in = step * t - 8
            cached = (step * (t - 1)) if warm_turns and t > 1 else 0
            r = RequestRecord(rid, send_time=0.0, chunk_times=[0.01 + (n_in - cached) * 1e-5], end_time=0.1,
                              usage={"prompt_tokens": n_in, "completion_tokens": 8,
                                     "prompt_tokens_details": {"cached_tokens": cached}},
                              count_source="usage", client_tokens=8, max_tokens=8, meta={"session": s, "turn": t})
            out.append(r)
            rid += 1
    return out


def test_level_row_counts_turns_two_on():
    rows = warm.level_row(2, session_records(2, warm_turns=True), 3)
    assert rows["turns_measured"] == 4 and rows["warm_share"] == 1.0 and rows["warm"]
    assert rows["context_tokens"] == 666        # what turn 3 came back to: turn 2's prompt and answer
    cold = warm.level_row(2, session_records(2, warm_turns=False), 3)
    assert cold["warm_share"] == 0.0 and not cold["warm"] and cold["cache_hit_rate"] == 0.0
    assert cold["reprefill_tokens_per_turn"] > rows["reprefill_tokens_per_turn"]
    assert cold["ttft_ms"]["p50"] > rows["ttft_ms"]["p50"]
    # a failed turn has no successor to judge, and its own turn is not counted — nor is either warm
    recs = session_records(1, warm_turns=True)
    recs[1].error_kind = "http"
    failed = warm.level_row(1, recs, 3)
    assert failed["turns_measured"] == 0 and failed["turns_expected"] == 2 and failed["warm_share"] == 0.0
    assert not failed["warm"]
    # one session of four never got past turn 1 (its session ended): 6 of 8 turns 2+ warm, 75 %, a cold level
    recs = [r for r in session_records(4, warm_turns=True) if not (r.meta["session"] == 3 and r.meta["turn"] > 1)]
    short = warm.level_row(4, recs, 3)
    assert short["warm_turns"] == 6 and short["warm_share"] == 0.75 and not short["warm"]


@pytest.mark.parametrize("think", [-1.0, "soon", float("nan")])
def test_a_think_time_that_is_negative_or_not_a_number_is_refused_in_one_line(think):
    with pytest.raises(InputError) as e:
        BenchSettings.resolve(None, url="http://127.0.0.1:9", workload="agentic", find_max="warm", think_time=think)
    assert "think_time" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("info, says", [
    ({"max_total_num_tokens": "4096"}, "no max_total_num_tokens"),
    ({"max_total_num_tokens": True}, "no max_total_num_tokens"),
    ({"max_total_num_tokens": -1}, "no max_total_num_tokens"),
    ({"max_total_num_tokens": 4096, "page_size": 0}, "page_size 0"),
    ({"max_total_num_tokens": 4096, "page_size": -16}, "page_size -16"),
    ({"max_total_num_tokens": 4096, "page_size": "16"}, "page_size '16'"),
    ({"max_total_num_tokens": 4096, "page_size": 16.5}, "page_size 16.5"),
    ({"max_total_num_tokens": 4096, "page_size": None}, "page_size None"),
])
def test_a_hostile_server_info_is_one_line_naming_the_field(info, says):
    with pytest.raises(InputError, match=says) as e:
        warm.pool({"the server": info})
    assert "\n" not in str(e.value) and str(e.value).startswith("the server's /server_info")


def test_a_server_without_cache_report_is_refused_not_called_cold():
    """No cached-token count on any completed turn 2+: not a cold level, an input error naming the flag."""
    import asyncio

    recs = session_records(2, warm_turns=True)
    for r in recs:
        r.usage = {k: v for k, v in r.usage.items() if k != "prompt_tokens_details"}

    async def measure(lv: Level):
        return {}, recs
    p = warm.pool({"s": {"max_total_num_tokens": 4096}})
    with pytest.raises(InputError, match="--enable-cache-report"):
        asyncio.run(warm.search(measure, opts("http://x"), p, 500))


def test_pool_and_reach_refusals():
    with pytest.raises(InputError, match="^r1's /server_info reports no max_total_num_tokens"):
        warm.pool({"r0": {"max_total_num_tokens": 4096}, "r1": {"version": "x"}})
    with pytest.raises(InputError, match="disable-radix-cache"):
        warm.pool({"s": {"max_total_num_tokens": 4096, "disable_radix_cache": True}})
    p = warm.pool({"s": {"max_total_num_tokens": 4096, "page_size": 64, "max_req_input_len": 2047}})
    assert p["eviction_policy"] == "lru" and warm.predicted(p, 1000) == 4       # 1000 → 1024 in pages of 64
    assert p["context_length"] == 2048                                           # max_req_input_len + 1
    # behind a gateway each replica holds its own sessions: 4 + 2, not 6,144 // 1,024
    two = warm.pool({"r0": {"max_total_num_tokens": 4096, "page_size": 64}, "r1": {"max_total_num_tokens": 2100, "page_size": 64}})
    assert two["pool_tokens"] == 6196 and warm.predicted(two, 1000) == 4 + 2
    with pytest.raises(InputError, match="past the server's context length"):
        warm.check_reach(p, 3000, 1, 10)
    with pytest.raises(InputError, match="start at"):
        warm.check_reach(warm.pool({"s": {"max_total_num_tokens": 10**7}}), 1000, 1, 4)
    warm.check_reach(p, 1000, 1, 4)
    assert set(warm.EVICTS_FIRST) == {"lru", "lfu", "slru", "priority", "tlru"}


def test_tune_searches_each_candidates_warm_sessions():
    """tune.warm_search: a candidate's figures carry the knee beside the plan's, and tune's table shows them."""
    from runbook.core import spec as specmod
    from runbook.tune import measure
    from runbook.tune import report as tune_report

    p, srv = serve(2600)
    dep = specmod.load()
    dep = dep.model_copy(update={"tune": dep.tune.model_copy(update={
        "warm_search": True, "slo_search": False, "concurrency": [1], "requests_per_level": 3, "turns": 3,
        "input_len": 300, "output_len": 8})})
    try:
        doc = measure.run(dep, srv.url)
    finally:
        srv.stop()
    w = doc["warm_sessions"]
    assert w["reached"] and w["eviction_policy"] == "lru" and abs(w["knee_sessions"] - w["predicted_sessions"]) <= 1, w
    cell = tune_report.warm_cell(w)
    assert cell == f"{w['knee_sessions']} (plan {w['predicted_sessions']})"
    assert tune_report.warm_cell(dict(w, reached=False)).startswith("> ")
