"""Records no server could have produced are named, kept out of every figure and reported in a finding: each kind
planted among sound records of one level (a 176 ms decode step, as on the tune run that printed 0.5 ms TTFTs)."""
import math
from types import SimpleNamespace

import pytest

from runbook.bench import ab, metrics
from runbook.bench.level_findings import level_findings
from runbook.bench.sweep import Level, LevelResult
from runbook.endpoint.records import RequestRecord
from runbook.tune import measure

STEP = 0.176
SLO = SimpleNamespace(ttft_ms_p99=2000, tpot_ms_p99=300, e2e_ms_p99=None)


def sound(i: int, n: int = 16, ttft: float = 0.9, prompt: int = 512, cached: int | None = None) -> RequestRecord:
    t0 = 10.0 + i
    times = [t0 + ttft + k * STEP for k in range(n)]
    usage: dict = {"prompt_tokens": prompt, "completion_tokens": n}
    if cached is not None:                  # the server reports its prefix-cache hits (--enable-cache-report)
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return RequestRecord(id=i, send_time=t0, chunk_times=times, chunk_tokens=[1] * n, end_time=times[-1], max_tokens=n,
                         usage=usage, status=200, level="c8")


def planted(kind: str) -> RequestRecord:
    r = sound(99)
    if kind == "before_send":
        r.chunk_times = [r.send_time - 0.002 + k * STEP for k in range(16)]
    elif kind == "negative_gap":         # chunk 9 stamped before chunk 8: a negative ITL
        r.chunk_times[8] = r.chunk_times[7] - 0.01
    elif kind == "error_before_send":    # a failure whose error arrived before the request went out
        r.chunk_times, r.chunk_tokens, r.usage, r.error_kind, r.end_time = [], [], None, "timeout", r.send_time - 1.0
    elif kind == "too_many":
        r.usage = {"prompt_tokens": 512, "completion_tokens": 17}
    elif kind == "ttft":                 # the tune run: the first token 0.5 ms after send, the rest at the server's pace
        r.chunk_times = [r.send_time + 0.0005 + k * STEP for k in range(16)]
    elif kind == "prefill":              # 4,096 uncached tokens in 5 ms where the level's records took 0.9 s for as many
        r = sound(99, prompt=4096, cached=0, ttft=0.005)
    elif kind == "one_read":             # every token 10 ms after send: 15 steps of 176 ms could not have run
        r.chunk_times = [r.send_time + 0.01 + k * 1e-5 for k in range(16)]
    return r


def level_with(kind: str) -> tuple[list[RequestRecord], RequestRecord]:
    prompt, cached = (4096, 0) if kind == "prefill" else (512, None)
    return [sound(i, prompt=prompt, cached=cached) for i in range(3)], planted(kind)


CASES = [("before_send", "order", "began before its request was sent"),
         ("negative_gap", "order", "chunk 9 arrived 10.00 ms before chunk 8: a negative gap"),
         ("error_before_send", "order", "began before its request was sent"),
         ("too_many", "too_many", "17 tokens where 16 were asked for"),
         ("ttft", "prefill", "too soon to have prefilled 512 tokens"),
         ("prefill", "prefill", "first token 5.00 ms after sending, too soon to have prefilled its 4096 uncached tokens: the "
                                "fastest of the 3 other records at this level with half to twice as many took 0.220 ms per "
                                "token, and at 50 times that rate they take 18.0 ms"),
         ("one_read", "one_read", "all 16 tokens within")]


@pytest.mark.parametrize("plant, kind, words", CASES)
def test_each_kind_is_named_and_kept_out_of_every_figure(plant, kind, words):
    good, bad = level_with(plant)
    (got,) = metrics.judge([*good, bad]).items()
    assert got[0] == 99 and got[1][0] == kind and words in got[1][1]
    s = metrics.summarise([*good, bad], SLO)
    # every figure is the sound records' own: TTFT, TPOT, ITL, E2E, counts, tokens; the window (and so the rates)
    # may still reach the named record's send, so the rates are checked against the good records' window below
    assert s == {**metrics.summarise(good, SLO), "implausible": [{"id": 99, "kind": kind, "why": got[1][1]}],
                 "window_s": s["window_s"], "output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"],
                 "request_s": s["request_s"], "goodput_req_s": s["goodput_req_s"]}
    assert s["completed"] == 3 and s["failed"] == 0 and s["ttft_ms"]["n"] == 3 and s["ttft_ms"]["p50"] == pytest.approx(900)
    assert s["output_tok_s"] == pytest.approx(48 / s["window_s"]) and s["goodput_req_s"] == pytest.approx(3 / s["window_s"])
    assert s["slo_attainment"] == 1.0
    f = {x.id: x for x in level_findings([{**s, "label": "c8", "client_bound": False}], "chat", None)}["bench.implausible.c8"]
    assert f.status == "warn" and "1 records" in f.title and f"({kind} 1)" in f.title
    assert f.detail.startswith(f"{kind} (1: requests 99): request 99: ") and words in f.detail


