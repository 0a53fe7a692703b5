"""The K and V a decoder caches (accuracy/kvcapture, kvstats, kvscales, kvjob): statistics and storage-format errors
on hand-made arrays; the capture against a hand recomputation of layer 0's rotated K; the scales file through SGLang's
own schema and loader; one-line errors for every input the capture reads."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runbook.accuracy import kvcapture, kvquant, kvscales, kvstats
from runbook.core.errors import InputError

SERVING = os.environ.get("RUNBOOK_SERVING_PYTHON") or str(Path(__file__).resolve().parents[2] / ".venv-serving" / "bin" / "python")

# A random Llama with GQA (4 query heads on 2 KV heads) and a BPE tokenizer trained on the corpus: written by
# transformers in the serving interpreter.
_BUILD = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
job = json.loads(sys.argv[1])
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=job["vocab"], hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                  rope_theta=10000.0, tie_word_embeddings=True)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(job["dir"])
"""

# Layer 0's K by hand from the raw weights: embedding, RMSNorm, k_proj, then RoPE written out (rotate-half form,
# inv_freq = theta^(-2i/d)); float32, as the capture runs.
_MANUAL_K0 = """
import json, sys, numpy as np, torch
from safetensors.torch import load_file
job = json.loads(sys.argv[1])
cfg = json.load(open(job["dir"] + "/config.json"))
w = {k: v.float() for k, v in load_file(job["dir"] + "/model.safetensors").items()}
ids = torch.tensor(job["ids"])
x = w["model.embed_tokens.weight"][ids]
x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * w["model.layers.0.input_layernorm.weight"]
d, kvh = cfg["head_dim"], cfg["num_key_value_heads"]
k = (x @ w["model.layers.0.self_attn.k_proj.weight"].T).view(len(ids), kvh, d).transpose(0, 1)
theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg["rope_theta"]
inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
ang = torch.arange(len(ids), dtype=torch.float32)[:, None] * inv[None]
cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
rot = torch.cat([-k[..., d // 2:], k[..., :d // 2]], -1)
np.save(job["out"], np.stack([(k * cos + rot * sin).numpy(), k.numpy()]))   # after RoPE, before
"""


def _serving() -> str:
    if not (os.path.isfile(SERVING) and os.access(SERVING, os.X_OK)):
        pytest.fail(f"serving interpreter {SERVING} missing: `make serving-env` builds it")
    return SERVING


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory):
    from runbook.demo.llama import train_tokenizer

    d = tmp_path_factory.mktemp("tiny-decoder")
    tok = train_tokenizer(512)
    tok.save(str(d / "tokenizer.json"))
    subprocess.run([_serving(), "-c", _BUILD, json.dumps({"dir": str(d), "vocab": tok.get_vocab_size()})], check=True,
                   capture_output=True, timeout=300)
    return d


# ------------------------------------------------------------------ pure: statistics and formats on known arrays
def test_head_stats_and_clip_shares_per_head():
    x = np.zeros((1, 2, 4, 2), dtype=np.float32)
    x[0, 0] = [[1, -2], [3, 4], [500, 0], [0, 0]]          # head 0: one value beyond 448 of 8
    x[0, 1] = [[60000, 1], [0, 0], [0, 0], [0, 0]]        # head 1: one beyond 57,344 (and so beyond 448)
    s = kvstats.head_stats(x)
    assert s[0]["absmax"] == 500 and s[0]["e4m3_clip_share"] == 1 / 8 and s[0]["e5m2_clip_share"] == 0
    assert s[1]["e4m3_clip_share"] == 1 / 8 and s[1]["e5m2_clip_share"] == 1 / 8
    assert s[0]["p50"] == pytest.approx(1.5) and s[0]["p99"] <= s[0]["p99_9"] <= s[0]["absmax"]


