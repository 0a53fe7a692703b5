"""accuracy/kld.py against independent computations: scipy.stats.entropy on the coarsened (top-k + tail)
distributions, the full-vocabulary KLD it may never exceed, hand-computed values, and numpy's own statistics."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import log_softmax
from scipy.stats import entropy

from runbook.accuracy import kld
from runbook.core.errors import InputError


def scores_from_logits(ids, ref_logits, cand_logits, k):
    """(reference Scores, candidate Scores) from full-vocabulary logits, as the servers would report them."""
    ids = np.asarray(ids)
    lp_r, lp_c = log_softmax(ref_logits, axis=1), log_softmax(cand_logits, axis=1)
    rows = np.arange(len(ids) - 1)
    nxt = ids[1:]
    top_r = np.argsort(-lp_r, axis=1)[:, :k]
    top_c = np.argsort(-lp_c, axis=1)[:, :k]
    ref = kld.Scores(ids, lp_r[rows, nxt], top_r, np.take_along_axis(lp_r, top_r, 1))
    cand = kld.Scores(ids, lp_c[rows, nxt], top_c, np.take_along_axis(lp_c, top_c, 1), np.take_along_axis(lp_c, top_r, 1))
    return ref, cand


def random_pair(rng, n=64, vocab=50, k=5, noise=0.3):
    ids = rng.integers(0, vocab, n)
    ref = rng.normal(0, 3, (n - 1, vocab))
    return ids, ref, ref + rng.normal(0, noise, ref.shape)


def test_position_kld_is_scipy_entropy_of_the_coarsened_distributions():
    rng = np.random.default_rng(1)
    ids, lr, lc = random_pair(rng)
    ref, cand = scores_from_logits(ids, lr, lc, k=5)
    got = kld.position_kld(ref.top_lp, cand.at_ref)
    p_full, q_full = np.exp(log_softmax(lr, axis=1)), np.exp(log_softmax(lc, axis=1))
    for i in range(len(got)):
        top = ref.top_ids[i]
        p = np.append(p_full[i, top], 1 - p_full[i, top].sum())
        q = np.append(q_full[i, top], 1 - q_full[i, top].sum())
        assert got[i] == pytest.approx(entropy(p, q), rel=1e-9, abs=1e-12)
        assert got[i] <= entropy(p_full[i], q_full[i]) + 1e-12      # a coarsening never exceeds the full KLD


def test_hand_computed_value_and_the_tail_bucket():
    p = np.log(np.array([[0.5, 0.3]]))        # tail 0.2
    q = np.log(np.array([[0.4, 0.4]]))        # tail 0.2
    want = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    assert kld.position_kld(p, q)[0] == pytest.approx(want, rel=1e-12)
    q2 = np.log(np.array([[0.4, 0.5]]))       # tail 0.1: the tail term is 0.2 ln 2
    assert kld.position_kld(p, q2)[0] == pytest.approx(0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.5)
                                                       + 0.2 * math.log(2), rel=1e-12)


def test_a_candidate_tail_of_zero_is_floored_not_infinite():
    p = np.log(np.array([[0.5, 0.3]]))
    q = np.log(np.array([[0.5, 0.5]]))        # all of Q's mass on the two ids
    got = kld.position_kld(p, q)[0]
    assert math.isfinite(got)
    assert got == pytest.approx(0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / kld.PROB_FLOOR), rel=1e-9)


def test_full_vocabulary_top_k_has_no_tail_and_equals_the_full_kld():
    rng = np.random.default_rng(2)
    ids, lr, lc = random_pair(rng, vocab=12)
    ref, cand = scores_from_logits(ids, lr, lc, k=12)
    full = [entropy(np.exp(log_softmax(a)), np.exp(log_softmax(b))) for a, b in zip(lr, lc, strict=False)]
    assert np.allclose(kld.position_kld(ref.top_lp, cand.at_ref), full, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(2, 30), st.integers(1, 30), st.floats(0.0, 5.0))
def test_kld_is_non_negative_and_zero_for_identical_inputs(seed, vocab, k, noise):
    rng = np.random.default_rng(seed)
    k = min(k, vocab)
    ids, lr, lc = random_pair(rng, n=8, vocab=vocab, k=k, noise=noise)
    ref, cand = scores_from_logits(ids, lr, lc, k)
    assert (kld.position_kld(ref.top_lp, cand.at_ref) >= -1e-12).all()
    same = scores_from_logits(ids, lr, lr, k)
    assert (kld.position_kld(same[0].top_lp, same[1].at_ref) == 0).all()


def test_compare_statistics_match_numpy_and_hand_counts():
    rng = np.random.default_rng(3)
    refs, cands = [], []
    for _ in range(3):
        r, c = scores_from_logits(*random_pair(rng, n=200, vocab=40, k=8), k=8)
        refs.append(r)
        cands.append(c)
    res = kld.compare(refs, cands)
    allk = np.concatenate([kld.position_kld(r.top_lp, c.at_ref) for r, c in zip(refs, cands, strict=False)])
    lr = np.concatenate([r.actual for r in refs])
    lc = np.concatenate([c.actual for c in cands])
    o = res.overall
    assert o["positions"] == 3 * 199
    assert o["kld_mean"] == pytest.approx(allk.mean())
    assert o["kld_se"] == pytest.approx(np.std(allk, ddof=1) / math.sqrt(allk.size))
    assert o["kld_p99"] == pytest.approx(np.percentile(allk, 99))
    assert o["kld_share_above"] == (allk > kld.TAIL_KLD).mean() and 0 < o["kld_share_above"] < 1, o["kld_share_above"]
    deep = res.by_depth[1]
    assert deep["kld_share_above"] == (np.concatenate([k[127:] for k in np.split(allk, 3)]) > kld.TAIL_KLD).mean()
    assert o["ppl_ref"] == pytest.approx(math.exp(-lr.mean()))
    assert o["ppl_ratio"] == pytest.approx(math.exp(-lc.mean()) / math.exp(-lr.mean()))
    dp = np.exp(lc) - np.exp(lr)
    assert o["dp_rms"] == pytest.approx(math.sqrt((dp ** 2).mean()))
    same = np.concatenate([r.top_ids[:, 0] == c.top_ids[:, 0] for r, c in zip(refs, cands, strict=False)])
    assert o["same_top1"] == pytest.approx(same.mean())
    assert sum(b["positions"] for b in res.by_depth) == o["positions"]
    assert [(b["from"], b["to"]) for b in res.by_depth] == [(1, 128), (128, 200)]
    lo, hi = o["kld_ci"]
    assert lo <= o["kld_mean"] <= hi


def test_depth_buckets():
    assert kld.depth_buckets(100) == [(1, 100)]
    assert kld.depth_buckets(1000) == [(1, 128), (128, 512), (512, 1000)]
    assert kld.depth_buckets(1024) == [(1, 128), (128, 512), (512, 1024)]
    assert kld.depth_buckets(5000) == [(1, 128), (128, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 5000)]


def test_one_window_has_a_degenerate_interval_and_a_paired_difference_with_itself_is_zero():
    rng = np.random.default_rng(4)
    r, c = scores_from_logits(*random_pair(rng), k=5)
    res = kld.compare([r], [c])
    assert res.overall["kld_ci"][0] == pytest.approx(res.overall["kld_mean"])
    assert res.overall["kld_ci"][1] == pytest.approx(res.overall["kld_mean"])
    assert kld.bootstrap(res.sums, "kld", base=res.sums)["all"] == [0.0, 0.0]


def _windows(seed, noise, n=4, length=300, vocab=60, k=10):
    rng = np.random.default_rng(seed)
    refs, cands = [], []
    for _ in range(n):
        ids, lr, _ = random_pair(rng, n=length, vocab=vocab)
        r, c = scores_from_logits(ids, lr, lr + rng.normal(0, noise, lr.shape), k)
        refs.append(r)
        cands.append(c)
    return refs, cands


def test_verdict_pass_warn_fail_by_the_documented_thresholds():
    refs, same = _windows(5, 0.0)
    floor = kld.compare(refs, same)
    assert floor.overall["kld_mean"] == 0
    assert kld.judge(floor, floor).status == "pass"
    for noise, want in ((0.02, "pass"), (0.06, "warn"), (0.6, "fail")):
        _, cands = _windows(5, noise)
        res = kld.compare(refs, cands)
        v = kld.judge(res, floor)
        assert v.status == want, (noise, res.overall["kld_mean"], v)
    f = kld.verdict(res, floor, tested="KV cache dtype: bf16 vs fp8_e4m3")
    assert f.status == "fail" and "KV cache dtype: bf16 vs fp8_e4m3" in f.title and f.remedy


def _tail_windows(off_every=None, n=4, length=300, vocab=60, k=10, seed=7, sigma=0.7):
    """A candidate equal to the reference but at every `off_every`-th position (none when None), where noise of
    `sigma` moves its logits."""
    rng, other = np.random.default_rng(seed), np.random.default_rng(seed + 1)   # the same windows whatever is off
    refs, cands = [], []
    for _ in range(n):
        ids, lr, _ = random_pair(rng, n=length, vocab=vocab)
        lc = lr.copy()
        if off_every:
            lc[::off_every] += other.normal(0, sigma, lc[::off_every].shape)
        r, c = scores_from_logits(ids, lr, lc, k)
        refs.append(r)
        cands.append(c)
    return refs, cands


def test_the_tail_decides_when_a_few_positions_are_far_off_and_noise_never_does():
    """One position in 25 moved by noise, the rest exact: mean KLD and top-1 alone say warn, the tail says fail (a
    measurable excess of positions above TAIL_KLD beyond FAIL_TAIL_PTS). One such position in 1,196 is within the
    counts' noise and moves nothing."""
    refs, same = _tail_windows()
    floor = kld.compare(refs, same)
    assert floor.overall["kld_share_above"] == 0
    _, cands = _tail_windows(25)
    v = kld.judge(kld.compare(refs, cands), floor)
    assert kld.PASS_KLD < v.excess_kld < kld.FAIL_KLD and v.top1_drop_pts < kld.FAIL_TOP1_PTS, v
    assert v.tail_measurable and v.tail_excess_pts > kld.FAIL_TAIL_PTS and v.status == "fail"
    assert v.data()["tail_excess_pts"] == v.tail_excess_pts and v.data()["thresholds"]["fail_tail_pts"] == kld.FAIL_TAIL_PTS
    res = kld.compare(refs, [_one_position_off(r, c) if i == 0 else c for i, (r, c) in enumerate(zip(refs, same, strict=True))])
    w = kld.judge(res, floor)
    assert 0 < w.tail_excess_pts < kld.PASS_TAIL_PTS * 2 and not w.tail_measurable
    assert "% of positions above 0.1 nats" in kld.verdict(res, floor).title


