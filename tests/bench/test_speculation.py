"""bench/speculation.py: draft counters judged, buckets summed, the verdict's words; hostile timings refused one line each."""
import math

import pytest

from runbook.bench import speculation as sp
from runbook.core import registry
from runbook.endpoint.records import RequestRecord


def rec(i, drafted=None, accepted=None, predicted=33, span=1.0, ok=True, timings=True, prompt=100):
    """A finished request: `predicted` output tokens streamed over `span` seconds after the first."""
    r = RequestRecord(i, send_time=0.0, chunk_times=[0.5, 0.5 + span], chunk_tokens=[1, predicted - 1],
                      usage={"completion_tokens": predicted, "prompt_tokens": prompt})
    if timings:
        r.timings = {"predicted_n": predicted, **({"draft_n": drafted, "draft_n_accepted": accepted} if drafted is not None else {})}
    if not ok:
        r.error_kind, r.error = "timeout", "no complete response within 600 s"
    return r


@pytest.mark.parametrize("timings, why", [
    (None, "no `timings` object"),
    ("draft_n=4", "no `timings` object"),
    ({"draft_n": 4, "draft_n_accepted": 2}, "predicted_n is None"),
    ({"predicted_n": -1}, "predicted_n is -1"),
    ({"predicted_n": True}, "predicted_n is True"),
    ({"predicted_n": 10, "draft_n": "4", "draft_n_accepted": 2}, "are not both integers"),
    ({"predicted_n": 10, "draft_n": 4}, "are not both integers"),
    ({"predicted_n": 10, "draft_n": 4.0, "draft_n_accepted": 2}, "are not both integers"),
    ({"predicted_n": 10, "draft_n": -4, "draft_n_accepted": 0}, "negative draft counters"),
    ({"predicted_n": 10, "draft_n": 4, "draft_n_accepted": -1}, "negative draft counters"),
    ({"predicted_n": 10, "draft_n": 4, "draft_n_accepted": 5}, "exceeds draft_n 4"),
    ({"predicted_n": 10, "draft_n": 40, "draft_n_accepted": 10}, "is not below predicted_n 10"),
    ({"predicted_n": 10, "draft_n": 10**9, "draft_n_accepted": 3}, "more than any drafter's limit"),
])
def test_hostile_timings_are_refused_with_one_line(timings, why):
    counts, msg = sp.draft_counts(timings)
    assert counts is None and why in msg and "\n" not in msg


def test_counters_absent_mean_nothing_drafted_and_valid_ones_pass():
    assert sp.draft_counts({"predicted_n": 12}) == (sp.DraftCounts(0, 0, 12), None)
    assert sp.draft_counts({"predicted_n": 12, "draft_n": 8, "draft_n_accepted": 6}) == (sp.DraftCounts(8, 6, 12), None)
    assert sp.draft_counts({"predicted_n": 12, "draft_n": 0, "draft_n_accepted": 0}) == (sp.DraftCounts(0, 0, 12), None)


def test_bucket_sums_tokens_not_request_ratios_and_reads_steps_from_metrics():
    # 3/4 and 10/20: token-weighted 13/24, not the mean of ratios (0.625)
    spec = [rec(0, 4, 3, span=0.5), rec(1, 20, 10, span=0.5)]
    base = [rec(0, span=1.0, timings=False), rec(1, span=2.0, timings=False)]
    deltas = {"llamacpp:spec_decode_num_draft_tokens_total": 24.0, "llamacpp:spec_decode_num_accepted_tokens_total": 13.0,
              "llamacpp:spec_decode_num_drafts_total": 8.0, "llamacpp:tokens_predicted_total": 66.0}
    row, problems = sp.bucket_row("code", 256, spec, base, deltas)
    assert problems == []
    assert row["acceptance"] == pytest.approx(13 / 24)
    assert row["accept_length"] == pytest.approx(1 + 13 / 8)
    assert row["tokens_per_pass"] == pytest.approx(66 / (66 - 13))
    assert row["tok_s"] == pytest.approx(64 / 1.0) and row["tok_s_base"] == pytest.approx(64 / 3.0)
    assert row["speedup"] == pytest.approx(3.0)
    # per prompt: 2x and 4x -> geometric mean sqrt(8)
    lo, hi = row["speedup_ci"]
    assert lo <= math.sqrt(8) <= hi and lo >= 2.0 - 1e-9 and hi <= 4.0 + 1e-9
    assert (row["requests"], row["base_requests"], row["real"], row["prompt_tokens_mean"]) == (2, 2, True, 100)