def test_the_finding_names_each_kind_its_count_ids_and_figures():
    recs = [sound(i) for i in range(4)]
    for i, kind in ((10, "ttft"), (11, "ttft"), (12, "one_read"), (13, "before_send")):
        r = planted(kind)
        r.id = i
        recs.append(r)
    s = metrics.summarise(recs)
    assert [(b["id"], b["kind"]) for b in s["implausible"]] == [(10, "prefill"), (11, "prefill"), (12, "one_read"), (13, "order")]
    (f,) = [x for x in level_findings([{**s, "label": "c8", "client_bound": False}], "chat", None) if x.id == "bench.implausible.c8"]
    assert f.title == ("c8: 4 records no server could have produced, left out of every figure (order 1, prefill 2, one_read 1)")
    order, prefill, one_read = f.detail.split("; ")
    assert order.startswith("order (1: requests 13): request 13: its response began before")
    assert prefill.startswith("prefill (2: requests 10, 11): request 10: first token 0.50 ms after sending")
    assert one_read.startswith("one_read (1: requests 12): request 12: all 16 tokens within 10.15 ms")


def test_six_of_eight_implausible_are_all_caught_by_the_two_sound_ones():
    """The tune pattern: a majority of impossible records must not become the level's reference."""
    recs = [sound(0), sound(1)] + [planted("ttft") for _ in range(6)]
    for i, r in enumerate(recs[2:], 2):
        r.id = i
    assert sorted(metrics.implausible(recs)) == [2, 3, 4, 5, 6, 7]


def test_a_retracted_request_does_not_make_the_others_implausible():
    """One request in four waiting 75 steps per token (re-prefilled after a retraction): the rest stay sound."""
    slow = sound(3)
    slow.chunk_times = [slow.send_time + 0.9 + k * STEP * 75 for k in range(16)]
    assert metrics.implausible([sound(0), sound(1), sound(2), slow]) == {}


def test_retractions_in_three_of_eight_do_not_make_a_quick_short_answer_implausible():
    """CI's retraction test: three of eight wait 30 s in one gap (their TPOT 2.2 s), and one answer stops at EOS after
    two tokens 30 ms after sending. Judged by the level's TPOT (2.2 s) it was 50 times too fast; by the requests' own
    pace per token (176 ms, a retraction's wait is one gap of many) it is sound."""
    retracted = [sound(i) for i in range(3)]
    for r in retracted:
        r.chunk_times = [t + (30.0 if k >= 8 else 0.0) for k, t in enumerate(r.chunk_times)]
    short = sound(7, n=2, ttft=0.01)
    short.chunk_times = [short.send_time + 0.01, short.send_time + 0.03]
    level = [*retracted, *(sound(i) for i in range(3, 7)), short]
    assert metrics.tpot_s(retracted[0]) > 2.0 and 50 * metrics.e2e_s(short) < metrics.tpot_s(retracted[0])
    assert metrics.implausible(level) == {}


def test_sound_levels_flag_nothing():
    """Batching and speculative chunks move a request's pace a few times, not fifty: nothing is named."""
    fast = sound(5, ttft=0.05)                                   # a cached prompt: first token within a third of a step
    lone = sound(9, ttft=0.003)      # a cached turn on a CI host under load: 1/59 of the loaded step, above MIN_TTFT_S
    spec = sound(6)
    spec.chunk_times = [spec.send_time + 0.9 + k * STEP for k in range(4)]   # 4 chunks of 4 tokens (speculation)
    spec.chunk_tokens = [4] * 4
    one = sound(7, n=1)                                          # no TPOT: never judged by a pace
    buffered = sound(8)                                          # paced by the server, read by the client at once
    buffered.chunk_times = [buffered.send_time + 0.9 + 15 * STEP + k * 1e-5 for k in range(16)]
    assert metrics.implausible([sound(0), sound(1), fast, lone, spec, one, buffered]) == {}
    assert metrics.summarise([sound(0)])["implausible"] == []