def _one_position_off(ref, cand):
    """The candidate with its first position's top-k moved onto the reference's least likely ids."""
    at = cand.at_ref.copy()
    at[0] = at[0][::-1]
    return kld.Scores(cand.ids, cand.actual, cand.top_ids, cand.top_lp, at)


def test_verdict_refuses_a_floor_on_other_windows():
    refs, cands = _windows(6, 0.1)
    res = kld.compare(refs, cands)
    other = kld.compare(refs[:2], cands[:2])
    with pytest.raises(InputError, match="different windows"):
        kld.judge(res, other)


@pytest.mark.parametrize("field,value,match", [
    ("actual", np.array([np.nan] * 63), "not finite"),
    ("actual", np.array([np.inf] + [-1.0] * 62), "not finite"),
    ("top_lp", None, "ragged"),
    ("actual", np.array([0.5] * 63), "above 0"),
    ("actual", np.zeros(10), "expected \\(63,\\)"),
])
def test_malformed_scores_are_refused_naming_the_field(field, value, match):
    rng = np.random.default_rng(7)
    r, c = scores_from_logits(*random_pair(rng), k=5)
    if field == "top_lp" and value is None:
        value = r.top_lp[:, :3]
    bad = kld.Scores(**{**r.__dict__, field: value})
    with pytest.raises(InputError, match=match):
        kld.compare([bad], [c])