def test_bucket_when_metrics_disagree_keeps_the_responses_and_says_so():
    spec = [rec(0, 4, 3)]
    deltas = {"llamacpp:spec_decode_num_draft_tokens_total": 40.0, "llamacpp:spec_decode_num_accepted_tokens_total": 30.0,
              "llamacpp:spec_decode_num_drafts_total": 8.0}
    row, problems = sp.bucket_row("random", 256, spec, [], deltas)
    assert row["acceptance"] == pytest.approx(0.75) and row["accept_length"] is None
    assert len(problems) == 1 and "another client shares the server" in problems[0]
    assert row["speedup"] is None and row["tok_s_base"] is None and row["real"] is False


def test_bucket_counts_failed_and_unusable_responses_out():
    spec = [rec(0, 4, 2), rec(1, ok=False), rec(2, timings=False), rec(3, 5, 9)]
    row, problems = sp.bucket_row("code", 512, spec, [])
    assert row["requests"] == 1 and row["drafted"] == 4
    assert [p.split(":")[0] for p in problems] == ["request 1", "request 2", "request 3"]
    f = sp.problem_findings({"code-512": problems, "random-512": []})
    assert [x.id for x in f] == ["bench.spec.responses.code-512"]
    assert f[0].title.startswith("code-512: 3 response(s)") and "(+2 more)" in f[0].detail


def test_zero_drafted_gives_no_acceptance_rather_than_zero():
    row, _ = sp.bucket_row("random", 256, [rec(0), rec(1)], [])
    assert row["drafted"] == 0 and row["acceptance"] is None and row["tokens_per_pass"] == 1.0


def test_tok_s_ignores_requests_without_a_decode_span():
    one_token = RequestRecord(0, chunk_times=[0.3], chunk_tokens=[1], usage={"completion_tokens": 1})
    same_time = RequestRecord(1, chunk_times=[0.3, 0.3], chunk_tokens=[1, 1], usage={"completion_tokens": 2})
    assert sp.tok_s([one_token, same_time]) is None
    assert sp.tok_s([one_token, rec(2, predicted=11, span=2.0)]) == pytest.approx(5.0)


def rows(real_acc, rnd_acc, up_real=1.5, up_rnd=0.9):
    def row(kind, acc, up):
        d = 100
        return {"kind": kind, "real": kind in sp.REAL, "drafted": d if acc is not None else 0,
                "accepted": round(d * acc) if acc is not None else 0, "requests": 3, "speedup": up}
    return [row("code", real_acc, up_real), row("agentic", real_acc, up_real), row("random", rnd_acc, up_rnd)]


def test_verdict_says_by_how_much_random_tokens_understate():
    f = sp.verdict(rows(0.62, 0.08), "ngram-simple")
    assert f.id == "bench.spec.real_vs_random" and f.status == "info"
    assert f.title == ("acceptance on real text 62 % vs random tokens 8 % (ngram-simple): judging speculation on random "
                       "tokens understates it by 54 points")
    assert "speed-up on real text 1.50×, on random tokens 0.90×" in f.detail


def test_verdict_can_say_overstates():
    assert "overstates it by 30 points" in sp.verdict(rows(0.1, 0.4)).title


def test_verdict_when_nothing_or_one_side_drafted():
    none = sp.verdict(rows(None, None))
    assert none.status == "warn" and "no draft tokens on any prompt" in none.title and "--spec-type" in none.remedy
    one = sp.verdict(rows(0.5, None))
    assert one.status == "warn" and one.title.endswith("nothing drafted on random tokens")


def test_metric_counts_ignores_other_and_non_finite_series():
    got = sp.metric_counts({"llamacpp:spec_decode_num_drafts_total": 3.0, "sglang:spec_decode_num_drafts_total{x=1}": float("nan"),
                            "llamacpp:tokens_predicted_total": 9.0})
    assert got == {"steps": 3.0}


def test_plan_builds_every_kind_and_length_the_same_on_every_call():
    from runbook.bench import speculation_study
    from runbook.bench.settings import BenchSettings

    o = BenchSettings.resolve(None, speculation=True, speculation_contexts=[64, 128], speculation_requests=2)
    a = speculation_study.plan(o)
    assert list(a) == ["code-64", "agentic-64", "random-64", "code-128", "agentic-128", "random-128"]
    assert all(len(reqs) == 2 and not any(r.ignore_eos for r in reqs) for _, _, reqs in a.values())
    assert isinstance(a["agentic-64"][2][0].prompt, list) and a["agentic-64"][2][0].prompt[0]["role"] == "system"
    assert a["code-64"][2][0].prompt != a["code-64"][2][1].prompt        # no two prompts share a prefix the cache could serve
    b = speculation_study.plan(o)
    assert [r.prompt for _, _, rs in a.values() for r in rs] == [r.prompt for _, _, rs in b.values() for r in rs]


