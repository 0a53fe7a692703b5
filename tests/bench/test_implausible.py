"""Records no server could have produced are named, kept out of every figure and reported in a finding: each kind
planted among sound records of one level (a 176 ms decode step, as on the tune run that printed 0.5 ms TTFTs)."""
import pytest

from runbook.bench import metrics
from runbook.bench.level_findings import level_findings
from runbook.endpoint.records import RequestRecord

STEP = 0.176


def sound(i: int, n: int = 16, ttft: float = 0.9) -> RequestRecord:
    t0 = 10.0 + i
    times = [t0 + ttft + k * STEP for k in range(n)]
    return RequestRecord(id=i, send_time=t0, chunk_times=times, chunk_tokens=[1] * n, end_time=times[-1], max_tokens=n,
                         usage={"prompt_tokens": 512, "completion_tokens": n}, status=200, level="c8")


def planted(kind: str) -> RequestRecord:
    r = sound(99)
    if kind == "before_send":
        r.chunk_times = [r.send_time - 0.002 + k * STEP for k in range(16)]
    elif kind == "too_many":
        r.usage = {"prompt_tokens": 512, "completion_tokens": 17}
    elif kind == "ttft":                 # the tune run: the first token 0.5 ms after send, the rest at the server's pace
        r.chunk_times = [r.send_time + 0.0005 + k * STEP for k in range(16)]
    elif kind == "one_read":             # every token 10 ms after send: 15 steps of 176 ms could not have run
        r.chunk_times = [r.send_time + 0.01 + k * 1e-5 for k in range(16)]
    return r


@pytest.mark.parametrize("kind, words", [("before_send", "began before its request was sent"),
                                         ("too_many", "17 tokens where 16 were asked for"),
                                         ("ttft", "too soon to have prefilled 512 tokens"),
                                         ("one_read", "all 16 tokens within")])
def test_each_kind_is_named_and_kept_out_of_every_figure(kind, words):
    good = [sound(i) for i in range(3)]
    bad = planted(kind)
    assert words in metrics.implausible([*good, bad])[99]
    s = metrics.summarise([*good, bad])
    assert s == {**metrics.summarise(good), "implausible": [{"id": 99, "why": metrics.implausible([*good, bad])[99]}],
                 "window_s": s["window_s"], "output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"],
                 "request_s": s["request_s"]}
    assert s["completed"] == 3 and s["ttft_ms"]["n"] == 3 and s["ttft_ms"]["p50"] == pytest.approx(900)
    f = {x.id: x for x in level_findings([{**s, "label": "c8", "client_bound": False}], "chat", None)}["bench.implausible.c8"]
    assert f.status == "warn" and "1 records" in f.title and "request 99" in f.detail


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
