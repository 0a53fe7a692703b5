import json
import os

import pytest
from ckpt_factory import attn_layer, linear_tensors, llama_config, make, qwen35_config
from conftest import REPO

from runbook import quant
from runbook.core import spec
from runbook.core.errors import InputError
from runbook.core.registry import document
from runbook.model import checkpoint

FIX = REPO / "tests" / "fixtures"
MODELOPT_NVFP4 = {"producer": {"name": "modelopt", "version": "0.35.0"},
                  "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                                   "exclude_modules": ["lm_head", "*.linear_attn*", "model.layers.3.self_attn*", "model.visual*"]}}
MODELOPT_FP8 = {"producer": {"name": "modelopt", "version": "0.23.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}


def ids(rep):
    return {f.id: f for f in rep.findings}


def run(d, flags=None, tp=1):
    return quant.inspect_checkpoint(checkpoint.load(d), flags or {}, tp=tp)


def qwen_shards(scales_on=(), fmt="nvfp4", layers=8, base="model.language_model.layers"):
    t = {}
    for i in range(layers):
        if (i + 1) % 4 == 0:
            t.update(attn_layer(i, "bf16", base))
            if i in scales_on:
                t[f"{base}.{i}.self_attn.k_proj.k_scale"] = ("F32", [])
                t[f"{base}.{i}.self_attn.v_proj.v_scale"] = ("F32", [])
        else:
            t[f"{base}.{i}.linear_attn.in_proj_qkvz.weight"] = ("BF16", [64, 64])
        t.update(linear_tensors(f"{base}.{i}.mlp.experts.0.up_proj", fmt))
    t["mtp.layers.0.self_attn.k_proj.k_scale"] = ("F32", [])  # draft layer: must not count
    half = len(t) // 2
    items = list(t.items())
    return [dict(items[:half]), dict(items[half:])]


def test_story_case_fp8_declared_no_scales(tmp_path):
    d = make(tmp_path / "ck", qwen35_config(), qwen_shards(), hf_quant_config=MODELOPT_NVFP4)
    rep = run(d, {"quantization": "modelopt_fp4"}, tp=8)
    j = document(rep)
    assert j["weights"]["algo"] == "NVFP4" and j["weights"]["producer"] == "modelopt" and j["weights"]["group_size"] == 16
    assert j["weights"]["total_bytes"] == sum(os.path.getsize(p) for p in d.glob("*.safetensors")) - sum(
        8 + checkpoint.read_header(p).header_len for p in d.glob("*.safetensors"))
    assert j["weights"]["bytes_per_gpu"] == j["weights"]["total_bytes"] // 8
    kv = j["kv_cache"]
    assert kv["declared"] == "FP8" and kv["auto_resolves_to"] == "fp8_e4m3"
    assert kv["kv_layers"] == 2 and kv["layers_with_scales"] == 0 and kv["scale_tensor_names"] == []
    assert j["recommended_flags"] == {"quantization": "modelopt_fp4", "kv-cache-dtype": "bf16"}
    f = ids(rep)
    assert f["quant.kv.fp8_scales"].status == "fail" and "uses 1.0 on all 2 KV layers" in f["quant.kv.fp8_scales"].title
    assert "--kv-cache-dtype bf16" in f["quant.kv.fp8_scales"].remedy and "--quantization-param-path" in f["quant.kv.fp8_scales"].remedy
    assert f["quant.recommend"].status == "warn" and f["quant.flag"].status == "pass"
    assert f["quant.ckpt.dtypes"].status == "pass"
    assert {"lm_head", "linear attention", "attention", "vision tower"} <= set(j["weights"]["kept_precision_kinds"])
    assert "quant.kv.log_warning" not in f  # auto never logs the "no scaling factors" line
    assert [x["id"] for x in j["findings"]] == [x.id for x in rep.findings]


def test_story_fix_bf16_passes(tmp_path):
    d = make(tmp_path / "ck", qwen35_config(), qwen_shards(), hf_quant_config=MODELOPT_NVFP4)
    rep = run(d, {"kv-cache-dtype": "bf16"})
    assert rep.kv_cache.effective == "bfloat16"
    assert ids(rep)["quant.kv.fp8_scales"].status == "pass" and "overrides the checkpoint's FP8" in ids(rep)["quant.kv.fp8_scales"].title


def test_hybrid_only_full_attention_layers_need_scales(tmp_path):
    d = make(tmp_path / "ck", qwen35_config(), qwen_shards(scales_on=(3, 7)), hf_quant_config=MODELOPT_NVFP4)
    j = document(run(d))
    assert j["kv_cache"]["kv_layers"] == 2 and j["kv_cache"]["layers_with_scales"] == 2
    assert j["kv_cache"]["scale_coverage"] == "all"
    assert j["kv_cache"]["scale_tensor_names"][0] == "model.language_model.layers.3.self_attn.k_proj.k_scale"
    assert not any(n.startswith("mtp.") for n in j["kv_cache"]["scale_tensor_names"])
    assert ids(run(d))["quant.kv.fp8_scales"].status == "warn"
    assert j["recommended_flags"]["kv-cache-dtype"] == "auto"


def _fp8_llama(tmp_path, scale_layers, name="ck", style="modelopt"):
    shard = {}
    for i in range(4):
        shard.update(attn_layer(i, "fp8"))
        if i in scale_layers:
            if style == "modelopt":
                shard[f"model.layers.{i}.self_attn.k_proj.k_scale"] = ("F32", [])
                shard[f"model.layers.{i}.self_attn.v_proj.v_scale"] = ("F32", [])
            elif style == "deprecated":
                shard[f"model.layers.{i}.self_attn.kv_scale"] = ("F32", [])
            elif style == "quark":
                shard[f"model.layers.{i}.self_attn.k_proj.output_scale"] = ("F32", [])
                shard[f"model.layers.{i}.self_attn.v_proj.output_scale"] = ("F32", [])
            elif style == "llmcompressor":
                shard[f"model.layers.{i}.self_attn.k_scale"] = ("F32", [])
                shard[f"model.layers.{i}.self_attn.v_scale"] = ("F32", [])
    return make(tmp_path / name, llama_config(), [shard], hf_quant_config=MODELOPT_FP8)


def test_scales_on_every_kv_layer_is_a_warn(tmp_path):
    rep = run(_fp8_llama(tmp_path, range(4)), tp=2)
    j = document(rep)
    assert j["weights"]["algo"] == "FP8" and j["weights"]["producer"] == "modelopt"
    assert j["kv_cache"]["layers_with_scales"] == 4 == j["kv_cache"]["kv_layers"]
    assert len(j["kv_cache"]["scale_tensor_names"]) == 4
    f = ids(rep)["quant.kv.fp8_scales"]
    assert f.status == "warn" and "all 4 KV layers" in f.title and "accuracy" in f.detail
    assert j["recommended_flags"] == {"quantization": "modelopt_fp8", "kv-cache-dtype": "auto"}


def test_scales_on_some_layers_is_a_fail(tmp_path):
    rep = run(_fp8_llama(tmp_path, (0, 1)))
    assert rep.kv_cache.layers_with_scales == 2 and rep.kv_cache.scale_coverage == "some"
    f = ids(rep)["quant.kv.fp8_scales"]
    assert f.status == "fail" and "only 2 of 4" in f.title and "other 2 use 1.0" in f.title
    assert rep.recommended_flags["kv-cache-dtype"] == "bf16"


@pytest.mark.parametrize("style", ["deprecated", "quark", "llmcompressor"])
def test_other_scale_names_sglang_accepts(tmp_path, style):
    rep = run(_fp8_llama(tmp_path, range(4), style=style))
    assert rep.kv_cache.layers_with_scales == 4 and ids(rep)["quant.kv.fp8_scales"].status == "warn"


def test_explicit_fp8_flag_calls_out_the_log_line(tmp_path):
    rep = run(_fp8_llama(tmp_path, range(4)), {"kv-cache-dtype": "fp8_e4m3"})
    f = ids(rep)["quant.kv.log_warning"]
    assert "Using FP8 KV cache but no scaling factors provided" in f.title and "misleading" in f.detail
    rep = run(_fp8_llama(tmp_path, range(4), name="ck2"), {"kv-cache-dtype": "fp8_e4m3", "quantization-param-path": "/x.json"})
    assert "quant.kv.log_warning" not in ids(rep) and rep.kv_cache.scale_coverage == "file"
    assert run(_fp8_llama(tmp_path, (), name="ck3"), {"kv-cache-dtype": "fp8_e5m2"}).kv_cache.effective == "fp8_e5m2"


def test_compressed_tensors_kv_scheme(tmp_path):
    q = {"quant_method": "compressed-tensors", "format": "float-quantized", "version": "0.9.0",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
         "ignore": ["lm_head"], "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor", "dynamic": False,
                                                    "symmetric": True}}
    shard = {k: v for i in range(4) for k, v in attn_layer(i, "fp8").items()}
    shard.update({f"model.layers.{i}.self_attn.{s}": ("F32", []) for i in range(4) for s in ("k_scale", "v_scale")})
    rep = run(make(tmp_path / "ct", llama_config(quant=q), [shard]))
    assert rep.weights.algo == "FP8" and rep.weights.quant_method == "compressed-tensors"
    assert rep.kv_cache.auto_resolves_to == "fp8_e4m3" and rep.kv_cache.layers_with_scales == 4
    assert rep.recommended_flags["quantization"] == "compressed-tensors"
    q["kv_cache_scheme"]["dynamic"] = True  # SGLang ignores a dynamic scheme
    rep = run(make(tmp_path / "ct2", llama_config(quant=q), [shard]))
    assert rep.kv_cache.declared == "FP8" and rep.kv_cache.auto_resolves_to == "bfloat16"
    assert "ignores it" in ids(rep)["quant.kv.auto"].detail


@pytest.mark.parametrize("fixture, algo, group, block, method", [
    ("fp8block_qwen3-8b-fp8.config.json", "FP8-block", None, [128, 128], "fp8"),
    ("fp8block_kimi-k2-instruct.config.json", "FP8-block", None, [128, 128], "fp8"),
    ("mxfp4_gpt-oss-120b.config.json", "MXFP4", 32, None, "mxfp4"),
    ("gptq_llama-2-13b-chat.config.json", "GPTQ 4-bit", 128, None, "gptq"),
    ("compressed-tensors_llama4-fp8-dynamic.config.json", "FP8", None, None, "compressed-tensors"),
    ("fbgemm-fp8_llama-3.1-405b-instruct-fp8.config.json", "FP8", None, None, "fbgemm_fp8"),
])
def test_real_quant_configs(tmp_path, fixture, algo, group, block, method):
    cfg = json.loads((FIX / "quant-examples" / fixture).read_text())
    rep = run(make(tmp_path / "ck", cfg))
    assert (rep.weights.algo, rep.weights.group_size, rep.weights.block_size, rep.weights.quant_method) == (algo, group, block, method)
    assert rep.kv_cache.auto_resolves_to == cfg.get("torch_dtype", "bfloat16") and rep.kv_cache.declared is None
    assert ids(rep)["quant.weight_bytes"].status == "skip"
    assert rep.recommended_flags["kv-cache-dtype"] == "auto"


def test_awq_excerpt_and_gptq_side_file(tmp_path):
    awq = json.loads((FIX / "quant-examples" / "awq_zephyr-7B-alpha-AWQ.quantization_config.excerpt.json").read_text())
    rep = run(make(tmp_path / "awq", llama_config(quant=awq["quantization_config"]), [attn_layer(0, "awq")]))
    assert rep.weights.algo == "AWQ 4-bit" and rep.weights.group_size == 128 and rep.recommended_flags["quantization"] == "awq_marlin"
    assert ids(rep)["quant.ckpt.dtypes"].status == "pass"
    side = json.loads((FIX / "quant-examples" / "gptq_genz-70b-3bit.quantize_config.json").read_text())
    rep = run(make(tmp_path / "gptq", llama_config(), files={"quantize_config.json": side}))
    assert (rep.weights.algo, rep.weights.group_size, rep.weights.source) == ("GPTQ 3-bit", -1, "quantize_config.json")


def test_real_model_cards(tmp_path):
    rep = quant.inspect_checkpoint(checkpoint.load(FIX / "models" / "llama-3.1-70b-instruct-fp8"), tp=8)
    kv = rep.kv_cache
    assert (rep.weights.algo, kv.declared, kv.auto_resolves_to, kv.kv_layers) == ("FP8", "FP8", "fp8_e4m3", 80)
    assert rep.kv_cache.layers_with_scales is None and ids(rep)["quant.kv.fp8_scales"].status == "warn"
    rep = quant.inspect_checkpoint(checkpoint.load(FIX / "models" / "qwen3.5-397b-a17b-nvfp4"))
    assert (rep.weights.algo, rep.weights.group_size, rep.weights.source) == ("NVFP4", 16, "config.json")
    assert rep.kv_cache.auto_resolves_to == "fp8_e4m3" and rep.kv_cache.kv_layers == 15
    assert "quant.files_disagree" not in ids(rep)
    rep = quant.inspect_checkpoint(checkpoint.load(FIX / "models" / "deepseek-v3"))
    assert rep.weights.algo == "FP8-block" and rep.kv_cache.kv_layers == 61
    rep = quant.inspect_checkpoint(checkpoint.load(FIX / "models" / "llama-3.1-70b"))
    assert rep.weights.algo == "unquantized" and rep.recommended_flags == {"kv-cache-dtype": "auto"}


def test_unquantized_single_file_checkpoint_sums_headers(tmp_path):
    d = make(tmp_path / "ck", llama_config(), [attn_layer(0, "bf16")], index=False)
    rep = run(d, tp=2)
    assert rep.weights.total_bytes == 4 * 64 * 64 * 2 + 64 * 2 and rep.weights.bytes_per_gpu == rep.weights.total_bytes // 2
    assert rep.kv_cache.effective == "bfloat16" and ids(rep)["quant.kv.fp8_scales"].status == "pass"


def test_default_deployment_inspects_its_model_card():
    rep = quant.assess(spec.load())
    f = ids(rep)
    assert f["quant.source"].status == "info" and rep.kv_cache.flag == "bf16"
    assert f["quant.kv.fp8_scales"].status == "pass" and f["quant.weight_bytes"].status == "skip"


# ---- bad input -------------------------------------------------------------------------------

def test_missing_shard_and_index_mismatch(tmp_path):
    d = make(tmp_path / "ck", llama_config(), [attn_layer(0, "bf16"), attn_layer(1, "bf16")])
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.9.self_attn.q_proj.weight"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    (d / "model-00002-of-00002.safetensors").unlink()
    ck = checkpoint.load(d)
    f = {x.id: x for x in ck.problems}
    assert f["quant.ckpt.missing_shards"].status == "fail" and "model-00002-of-00002.safetensors" in f["quant.ckpt.missing_shards"].evidence
    assert f["quant.ckpt.index_mismatch"].status == "fail" and "model.layers.9" in f["quant.ckpt.index_mismatch"].evidence
    assert not ck.complete


def test_truncated_shard(tmp_path):
    d = make(tmp_path / "ck", llama_config(), [attn_layer(0, "bf16")])
    p = next(d.glob("*.safetensors"))
    os.truncate(p, p.stat().st_size - 100)
    f = {x.id: x for x in checkpoint.load(d).problems}
    assert f["quant.ckpt.truncated"].status == "fail" and "needs" in f["quant.ckpt.truncated"].detail


@pytest.mark.parametrize("content, message", [
    ((10**6).to_bytes(8, "little") + b"{}", "header length 1000000 is larger than the file"),
    ((8).to_bytes(8, "little") + b"notjson!", "header is not JSON"),
    (b"abc", "too short for a safetensors header"),
])
def test_bad_headers_are_findings_naming_the_file(tmp_path, content, message):
    d = make(tmp_path / "ck", llama_config(), [attn_layer(0, "bf16")], index=False)
    (d / "model.safetensors").write_bytes(content)
    ck = checkpoint.load(d)
    f = ck.problems[0]
    assert f.id == "quant.ckpt.shard_header" and f.status == "fail" and "model.safetensors" in f.title and message in f.detail
    assert not ck.complete


def test_bad_directories_and_json(tmp_path):
    with pytest.raises(InputError, match="no such directory"):
        checkpoint.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a checkpoint: no config.json"):
        checkpoint.load(tmp_path / "empty")
    d = make(tmp_path / "ck", llama_config())
    (d / "config.json").write_text("{bad json")
    with pytest.raises(InputError, match=r"config.json: invalid JSON at line 1 column 2"):
        checkpoint.load(d)
    d = make(tmp_path / "ck2", llama_config())
    (d / "hf_quant_config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="hf_quant_config.json: expected a JSON object"):
        checkpoint.load(d)
    d = make(tmp_path / "ck3", {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4})
    with pytest.raises(InputError, match="'num_hidden_layers' must be a positive integer"):
        run(d)


def test_unknown_quant_method_and_contradicting_dtypes(tmp_path):
    rep = run(make(tmp_path / "ck", llama_config(quant={"quant_method": "bitsandbytes_nf5"}), [attn_layer(0, "bf16")]))
    f = ids(rep)["quant.unknown_method"]
    assert f.status == "warn" and "'bitsandbytes_nf5'" in f.title and "config.json" in f.title
    rep = run(make(tmp_path / "ck2", llama_config(), [attn_layer(0, "bf16")], hf_quant_config=MODELOPT_FP8))
    assert ids(rep)["quant.ckpt.dtypes"].status == "fail" and "no F8_E4M3 tensors" in ids(rep)["quant.ckpt.dtypes"].title


def test_cli_quant_json_keys(tmp_path, cli):
    d = make(tmp_path / "ck", qwen35_config(), qwen_shards(), hf_quant_config=MODELOPT_NVFP4)
    cp = cli("quant", d, "--json")
    assert cp.returncode == 1, cp.stderr  # the story's fail finding
    j = json.loads(cp.stdout)
    for k in ("algo", "producer", "group_size", "total_bytes", "bytes_per_gpu"):
        assert k in j["weights"]
    for k in ("declared", "auto_resolves_to", "kv_layers", "layers_with_scales", "scale_tensor_names"):
        assert k in j["kv_cache"]
    assert j["recommended_flags"]["kv-cache-dtype"] == "bf16" and isinstance(j["findings"], list)
    cp = cli("quant", tmp_path / "missing")
    assert cp.returncode == 2 and "no such directory" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1


def test_hf_repo_id_resolves_offline_to_the_cached_snapshot(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-fp8" / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    make(snap, llama_config(), [attn_layer(0, "fp8")], hf_quant_config=MODELOPT_FP8)
    (cache / "models--acme--tiny-fp8" / "refs").mkdir(parents=True)
    (cache / "models--acme--tiny-fp8" / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))  # read at import time; the env var alone is too late
    ck = checkpoint.load("acme/tiny-fp8")
    assert ck.dir == snap and quant.inspect_checkpoint(ck).weights.algo == "FP8"
    with pytest.raises(InputError, match="no Hugging Face snapshot of it is cached"):
        checkpoint.load("acme/not-downloaded")


# ---- rules that follow SGLang's own code (cross-checked in test_quant_vs_sglang.py) ----------------

def test_sglang_refusals_are_fail_findings_with_a_fix(tmp_path):
    cfg = json.loads((FIX / "quant-examples" / "fbgemm-fp8_llama-3.1-405b-instruct-fp8.config.json").read_text())
    rep = run(make(tmp_path / "fb", cfg))
    f = ids(rep)["quant.refused"]
    assert f.status == "fail" and "Unknown quantization method: fbgemm_fp8" in f.title and "fbgemm_fp8 loader" in f.remedy
    assert "quantization" not in rep.recommended_flags
    cfg = json.loads((FIX / "quant-examples" / "gptq_genz-70b-3bit.config.json").read_text())
    rep = run(make(tmp_path / "g3", cfg))
    assert ids(rep)["quant.refused"].status == "fail" and "quantization" not in rep.recommended_flags
    rep = run(make(tmp_path / "g3b", cfg), {"quantization": "gptq_marlin"})
    f = ids(rep)["quant.refused"]
    assert f.status == "fail" and "does not match" in f.title


def test_flag_mismatch_is_a_fail_and_modelopt_mixed_without_nvfp4_is_w4afp8(tmp_path):
    hq = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION",
                                                              "quantized_layers": {"model.layers.0.mlp": {"quant_algo": "W4A8_AWQ"}}}}
    rep = run(make(tmp_path / "mx", llama_config(), hf_quant_config=hq))
    assert rep.recommended_flags["quantization"] == "w4afp8" and rep.kv_cache.auto_resolves_to == "bfloat16"
    rep = run(make(tmp_path / "mx2", llama_config(), hf_quant_config=hq), {"quantization": "modelopt_mixed"})
    f = ids(rep)["quant.flag"]
    assert f.status == "fail" and "(w4afp8) does not match" in f.detail and "--quantization w4afp8" in f.remedy
    hq["quantization"]["quantized_layers"]["model.layers.1.mlp"] = {"quant_algo": "NVFP4", "group_size": 16}
    assert run(make(tmp_path / "mx3", llama_config(), hf_quant_config=hq)).recommended_flags["quantization"] == "modelopt_mixed"


def test_flat_modelopt_kv_scheme_string(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "check_config", lambda *a: None)  # checkpoint.load rejects a string scheme
    fp8 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": "FP8"}
    rep = run(make(tmp_path / "f8", llama_config(quant=fp8)))
    assert rep.kv_cache.declared == "FP8" and rep.kv_cache.auto_resolves_to == "bfloat16"  # ModelOptFp8Config: dict only
    nv = {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_scheme": "FP8", "group_size": 16, "ignore": []}
    assert run(make(tmp_path / "f4", llama_config(quant=nv))).kv_cache.auto_resolves_to == "fp8_e4m3"  # ModelOptFp4Config reads it


def test_compressed_tensors_kv_scheme_needs_strategy_tensor(tmp_path):
    q = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {},
         "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": False, "symmetric": True}}
    rep = run(make(tmp_path / "ct", llama_config(quant=q)))
    assert rep.kv_cache.auto_resolves_to == "bfloat16" and "ignores it" in ids(rep)["quant.kv.auto"].detail