def test_plan_refuses_an_unknown_kind_in_one_line():
    from runbook.bench import speculation_study
    from runbook.bench.settings import BenchSettings
    from runbook.core.errors import InputError

    with pytest.raises(InputError, match=r"^speculation kinds prose: each one of code, agentic, random$"):
        speculation_study.plan(BenchSettings(), kinds=("code", "prose"))


def test_summarise_without_a_baseline_says_so_and_keeps_the_verdict_first():
    from runbook.bench import speculation_study

    buckets = {"code-64": ("code", 64, []), "random-64": ("random", 64, [])}
    spec = {"code-64": speculation_study.Collected([rec(0, 10, 8)]), "random-64": speculation_study.Collected([rec(0, 10, 1)])}
    st = speculation_study.summarise(buckets, spec, None, "ngram-simple")
    assert [f.id for f in st.findings] == ["bench.spec.real_vs_random", "bench.spec.baseline"]
    assert st.findings[0].title.startswith("acceptance on real text 80 % vs random tokens 10 % (ngram-simple)")
    d = st.data()
    assert d["mode"] == "ngram-simple" and d["real"]["acceptance"] == 0.8 and d["random"]["acceptance"] == 0.1
    assert [b["speedup"] for b in d["buckets"]] == [None, None]


def test_the_baseline_url_needs_the_study():
    from runbook.bench.settings import BenchSettings
    from runbook.core.errors import InputError

    with pytest.raises(InputError, match="add speculation"):
        BenchSettings.resolve(None, url="http://127.0.0.1:1", speculation_baseline_url="http://127.0.0.1:2")
    s = BenchSettings.resolve(None, url="http://127.0.0.1:1", speculation=True, speculation_baseline_url="http://127.0.0.1:2")
    assert s.speculation_contexts == [256, 1024] and s.speculation_requests == 3


def test_frame_plot_and_headline_from_a_summary():
    from runbook.bench import report, speculation_study

    buckets = {f"{k}-{c}": (k, c, []) for c in (256, 1024) for k in ("code", "random")}
    spec = {n: speculation_study.Collected([rec(0, 10, 7 if n.startswith("code") else 1, span=0.5)]) for n in buckets}
    base = {n: speculation_study.Collected([rec(0, span=1.0, timings=False)]) for n in buckets}
    st = speculation_study.summarise(buckets, spec, base, "ngram-mod")
    res = type("R", (), {"summary": {"speculation": st.data()}, "findings": st.findings})()
    df = report.speculation_frame(res.summary)
    assert df.loc[("code", 256), "acceptance %"] == 70.0 and df.loc[("random", 1024), "speed-up"] == 2.0
    fig = report.plot_speculation(res.summary)
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["code", "random"]
    assert report.speculation_headline(res).startswith("acceptance on real text 70 % vs random tokens 10 % (ngram-mod)")
    unmeasured = type("R", (), {"summary": {}, "findings": []})()
    assert report.speculation_headline(unmeasured).startswith("not measured: run with speculation=True")
    assert report.speculation_headline(registry.Empty([])) is None and report.speculation_plot(registry.Empty([])) is None
    assert report.speculation_frame({}).empty


def test_steps_without_the_counts_to_check_them_give_no_accept_length():
    row, problems = sp.bucket_row("code", 256, [rec(0, 4, 3)], [], {"llamacpp:spec_decode_num_drafts_total": 2.0})
    assert row["accept_length"] is None and problems == [] and row["acceptance"] == 0.75


def test_token_id_prompts_go_to_completions_and_messages_to_chat():
    from runbook.bench import speculation_study
    from runbook.endpoint.records import RequestSpec

    assert speculation_study.is_chat([RequestSpec(0, [{"role": "user", "content": "hi"}], 8)])
    assert not speculation_study.is_chat([RequestSpec(0, [41802, 31305], 8)])          # random token ids: a list, not chat
    assert not speculation_study.is_chat([RequestSpec(0, "def f():", 8)]) and not speculation_study.is_chat([])
