import numpy as np
import pytest

from runbook.accuracy import kvquant, minilm


def test_e4m3_clips_above_448_at_scale_one():
    q = kvquant.quantize(np.array([500.0, -1000.0, 3.0], dtype=np.float32), "fp8_e4m3", 1.0)
    assert q.x.tolist() == [448.0, -448.0, 3.0]
    assert q.clipped_frac == pytest.approx(2 / 3)


def test_e5m2_keeps_range_but_loses_mantissa():
    x = np.array([500.0, 1000.0, 3.3], dtype=np.float32)
    q = kvquant.quantize(x, "fp8_e5m2", 1.0)
    assert q.clipped_frac == 0.0
    assert q.x.tolist() == [512.0, 1024.0, 3.5]      # 2 mantissa bits: steps of 1/4 of the power of two
    assert np.max(np.abs(q.x - x) / np.abs(x)) <= 0.125


def test_bf16_error_under_0_4_percent():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 10
    q = kvquant.quantize(x, "bf16")
    assert kvquant.rel_err(q.x, x) < 0.004 and q.clipped_frac == 0


def test_calibrated_scale_removes_clipping_and_tiny_values_flush():
    x = np.array([[[900.0, 1.0, -450.0]]], dtype=np.float32)
    s = kvquant.scale_for(x, "fp8_e4m3", "per_tensor")
    assert s == pytest.approx(900 / 448)
    assert kvquant.quantize(x, "fp8_e4m3", s).clipped_frac == 0.0
    tiny = kvquant.quantize(np.array([1e-12, 1.0], dtype=np.float32), "fp8_e4m3", 1.0)
    assert tiny.flushed_frac == 0.5
    ph = kvquant.scale_for(np.stack([x[0], x[0] / 10]), "fp8_e4m3", "per_head")
    assert ph.shape == (2, 1, 1) and ph[1, 0, 0] == pytest.approx(90 / 448)


def test_attention_error_zero_for_exact_inputs_and_grows_with_noise():
    q, k, v = kvquant.synthetic(seq=256, dim=32)
    assert kvquant.attn_error(q, k, v, k, v, 256) == 0.0
    kq = kvquant.quantize(k, "fp8_e4m3", 1.0).x
    assert kvquant.attn_error(q, k, v, kq, v, 256) > 0


@pytest.mark.slow  # a real model forward pass
def test_real_minilm_activations():
    acts = minilm.activations("def f(x):\n    return x + 1\n" * 20, max_tokens=128)
    assert len(acts) == 6
    a = acts[0]
    assert a.k.shape == (12, 128, 32) and a.v.shape == a.k.shape and np.isfinite(a.k).all()
    assert 0.5 < np.abs(a.k).max() < 100


@pytest.mark.slow  # the study over a real model
def test_study_rows_keys_and_findings_target_the_deployment():
    st = kvquant.run(real_lengths=(64, 128), synth_lengths=(256, 512), active=("fp8_e4m3", "scale1"),
                     text="class A:\n    def b(self):\n        return 42\n" * 30)
    for r in st.rows:
        for k in ("format", "scaling", "layer", "k_rel_err", "v_rel_err", "clipped_frac", "attn_out_rel_err"):
            assert k in r
    f = {x.id: x for x in st.findings}
    assert f["accuracy.kvquant.fp8_e4m3.scale1.minilm"].title.startswith("this deployment: FP8 E4M3, scale 1.0:")
    assert f["accuracy.kvquant.fp8_e4m3.scale1.minilm"].status in ("warn", "fail")
    assert f["accuracy.kvquant.bf16.none.minilm"].status == "info"       # not this deployment's format
    assert f["accuracy.kvquant.fp8_e4m3.scale1.synthetic"].status in ("pass", "warn")   # synthetic never fails
    assert {g["length"] for g in st.growth if g["source"].startswith("synthetic")} == {256, 512}


def test_active_format_mapping():
    assert kvquant.active_format("bfloat16") == ("bf16", "none")
    assert kvquant.active_format("fp8_e4m3", "none") == ("fp8_e4m3", "scale1")
    assert kvquant.active_format("fp8_e4m3", "all") == ("fp8_e4m3", "per_tensor")