def test_calibrated_scale_is_absmax_over_the_format_maximum():
    x = np.array([[[[-896.0, 1.0]]]], dtype=np.float32)
    assert kvstats.calibrated_scale(x, "fp8_e4m3") == pytest.approx(2.0)
    assert kvstats.calibrated_scale(x, "fp8_e5m2") == pytest.approx(896 / 57344)
    assert kvstats.calibrated_scale(np.zeros((1, 1, 1, 1)), "fp8_e4m3") > 0 and kvstats.calibrated_scale(x, "bf16") == 1.0


def test_grouped_queries_equal_attention_with_repeated_kv_heads():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((6, 2, 8)).astype(np.float32)           # 6 query heads, 2 positions
    k, v = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)     # 2 KV heads (transformers' repeat_kv: 0,0,0,1,1,1)
    rep = lambda x: np.repeat(x, 3, axis=0)                         # noqa: E731
    want = kvquant.attention(q, rep(k), rep(v))
    got = kvquant.attention(kvstats._grouped(q, 2), k, v).reshape(6, 2, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _arrays(rng, layers=2, w=2, kvh=2, heads=4, n=64, d=16, big=0.0):
    pos = kvstats.query_positions((32, 64))
    arrays = {}
    for i in range(layers):
        k = rng.standard_normal((w, kvh, n, d)).astype(np.float32) * 4
        k[:, :, :, 3] *= big if (big and i == 1) else 1.0      # layer 1: an outlier channel when big is set
        arrays[f"k{i}"], arrays[f"v{i}"] = k, rng.standard_normal((w, kvh, n, d)).astype(np.float32)
        arrays[f"q{i}"] = rng.standard_normal((w, heads, len(pos), d)).astype(np.float32)
    return arrays, pos


def test_attention_error_zero_when_unchanged_and_matches_kvquant_on_one_head():
    rng = np.random.default_rng(0)
    a, pos = _arrays(rng, layers=1, w=1, kvh=1, heads=1)
    k, v, q = a["k0"], a["v0"], a["q0"]
    assert kvstats.attn_errors(q, k, v, k, v, pos, (32, 64)) == {32: 0.0, 64: 0.0}
    kq = kvquant.quantize(k, "fp8_e4m3").x
    full_q = np.zeros((1, 64, 16), dtype=np.float32)     # kvquant.attn_error reads q at the same last 8 positions
    full_q[:, [p for p in pos]] = q[0]
    got = kvstats.attn_errors(q, k, v, kq, v, pos, (64,))[64]
    assert got == pytest.approx(kvquant.attn_error(full_q, k[0], v[0], kq[0], v[0], 64), rel=1e-6) and got > 0


def test_summarize_finds_the_clipping_layer_and_calibration_removes_it():
    arrays, pos = _arrays(np.random.default_rng(1), big=300.0)   # layer 1's channel 3 reaches ~ ±4000
    s = kvstats.summarize(arrays, {"layers": 2}, pos, (32, 64), "decoder (test)")
    clip = kvstats.clipping_layers(s["heads"])
    assert [r["clips_e4m3"] for r in clip] == [False, True] and not any(r["clips_e5m2"] for r in clip)
    rows = {(r["layer"], r["format"], r["scaling"]): r for r in s["rows"]}
    assert rows[(1, "fp8_e4m3", "scale1")]["clipped_frac"] > 0
    assert rows[(1, "fp8_e4m3", "per_tensor")]["attn_out_rel_err"] < rows[(1, "fp8_e4m3", "scale1")]["attn_out_rel_err"]
    assert rows[(0, "bf16", "none")]["k_rel_err"] < 0.004
    assert {g["length"] for g in s["growth"]} == {32, 64} and len(s["scales"]) == 2
    assert s["scales"][1]["k_e4m3"] > s["scales"][0]["k_e4m3"] * 50


def test_scales_are_calibrated_on_the_first_half_and_judged_on_the_second():
    arrays, pos = _arrays(np.random.default_rng(2), layers=1, w=2)
    arrays["k0"][1] *= 10                                    # the held-out window is 10x larger than the calibration one
    s = kvstats.summarize(arrays, {"layers": 1}, pos, (64,), "t")
    r = {(x["format"], x["scaling"]): x for x in s["rows"]}
    assert s["scales"][0]["k_e4m3"] == pytest.approx(np.abs(arrays["k0"][0]).max() / 448)
    assert r[("fp8_e4m3", "per_tensor")]["clipped_frac"] > 0.5    # the held-out window exceeds the calibrated range


def test_param_json_takes_the_larger_scale_per_layer_for_every_rank(tmp_path):
    scales = [{"layer": 0, "k_e4m3": 0.5, "v_e4m3": 0.01}, {"layer": 1, "k_e4m3": 0.02, "v_e4m3": 0.03}]
    doc = kvscales.param_json(scales, "llama", tp_size=2)
    assert doc == {"model_type": "llama", "kv_cache": {"dtype": "float8_e4m3fn",
                                                       "scaling_factor": {"0": {"0": 0.5, "1": 0.03}, "1": {"0": 0.5, "1": 0.03}}}}
    paths = kvscales.write(scales, "llama", tmp_path)
    from safetensors.numpy import load_file

    t = load_file(paths["checkpoint_tensors"])
    assert float(t["model.layers.0.self_attn.v_scale"]) == pytest.approx(0.01) and len(t) == 4
    assert json.loads(Path(paths["quantization_param_path"]).read_text())["kv_cache"]["scaling_factor"]["0"]["1"] == 0.03


# ------------------------------------------------------------------ hostile inputs: one line naming file and fix
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _tiny_files(tmp: Path) -> Path:
    """A checkpoint dir the checks read without running it: config, a valid one-tensor safetensors, tokenizer."""
    from safetensors.numpy import save_file

    d = tmp / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                               "hidden_size": 64, "max_position_embeddings": 256}))
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(d / "model.safetensors"))
    (d / "tokenizer.json").write_text("{}")
    return d