def test_gptq_side_file_only_needs_the_flag(tmp_path):
    side = json.loads((FIX / "quant-examples" / "gptq_llama-2-13b-chat.quantize_config.json").read_text())
    rep = run(make(tmp_path / "g4", llama_config(), files={"quantize_config.json": side}))
    assert ids(rep)["quant.side_file"].status == "warn" and rep.recommended_flags["quantization"] == "gptq_marlin"
    side = json.loads((FIX / "quant-examples" / "gptq_genz-70b-3bit.quantize_config.json").read_text())
    rep = run(make(tmp_path / "g3", llama_config(), files={"quantize_config.json": side}))
    assert ids(rep)["quant.side_file"].status == "fail" and "bits=3" in ids(rep)["quant.side_file"].title
    assert "quantization" not in rep.recommended_flags


def test_mla_counts_only_the_scale_names_deepseeks_loader_maps():
    names = [f"model.layers.{i}.self_attn.{n}" for i, n in enumerate(
        ["k_proj.k_scale", "v_proj.v_scale", "attn_mqa.k_scale", "k_scale", "kv_scale", "k_proj.output_scale"])]
    per_layer, _ = quant.scale_tensors(names, list(range(6)), 6, mla=True)
    assert sorted(per_layer) == [0, 1, 2]
    per_layer, _ = quant.scale_tensors(names, list(range(6)), 6)
    assert sorted(per_layer) == [0, 1, 2, 3, 4, 5]


def test_dsa_auto_kv_follows_sglangs_override_by_gpu():
    """DeepSeek-V3.2 ships no kv_cache_quant_algo, yet SGLang picks fp8_e4m3 from SM100 and bf16 below."""
    from conftest import REPO

    from runbook import quant
    from runbook.model import checkpoint
    ck = checkpoint.load(REPO / "tests" / "fixtures" / "models" / "deepseek-v3.2")
    assert quant.inspect_checkpoint(ck, {}, compute_capability="10.0").kv_cache.auto_resolves_to == "fp8_e4m3"
    assert quant.inspect_checkpoint(ck, {}, compute_capability="9.0").kv_cache.auto_resolves_to == "bfloat16"
    assert quant.inspect_checkpoint(ck, {}, compute_capability="10.0").kv_cache.honoured is False
