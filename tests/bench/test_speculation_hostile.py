"""The speculation study against a scripted llama-server look-alike whose `timings` lie: the real client and study
code end to end, each hostile response left out with its one line, nothing raised, the honest ones still counted."""
import asyncio
import json

import pytest
from aiohttp import web
from sse_server import ThreadedApp

from runbook.bench import speculation_study
from runbook.bench.settings import BenchSettings

# request n (in arrival order) gets TIMINGS[n]; "absent" sends no timings at all
TIMINGS = [{"predicted_n": 8, "draft_n": 6, "draft_n_accepted": 4},             # honest
           "absent",
           {"predicted_n": 8, "draft_n": -3, "draft_n_accepted": 0},
           {"predicted_n": 8, "draft_n": "6", "draft_n_accepted": 4},
           {"predicted_n": 8, "draft_n": 2, "draft_n_accepted": 5},
           {"predicted_n": 8, "draft_n": 10**12, "draft_n_accepted": 1},
           [1, 2, 3]]


class FakeLlama(ThreadedApp):
    def __init__(self, metrics: str | None, props: bool = True):
        self.n, self.metrics, self.props, self.url = 0, metrics, props, ""

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        if self.metrics is not None:
            app.router.add_get("/metrics", self.metrics_page)
        if self.props:
            app.router.add_get("/props", self.props_page)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "smollm2", "object": "model"}]})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics)

    async def props_page(self, request: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"params": {"speculative.types": "ngram-simple"}}})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        t = TIMINGS[self.n % len(TIMINGS)]
        self.n += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(8):     # one token per 5 ms: a stream a server could send (metrics.implausible)
            chunk = {"choices": [{"index": 0, "text": f" t{k}", "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.005)
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 64, "completion_tokens": 8}}
        if t != "absent":
            last["timings"] = t
        await resp.write(b"data: " + json.dumps(last).encode() + b"\n\n" + b"data: [DONE]\n\n")
        return resp


@pytest.fixture
def fake():
    srv = FakeLlama("".join(f"# TYPE llamacpp:spec_decode_num_{n}_total counter\nllamacpp:spec_decode_num_{n}_total 0\n"
                            for n in ("draft_tokens", "accepted_tokens", "drafts"))).start()
    yield srv
    srv.stop()


def test_hostile_timings_are_left_out_one_line_each_and_the_honest_one_counts(fake):
    o = BenchSettings.resolve(None, url=fake.url, speculation=True, speculation_contexts=[64], speculation_requests=len(TIMINGS),
                              output_len=8)
    buckets = speculation_study.plan(o, kinds=("code",))
    got = speculation_study.collect(fake.url, buckets)
    assert [r.ok for r in got["code-64"].records] == [True] * len(TIMINGS)
    st = speculation_study.summarise(buckets, got, None, speculation_study.server_mode(fake.url))
    row = st.rows[0]
    assert (row["requests"], row["drafted"], row["accepted"], row["acceptance"]) == (1, 6, 4, 4 / 6)
    assert st.mode == "ngram-simple"
    warn = next(f for f in st.findings if f.id == "bench.spec.responses.code-64")
    # six refused responses, and /metrics counting nothing while the responses said 4/6 (another client, or a lie):
    # the responses' figures stand, the accept length (which needs /metrics' steps) is not given
    assert warn.status == "warn" and warn.title == "code-64: 7 response(s) not counted"
    assert "no `timings` object" in warn.detail and "(+6 more)" in warn.detail and "\n" not in warn.detail
    assert row["accept_length"] is None


def test_a_server_without_props_or_metrics_still_gives_the_responses_figures():
    srv = FakeLlama(None, props=False).start()
    try:
        o = BenchSettings.resolve(None, url=srv.url, speculation=True, speculation_contexts=[64], speculation_requests=1,
                                  output_len=8)
        buckets = speculation_study.plan(o, kinds=("code",))
        got = speculation_study.collect(srv.url, buckets)
        st = speculation_study.summarise(buckets, got, None, speculation_study.server_mode(srv.url))
    finally:
        srv.stop()
    assert got["code-64"].deltas is None and st.mode == ""          # neither /props nor /slots answered
    assert (st.rows[0]["acceptance"], st.rows[0]["accept_length"]) == (4 / 6, None)
    assert [f.id for f in st.findings] == ["bench.spec.real_vs_random", "bench.spec.baseline"]


def test_the_stage_runs_the_study_after_its_levels_and_records_it(fake):
    from runbook import bench
    from runbook.core import spec as specmod

    spec = specmod.load()
    opts = bench.BenchStageOptions(url=fake.url, concurrency=[1], requests=2, warmup=0, workload="code", output_len=8,
                                   archive="", speculation=True, speculation_contexts=[64], speculation_requests=1)
    res = bench.evaluate(spec, opts)
    assert res.summary["levels"][0]["completed"] == 2
    study = res.data()["speculation"]
    assert study["mode"] == "ngram-simple" and [b["kind"] for b in study["buckets"]] == ["code", "agentic", "random"]
    assert res.findings[0].id == "bench.spec.real_vs_random"
    assert "Speculative decoding per corpus kind and context" in bench.text_table(res)


@pytest.mark.parametrize("props, slots, mode", [
    ("ngram-mod", None, "ngram-mod"),
    ("none", [{"id": 0, "speculative": True}], "on"),          # 0.3.36: /props says none while the slots speculate
    ("none", [{"id": 0, "speculative": False}], "none"),
    (None, ["junk", {"id": 0}], ""),
    (None, {"not": "a list"}, ""),
])
def test_server_mode_from_props_then_slots(props, slots, mode):
    class Modes(ThreadedApp):
        url = ""

        def routes(self, app: web.Application) -> None:
            if props is not None:
                app.router.add_get("/props", self.p)
            if slots is not None:
                app.router.add_get("/slots", self.s)

        async def p(self, request: web.Request) -> web.Response:
            return web.json_response({"default_generation_settings": {"params": {"speculative.types": props}}})

        async def s(self, request: web.Request) -> web.Response:
            return web.json_response(slots)

    srv = Modes().start()
    try:
        assert speculation_study.server_mode(srv.url) == mode
    finally:
        srv.stop()