def test_different_token_ids_are_refused():
    rng = np.random.default_rng(8)
    r, c = scores_from_logits(*random_pair(rng), k=5)
    ids = c.ids.copy()
    ids[17] += 1
    with pytest.raises(InputError, match="different token ids \\(first at position 17\\)"):
        kld.compare([r], [kld.Scores(**{**c.__dict__, "ids": ids})])


def test_a_candidate_without_the_references_ids_is_refused():
    rng = np.random.default_rng(9)
    r, c = scores_from_logits(*random_pair(rng), k=5)
    with pytest.raises(InputError, match="reference's top-k"):
        kld.compare([r], [kld.Scores(**{**c.__dict__, "at_ref": None})])


def test_the_table_and_plot_show_each_bucket_and_the_floor():
    import matplotlib

    matplotlib.use("Agg")
    from runbook.accuracy import report

    refs, same = _windows(10, 0.0, length=600)
    _, cands = _windows(10, 0.1, length=600)
    doc = {"candidate": kld.compare(refs, cands).data(), "floor": kld.compare(refs, same).data()}
    t = report.kld_table(doc)
    assert list(t.index) == ["[1, 128)", "[128, 512)", "[512, 600)", "all"]
    assert t.loc["all", "positions"] == 4 * 599 and (t["floor mean KLD"] == 0).all()
    assert t.loc["all", "mean KLD"] == pytest.approx(doc["candidate"]["overall"]["kld_mean"])
    fig = report.plot_kld(doc)
    assert len(fig.axes) == 2 and len(fig.axes[0].get_lines()) >= 2