def test_a_complete_checkpoint_passes_the_checks(tmp_path):
    assert kvcapture.check_model(_tiny_files(tmp_path)).shards


def test_truncated_safetensors_names_the_file(tmp_path):
    d = _tiny_files(tmp_path)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-20])
    with pytest.raises(InputError) as e:
        kvcapture.check_model(d)
    msg = str(e.value)
    assert "\n" not in msg and "model.safetensors" in msg and "truncated" in msg and "Re-download" in msg


def test_config_without_layers_names_the_key(tmp_path):
    d = _tiny_files(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"config\.json: no 'num_hidden_layers' .*re-download config\.json"):
        kvcapture.check_model(d)


def test_no_weights_and_no_tokenizer_are_refused(tmp_path):
    d = _tiny_files(tmp_path)
    (d / "tokenizer.json").unlink()
    with pytest.raises(InputError, match=r"no tokenizer\.json; copy the model's tokenizer\.json"):
        kvcapture.check_model(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(InputError, match=r"no \*\.safetensors weights"):
        kvcapture.check_model(d)


def test_missing_model_dir(tmp_path):
    with pytest.raises(InputError, match="no such directory"):
        kvcapture.check_model(tmp_path / "nowhere")


def test_missing_serving_interpreter(tmp_path):
    with pytest.raises(InputError, match=r"serving interpreter .*: not there; build the serving environment"):
        kvcapture._run_job(str(tmp_path / "python"), {"out": str(tmp_path / "o.npz")}, 10)


@pytest.mark.serving
def test_an_interpreter_without_torch_is_one_line(tmp_path):
    py = tmp_path / "python"                  # the base interpreter without site-packages: no torch, no numpy
    py.write_text(f"#!/bin/sh\nexec {sys._base_executable} -S \"$@\"\n")
    py.chmod(0o755)
    d = _tiny_files(tmp_path)
    with pytest.raises(InputError) as e:
        kvcapture._run_job(str(py), {"model_dir": str(d), "windows": [[1]], "query_positions": [0],
                                     "out": str(tmp_path / "o.npz")}, 60)
    msg = str(e.value)
    assert "\n" not in msg and "cannot import" in msg and "needs torch" in msg and "make serving-env" in msg


# ------------------------------------------------------------------ the real capture on a tiny random decoder
@pytest.mark.serving
def test_captured_k_is_after_rope_and_equals_a_hand_recomputation(tiny_decoder, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNBOOK_CACHE", str(tmp_path / "cache"))
    ids = kvcapture.windows(tiny_decoder, 1, 96)[0]
    out = tmp_path / "cap.npz"
    kvcapture._run_job(_serving(), {"model_dir": str(tiny_decoder), "windows": [ids], "query_positions": [95],
                                    "out": str(out)}, 300)
    subprocess.run([_serving(), "-c", _MANUAL_K0, json.dumps({"dir": str(tiny_decoder), "ids": ids,
                                                              "out": str(tmp_path / "k0.npy")})], check=True, timeout=300)
    with np.load(out, allow_pickle=False) as z:
        k0, v0, q0 = z["k0"][0], z["v0"], z["q0"]
    manual, before = np.load(tmp_path / "k0.npy")
    assert k0.shape == (2, 96, 32) and v0.shape == (1, 2, 96, 32) and q0.shape == (1, 4, 1, 32)
    np.testing.assert_allclose(k0, manual, rtol=1e-3, atol=1e-4)   # float32, other op order
    np.testing.assert_allclose(k0[:, 0], before[:, 0], rtol=1e-3, atol=1e-4)   # position 0: RoPE is the identity
    assert np.abs(k0[:, 1:] - before[:, 1:]).max() > 1e-2                       # later positions: rotated, not raw k_proj


@pytest.mark.serving
def test_capture_summary_is_cached_by_model_and_corpus(tiny_decoder, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNBOOK_CACHE", str(tmp_path / "cache"))
    first = kvcapture.capture(tiny_decoder, _serving(), n=2, tokens=128, lengths=(64, 128))
    assert not first.cached and first.meta["capture_s"] > 0 and first.meta["layers"] == 3
    assert {r["layer"] for r in first.summary["heads"]} == {0, 1, 2} and len(first.summary["scales"]) == 3
    again = kvcapture.capture(tiny_decoder, _serving(), n=2, tokens=128, lengths=(64, 128))
    assert again.cached and again.summary == first.summary and again.model_sha256 == first.model_sha256
    moved = _copy(tiny_decoder, tmp_path / "changed")
    cfg = json.loads((moved / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5                 # a different model: a different key, captured afresh
    (moved / "config.json").write_text(json.dumps(cfg))
    assert not kvcapture.capture(moved, _serving(), n=2, tokens=128, lengths=(64, 128)).cached


@pytest.mark.serving
def test_sglang_reads_the_scales_file_with_its_own_schema_and_loader(tmp_path):
    """Differential: SGLang 0.5.23's kv_cache_scales_loader (what --quantization-param-path runs) returns our factors."""
    scales = [{"layer": i, "k_e4m3": 0.01 * (i + 1), "v_e4m3": 0.015 * (i + 1)} for i in range(3)]
    p = kvscales.write(scales, "llama", tmp_path)["quantization_param_path"]
    code = ("import json, sys\nfrom sglang.srt.model_loader.weight_utils import kv_cache_scales_loader\n"
            "print(json.dumps(sorted(kv_cache_scales_loader(sys.argv[1], 0, 1, 3, 'llama'))))")
    cp = subprocess.run([_serving(), "-c", code, p], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    got = json.loads(cp.stdout.strip().splitlines()[-1])
    assert got == [[0, 0.015], [1, 0.03], [2, pytest.approx(0.045)]]
    # and a file for another layer count is refused by SGLang (its loader then falls back to 1.0: an empty list)
    cp = subprocess.run([_serving(), "-c", code.replace(", 3, 'llama'", ", 4, 'llama'"), p], capture_output=True, text=True,
                        timeout=300)
    assert json.loads(cp.stdout.strip().splitlines()[-1]) == []


# ------------------------------------------------------------------ the study's source and its findings
def test_the_default_deployment_falls_back_to_minilm_and_says_why(tmp_path):
    from runbook.accuracy import kvstudy
    from runbook.core import spec as specmod

    c = kvstudy.choose(specmod.load(), None)
    assert c.model_dir is None and not c.explicit and "not a checkpoint on this machine" in c.why


def test_a_deployment_model_too_large_for_cpu_is_not_captured_unasked(tmp_path, monkeypatch):
    from runbook.accuracy import kvstudy
    from runbook.core import spec as specmod

    d = _tiny_files(tmp_path)
    base = specmod.load("deployments/tiny-llama-sglang-cpu.yaml")
    dep = base.model_copy(update={"model": base.model.model_copy(update={"path": str(d)}),   # an interpreter named, not run
                                  "serving": base.serving.model_copy(update={"python": sys.executable})})
    monkeypatch.setattr(kvcapture, "MAX_AUTO_BYTES", 16)
    c = kvstudy.choose(dep, None)
    assert c.model_dir is None and "more than the" in c.why and "set kv_model" in c.why
    monkeypatch.setattr(kvcapture, "MAX_AUTO_BYTES", 1 << 30)
    c = kvstudy.choose(dep, None)
    assert c.model_dir == str(d) and c.python == sys.executable and not c.explicit


def test_kv_model_named_but_broken_is_the_stages_input_error(tmp_path, cli):
    r = cli("accuracy", "kvquant", "--kv-model", str(tmp_path / "absent"))
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert "absent" in line and "no such directory" in line


def test_clipping_finding_warns_only_for_this_deployments_fp8_at_scale_one():
    from runbook.accuracy import kvstudy

    layers = [{"layer": 0, "k_absmax": 10.0, "v_absmax": 1.0, "k_e4m3_clip_share": 0.0, "v_e4m3_clip_share": 0.0,
               "clips_e4m3": False, "clips_e5m2": False},
              {"layer": 1, "k_absmax": 900.0, "v_absmax": 1.0, "k_e4m3_clip_share": 0.01, "v_e4m3_clip_share": 0.0,
               "clips_e4m3": True, "clips_e5m2": False}]
    f = kvstudy.clipping_finding(layers, ("fp8_e4m3", "scale1"), "m")
    assert f.status == "warn" and f.title.startswith("FP8 E4M3 at scale 1.0 clips in 1 of 2 layers") and "[1]" in f.detail
    assert kvstudy.clipping_finding(layers, ("bf16", "none"), "m").status == "info"
    assert kvstudy.clipping_finding(layers, ("fp8_e4m3", "per_tensor"), "m").status == "info"
    assert "no layer" in kvstudy.clipping_finding(layers[:1], ("fp8_e4m3", "scale1"), "m").title


@pytest.mark.serving
def test_the_study_on_a_decoder_reports_its_source_layers_and_scale_files(tiny_decoder, tmp_path, monkeypatch):
    from runbook.accuracy import kvstudy
    from runbook.accuracy.settings import AccuracySettings

    monkeypatch.setenv("RUNBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RUNBOOK_SERVING_PYTHON", _serving())
    monkeypatch.setattr(kvcapture, "WINDOW_TOKENS", 128)
    monkeypatch.setattr(kvcapture, "capture", lambda d, py, **kw: _small_capture(d, py))
    st = kvstudy.study(None, AccuracySettings(probe="kvquant", kv_model=str(tiny_decoder), out=str(tmp_path / "out")),
                       ("fp8_e4m3", "scale1"))
    ids = [f.id for f in st.findings]
    assert ids[:3] == ["accuracy.kvquant.source", "accuracy.kvquant.clipping", "accuracy.kvquant.scales"]
    assert "accuracy.kvquant.fp8_e4m3.scale1.decoder" in ids
    d = st.to_json()
    assert d["kind"] == "decoder" and len(d["layers"]) == 3 and d["capture"]["layers"] == 3
    assert Path(d["scale_files"]["quantization_param_path"]).parent == tmp_path / "out" / "kv_scales"
    assert json.loads(Path(d["scale_files"]["quantization_param_path"]).read_text())["kv_cache"]["dtype"] == "float8_e4m3fn"


_REAL_CAPTURE = kvcapture.capture


def _small_capture(d, py):
    return _REAL_CAPTURE(d, py, n=2, tokens=128, lengths=(64, 128))


@pytest.mark.sglang
def test_sglang_on_cpu_refuses_scales_it_cannot_apply(real_model, tmp_path):
    """Differential, on the real server: SGLang 0.5.23 on CPU (--model-impl transformers) stops at start-up when given
    the scales file (load_model_utils.py:131-135), so an FP8 KV cache on CPU is always scale 1.0 (docs/accuracy.md)."""
    from runbook.core import ports
    from runbook.demo import realmodel, sglang

    scales = [{"layer": i, "k_e4m3": 0.04, "v_e4m3": 0.02} for i in range(30)]
    p = kvscales.write(scales, "llama", tmp_path)["quantization_param_path"]
    dep = sglang.deployment(ports.free_port(), source=realmodel.spec_path(),
                            flags={"kv-cache-dtype": "fp8_e4m3", "quantization-param-path": p})
    srv = sglang.launch(dep, log_path=tmp_path / "server.log")
    try:
        with pytest.raises(sglang.EngineError):
            sglang.wait_ready(srv, 300)
    finally:
        srv.stop()
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "does not support loading scaling factors" in log and "TransformersForCausalLM" in log


@pytest.mark.serving
def test_the_real_models_spec_measures_its_own_cache(real_model):
    """The smollm2 deployment's stage 50 captures the model it serves (cached under .cache/kvvalues after a first run)."""
    from runbook.accuracy import kvstudy
    from runbook.accuracy.settings import AccuracySettings
    from runbook.core import spec as specmod
    from runbook.demo import realmodel

    dep = specmod.load(realmodel.spec_path())
    st = kvstudy.study(dep, AccuracySettings.resolve(dep, None), ("fp8_e4m3", "scale1"))
    d = st.to_json()
    assert d["kind"] == "decoder" and "the deployment's model" in st.findings[0].title
    cap = d["capture"]
    assert (cap["layers"], cap["kv_heads"], cap["heads"], cap["head_dim"]) == (30, 3, 9, 64) and len(d["heads"]) == 180
    rows = {(r["layer"], r["format"], r["scaling"]): r for r in d["rows"]}
    assert all(rows[(i, "bf16", "none")]["k_rel_err"] < 0.004 for i in range(30))
    assert all(0.01 < rows[(i, "fp8_e4m3", "scale1")]["k_rel_err"] < 0.05 for i in range(30))   # 3 mantissa bits
    assert all(s["k_e4m3"] > 0 and s["v_e4m3"] > 0 for s in d["scales"])


def test_a_deployment_model_that_cannot_be_captured_falls_back_to_minilm_with_a_warn(tmp_path, monkeypatch):
    from runbook.accuracy import kvstudy
    from runbook.accuracy.settings import AccuracySettings
    from runbook.core import spec as specmod

    d = _tiny_files(tmp_path)                 # its tokenizer.json ("{}") is no tokenizer: the capture stops there
    base = specmod.load("deployments/tiny-llama-sglang-cpu.yaml")
    dep = base.model_copy(update={"model": base.model.model_copy(update={"path": str(d)}),
                                  "serving": base.serving.model_copy(update={"python": sys.executable})})
    monkeypatch.setenv("RUNBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kvquant, "run", lambda *a, **kw: kvquant.Study(source="minilm (stub)"))   # MiniLM itself is not under test
    st = kvstudy.study(dep, AccuracySettings(probe="kvquant"), ("bf16", "none"))
    f = st.findings[0]
    assert st.kind == "minilm" and f.id == "accuracy.kvquant.source" and f.status == "warn"
    assert "could not be captured" in f.detail and "tokenizer.json" in f.detail and "\n" not in f.detail
    with pytest.raises(InputError, match="tokenizer.json"):      # named by kv_model, the same fault is the stage's error
        kvstudy.study(dep, AccuracySettings(probe="kvquant", kv_model=str(d)), ("bf16", "none"))
