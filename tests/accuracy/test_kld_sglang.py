"""The KLD probe against the real SGLang server on CPU serving the real model (SmolLM2-135M-Instruct, BF16 weights):
the reference (BF16 KV) reproduces its own next-token distributions (the noise floor), and an FP8 E4M3 KV cache
without scales moves them measurably. The reference is the session's BF16 server (real_sglang); its scores are
kept and the FP8 server is scored against them, as tune's guard would. Small on purpose (2 windows × 1,024 tokens);
benchmarks/kld_fp8_kv.py measures more."""
import pytest

from runbook.accuracy import kld, kldprobe, scoring
from runbook.accuracy.settings import AccuracySettings
from runbook.demo import realmodel
from runbook.model.tokenizer import load_tokenizer

pytestmark = [pytest.mark.sglang]

WINDOWS, TOKENS = 2, 1024


def settings(url):
    return AccuracySettings.resolve(None, None, probe="kld", url=url, tokenizer=str(realmodel.hf_dir()), kld_windows=WINDOWS,
                                    kld_window_tokens=TOKENS, kld_chunk=256, batch_size=2)


def test_bf16_is_its_own_floor_and_fp8_kv_moves_the_distribution(real_model, real_sglang, real_sglang_fp8):
    wins = scoring.windows(load_tokenizer(realmodel.hf_dir()), WINDOWS, TOKENS)
    s = settings(real_sglang.url)
    scoring.check_fits(real_sglang.url, TOKENS)                   # /v1/models' max_model_len: 8,192
    with pytest.raises(Exception, match="longer than the server's context of 8,192"):
        scoring.check_fits(real_sglang.url, 8193)
    ref = kldprobe.measure_reference(s, wins, real_sglang.url)
    # The same BF16 server, the same positions at other shapes (chunks over a cached prefix vs one pass; two windows
    # at once): BF16 rounding alone moves the distribution (0.0003 nats measured for the floor used). What the
    # sample guarantees, not a point estimate's side of a line: a KLD is never negative, and the floor's interval stays below the shift
    # that fails a candidate (else nothing could be measured above it). Same top-1 between two BF16 passes is not
    # gated (vLLM's FP8-KV study, PR 54705: ill-posed; the small model's near-ties flip either way).
    for name, floor in ref.floors.items():
        o = floor.overall
        assert o["positions"] == WINDOWS * (TOKENS - 1), name
        assert o["kld_mean"] >= 0 and o["kld_ci"][1] < kld.FAIL_KLD, (name, o)
    # a trained model on real code: perplexity is a meaningful number, far below the vocabulary's 49,152
    assert 1.5 < ref.floors["second_pass"].overall["ppl_ref"] < 30

    result = kldprobe.measure_candidate(s, ref, real_sglang_fp8.url)      # the session's FP8 E4M3 KV server
    floor = ref.floors[ref.floor_used]
    v = kld.judge(result, floor)
    o = result.overall
    # measurable, and by more than Q8_0 moves a model: the paired interval's lower bound (every window's excess over
    # the floor; 0.0086-0.0091 nats measured) clears PASS_KLD, so the verdict cannot be pass. PPL ratio and same
    # top-1 are reported, not gated: over 2 × 1,024 tokens their direction is noise's (CI once saw a PPL ratio of 0.99983).
    assert v.excess_ci[0] > kld.PASS_KLD, (o, v)
    assert o["ppl_ratio"] == pytest.approx(o["ppl_cand"] / o["ppl_ref"])
    assert [(b["from"], b["to"]) for b in result.by_depth] == [(1, 128), (128, 512), (512, 1024)]
    f = kldprobe.findings(ref, result, "KV cache dtype: auto vs fp8_e4m3")[1]
    assert f.status == v.status != "pass" and "fp8_e4m3" in f.title
    print(f"\nfloor {floor.overall['kld_mean']:.5f} {floor.overall['kld_ci']}, fp8 excess {v.excess_kld:.5f} {v.excess_ci}, "
          f"windows {result.sums['kld'].sum(axis=1) / result.sums['count'].sum(axis=1)}, ppl ratio {o['ppl_ratio']:.5f}, "
          f"same top-1 {o['same_top1']:.4f}")