def test_a_queue_mixed_lengths_and_the_prefix_cache_do_not_make_a_first_token_implausible():
    """The prefill rule against sound levels where the server reports its cache: what a queue, a fixed cost and the
    prefix cache do to a first token is far from fifty times the level's fastest prefill."""
    # SGLang under a small pool: 4 of 8 admitted at once, 4 waited out a whole 64-token decode (225 times the prefill)
    pool = [sound(i, ttft=0.05, cached=0) for i in range(4)] + [sound(i, ttft=0.05 + 64 * STEP, cached=0) for i in range(4, 8)]
    # a rate past capacity: each request waits a second longer than the one before (the first one 100 times less)
    rate = [sound(i, ttft=0.1 + i * 1.0, cached=0) for i in range(8)]
    # short prompts (mostly the server's fixed cost per token) beside long ones 25 times cheaper per token
    mixed = [sound(i, prompt=16, ttft=0.02, cached=0) for i in range(6)] + [sound(i, prompt=8192, ttft=0.4, cached=0) for i in (6, 7)]
    # warm-up ran the first two prompts: served from the cache, one forward each, beside six prefilled ones
    warm = [sound(i, ttft=0.03, cached=511) for i in (0, 1)] + [sound(i, cached=0) for i in range(2, 8)]
    # and a level where every prompt may have come from the cache (no report): only the forward floor judges
    unknown = [sound(0, ttft=0.003), *(sound(i) for i in range(1, 8))]
    for level in (pool, rate, mixed, warm, unknown):
        assert metrics.judge(level) == {}


@pytest.mark.parametrize("hole", ["no_send_time", "nan_chunk", "failed_without_times", "no_end_time"])
def test_missing_or_broken_timestamps_never_crash_the_check(hole):
    """A record without a send time, or with a timestamp that is no number, is named (`order`): none of its figures
    can be placed. One without chunks or without an end (a failure, a stream still open) is only not judged by the
    rules that need them."""
    r = sound(99)
    if hole == "no_send_time":
        r.send_time = None
    elif hole == "nan_chunk":
        r.chunk_times[3] = math.nan
    elif hole == "failed_without_times":
        r.chunk_times, r.chunk_tokens, r.end_time, r.usage, r.error_kind = [], [], None, None, "connect"
    elif hole == "no_end_time":
        r.end_time = None
    level = [sound(i) for i in range(3)] + [r]
    s = metrics.summarise(level, SLO)
    named = {b["id"]: b["kind"] for b in s["implausible"]}
    assert named == ({99: "order"} if hole in ("no_send_time", "nan_chunk") else {})
    assert s["ttft_ms"]["p50"] == pytest.approx(900) and all(math.isfinite(v) for v in s["itl_ms"].values() if v is not None)


def test_every_consumer_of_a_level_leaves_the_named_records_out():
    """The level's figures outside its summary read the same judgement: tune's buckets, turns and per-request rates,
    the CDF plot (LevelResult.sound), failover's phases and the A/B pairs (each arm judged as a level)."""
    good, bad = level_with("prefill")
    for r in (*good, bad):
        r.meta["turn"] = 0
    lv = LevelResult(Level("c8", 8), [*good, bad], {}, {}, 0.0, False)
    lv.summary = metrics.summarise(lv.records)
    assert lv.sound == good
    (b,) = measure.buckets(lv.sound, [8192])
    assert b["requests"] == 3 and b["ttft_ms_p50"] == pytest.approx(900)
    assert [t["requests"] for t in measure.turns(lv.sound)] == [3]
    assert len(measure.per_request([lv])) == 3
    from runbook.bench import failover
    acc = failover.account(lv.records, stopped_at=200.0, implausible=[bad])
    assert acc["phases"]["before"]["ttft_ms"]["n"] == 3 and acc["phases"]["before"]["requests"] == 4
    res, findings = ab.paired(good + [sound(99, prompt=4096, cached=0)], [*good, bad], "a", "b")
    assert res["pairs"] == 3 and [x["id"] for x in res["implausible"]["b"]] == [99] and res["implausible"]["a"] == []
    assert "bench.ab.implausible.b" in {f.id for f in findings}
