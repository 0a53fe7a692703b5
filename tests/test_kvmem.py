"""KV memory against SGLang 0.5.23's rules. Expected values are derived by hand in the comments."""
import json
import re

import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.core import spec
from runbook.core.errors import InputError
from runbook.kv import cells
from runbook.kv import memory as kvmem
from runbook.kv import plan as kvplan
from runbook.kv import report as kvreport
from runbook.model import arch

MODELS = REPO / "tests" / "fixtures" / "models"


def load(name):
    return arch.from_config(json.loads((MODELS / name / "config.json").read_text()))


def cell(name, tp, dtype):
    return kvmem.compute(load(name), kvmem.Inputs(kv_dtype=dtype, tp=tp)).kv_bytes_per_token_per_gpu


# (model, tp, dtype) -> bytes per token per GPU, by hand:
EXPECTED = {
    # Qwen3.5: 15 full-attention layers (i+1 % 4 == 0), 2 KV heads, head_dim 256 (K+V = 512).
    ("qwen3.5-397b-a17b", 1, "bfloat16"): 2 * 512 * 15 * 2,            # 30,720 — the story's figure
    ("qwen3.5-397b-a17b", 1, "fp8_e4m3"): 2 * 512 * 15 * 1,            # 15,360
    ("qwen3.5-397b-a17b", 8, "bfloat16"): 1 * 512 * 15 * 2,            # 15,360: 1 head per GPU, replicated 4x
    ("qwen3.5-397b-a17b", 8, "fp8_e4m3"): 1 * 512 * 15 * 1,            # 7,680
    ("qwen3.5-397b-a17b-nvfp4", 1, "bfloat16"): 30720,
    ("qwen3.5-397b-a17b-nvfp4", 8, "fp8_e4m3"): 7680,
    # DeepSeek-V3 MLA: (kv_lora_rank 512 + rope 64) x 61 layers, not split by TP; MTP layer not counted.
    ("deepseek-v3", 1, "bfloat16"): 576 * 61 * 2,                      # 70,272
    ("deepseek-v3", 8, "bfloat16"): 576 * 61 * 2,
    ("deepseek-v3", 1, "fp8_e4m3"): 576 * 61,                          # 35,136
    ("deepseek-v3", 8, "fp8_e4m3"): 576 * 61,
    # gpt-oss-120b hybrid SWA: 18 full + 18 sliding, 8 KV heads x (64+64); SWA layers count 0.8x.
    ("gpt-oss-120b", 1, "bfloat16"): 66356,                            # 8*128*2 = 2048/layer: 18*2048 + 0.8*18*2048 = 66,355.2 -> 66,356
    ("gpt-oss-120b", 1, "fp8_e4m3"): 33178,                            # 33,177.6
    ("gpt-oss-120b", 8, "bfloat16"): 8295,                             # 1 head: 256/layer: 4,608 + 3,686.4 = 8,294.4
    ("gpt-oss-120b", 8, "fp8_e4m3"): 4148,                             # 4,147.2
    # Llama-3.1-70B: 80 layers, 8 KV heads x (128+128).
    ("llama-3.1-70b", 1, "bfloat16"): 8 * 256 * 80 * 2,                # 327,680
    ("llama-3.1-70b", 1, "fp8_e4m3"): 8 * 256 * 80,                    # 163,840
    ("llama-3.1-70b", 8, "bfloat16"): 1 * 256 * 80 * 2,                # 40,960
    ("llama-3.1-70b", 8, "fp8_e4m3"): 1 * 256 * 80,                    # 20,480
    ("llama-3.1-70b-instruct-fp8", 8, "bfloat16"): 40960,
    ("llama-3.1-70b-instruct-fp8", 1, "fp8_e4m3"): 163840,
}


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[0]}-tp{k[1]}-{k[2]}")
def test_bytes_per_token_real_configs(key):
    assert cell(*key) == EXPECTED[key]


def test_replication_in_words():
    r = kvmem.compute(load("qwen3.5-397b-a17b"), kvmem.Inputs(tp=8))
    assert r.kv_heads_per_gpu == 1 and r.kv_head_replication == 4.0 and r.kv_layers == 15
    assert r.layout == "2 KV heads at attention-TP 8: each GPU stores 1 head; heads replicated 4×"
    r = kvmem.compute(load("llama-3.1-70b"), kvmem.Inputs(tp=8, attn_dp=2))
    assert r.kv_heads_per_gpu == 2 and r.kv_head_replication == 1.0  # attention DP 2: attn_tp 4


def test_hybrid_state_bytes():
    # Qwen3.5: Hk 16, Hv 64, 128/128, kernel 4, 45 linear layers, conv bf16, SSM fp32.
    # TP1: conv_dim = 64*128 + 2*16*128 = 12,288; conv = 12,288*3*2 = 73,728; ssm = 64*128*128*4 = 4,194,304
    #      (73,728 + 4,194,304) * 45 = 192,061,440
    # TP8: conv = 1,536*3*2 = 9,216; ssm = 8*128*128*4 = 524,288; (9,216 + 524,288) * 45 = 24,007,680
    a = load("qwen3.5-397b-a17b")
    assert cells.state_bytes_per_request(a, 1, 45) == 192_061_440
    assert cells.state_bytes_per_request(a, 8, 45) == 24_007_680
    assert kvmem.compute(load("llama-3.1-70b"), kvmem.Inputs()).state_bytes_per_request_per_gpu == 0


def test_capacity_with_a_given_budget_by_hand():
    # 40 GiB = 42,949,672,960 B. State share 0.9/1.9 = 20,344,055,612.6 B;
    # max_mamba = int((that - 24,007,680) // 24,007,680) = 846; pool = 847 slots = 20,334,504,960 B.
    # KV = 22,615,168,000 B // 15,360 = 1,472,341 tokens.
    # max_running_requests: clamp(int(1,472,341 / 262,144 * 512), 2048, 4096) = 2875, then min(2875, 846 // 5 = 169).
    r = kvmem.compute(load("qwen3.5-397b-a17b"), kvmem.Inputs(kv_dtype="bf16", tp=8, kv_budget_gib=40, context_len=262144,
                                                               contexts=(32768, 131072)))
    assert (r.max_state_slots, r.state_pool_bytes_per_gpu, r.kv_pool_bytes_per_gpu) == (846, 20_334_504_960, 22_615_168_000)
    assert r.max_total_num_tokens == 1_472_341 and r.max_running_requests == 169
    assert r.requests_at_context == {"32768": 44, "131072": 11}   # 1,472,341 // 32,768 = 44; // 131,072 = 11
    assert r.state_slots_per_request == 5 and r.kv_budget_bytes_per_gpu == 40 * 2**30


def test_capacity_from_memory_by_hand():
    # Llama-70B, TP8, 80 GiB, 16 GiB weights/GPU, fraction 0.9, page 16:
    # rest = 80 GiB * 0.9 - 16 GiB = 56 GiB = 60,129,542,144 B; // 40,960 = 1,468,006 -> page 16: 1,468,000.
    r = kvmem.compute(load("llama-3.1-70b"), kvmem.Inputs(tp=8, gpu_mem_gib=80, weights_bytes_per_gpu=16 * 2**30,
                                                           mem_fraction_static=0.9, page_size=16, context_len=131072,
                                                           contexts=(131072,)))
    assert r.kv_budget_bytes_per_gpu == int(80 * 0.9 * 2**30) - 16 * 2**30
    assert r.max_total_num_tokens == 1_468_000
    assert r.max_running_requests == 4096          # clamp(int(1,468,000/131,072*512)=5734) -> 4096; tokens//2 larger
    assert r.requests_at_context == {"131072": 11}
    assert r.state_pool_bytes_per_gpu == 0 and r.max_state_slots is None


def test_hybrid_swa_capacity_by_hand():
    # gpt-oss TP8, 10 GiB budget, page 64: 10,737,418,240 // 8,294.4 = 1,294,538 -> 1,294,528;
    # SWA pool = int(1,294,528 * 0.8) // 64 * 64 = 1,035,584.
    r = kvmem.compute(load("gpt-oss-120b"), kvmem.Inputs(tp=8, kv_budget_gib=10, page_size=64, context_len=131072, contexts=(8192,)))
    assert (r.max_total_num_tokens, r.swa_tokens) == (1_294_528, 1_035_584)
    assert r.requests_at_context == {"8192": 158}


def test_pp_split_puts_remainder_last_and_takes_the_minimum():
    assert kvmem.pp_stages(61, 2) == [(0, 30), (30, 61)]
    assert kvmem.pp_stages(10, 4) == [(0, 2), (2, 4), (4, 7), (7, 10)]
    r = kvmem.compute(load("deepseek-v3"), kvmem.Inputs(tp=4, pp=2, kv_budget_gib=20))
    assert r.kv_layers == 31 and r.kv_bytes_per_token_per_gpu == 576 * 31 * 2
    assert r.max_total_num_tokens == int(20 * 2**30 // (576 * 31 * 2))


def test_mxfp8_and_fp4_scale_bytes():
    a = load("llama-3.1-70b")
    # mxfp8: 1 B/elem + 1 scale byte per 32: 20,480 + 1*256*80//32 = 21,120
    assert kvmem.compute(a, kvmem.Inputs(kv_dtype="mxfp8", tp=8)).kv_bytes_per_token_per_gpu == 21_120
    # nvfp4: data 1*128/2*80*2 = 10,240; scales 1*128/16*80*2 = 1,280; FlashInfer's FP8 dequant workspace
    # 1*128*2*1 = 256 (RTX PRO 6000); on B200 trtllm_mha reads FP4 natively: no workspace
    assert kvmem.compute(a, kvmem.Inputs(kv_dtype="nvfp4", tp=8, compute_capability="12.0")).kv_bytes_per_token_per_gpu == 11_776
    assert kvmem.compute(a, kvmem.Inputs(kv_dtype="nvfp4", tp=8, compute_capability="10.0")).kv_bytes_per_token_per_gpu == 11_520
    # and SGLang refuses NVFP4 KV on Hopper
    r = kvmem.compute(a, kvmem.Inputs(kv_dtype="nvfp4", tp=8, compute_capability="9.0"))
    assert [f.id for f in r.findings if f.status == "fail"] == ["kv.refused"]


def test_default_mem_fraction_heuristic():
    from runbook.kv import defaults
    llama = load("llama-3.1-70b")
    # 96 GiB, TP8, chunked prefill 8192: reserve 512 + 8192*1.5 + 1024 + 2*512 (decode graph) + 58 prefill
    # capture sizes up to 8192 × 8 MiB = 15,312 MiB; (98,304-15,312)/98,304 = 0.844
    assert defaults.prefill_capture_sizes(8192)[-1] == 8192 and len(defaults.prefill_capture_sizes(8192)) == 58
    assert defaults.mem_fraction_static(llama, 96, 8, 1).value == 0.844
    # 24 GiB TP1: cps 4096, bs 48, 50 prefill sizes: 512 + 6144 + 128 + 96 + 400 = 7,280 MiB → 0.704
    assert defaults.mem_fraction_static(llama, 24, 1, 1).value == 0.704
    # PP 2 turns the prefill graph off: 512 + 12288 + 2048 + 1024 = 15,872 MiB → 0.839
    assert defaults.mem_fraction_static(llama, 96, 8, 2).value == 0.839
    # --max-running-requests 48 caps the decode graph: 512 + 12288 + 1024 + 2*48 + 464 = 14,384 MiB
    assert defaults.mem_fraction_static(llama, 96, 8, 1, max_running_requests=48).value == 0.854


def test_story_frame_numbers():
    df = kvreport.story_frame(load("qwen3.5-397b-a17b-nvfp4"))
    assert df.loc["KV bytes/token, whole model, BF16", "SGLang's rules"] == 30720
    assert df.loc["KV bytes/token, whole model, FP8", "SGLang's rules"] == 15360
    assert df.loc["KV bytes/token on each GPU at TP 8, BF16", "SGLang's rules"] == 15360
    assert df.loc["KV bytes/token on each GPU at TP 8, BF16", "story"] == 3840


def test_default_deployment_plan_and_json_keys(cli):
    p = kvplan.assess(spec.load())
    assert p.inputs.kv_dtype == "bfloat16" and p.inputs.mem_fraction_static == 0.88 and p.auto_kv_dtype == "fp8_e4m3"
    assert p.result.max_total_num_tokens > 1_000_000 and "model.size_gib" in p.weights_source
    cp = cli("kv", "--json")
    j = json.loads(cp.stdout)
    keys = ["kv_dtype", "kv_bytes_per_token_per_gpu", "kv_layers", "kv_heads_per_gpu", "kv_head_replication",
            "state_bytes_per_request_per_gpu", "state_slots_per_request", "max_state_slots", "kv_budget_bytes_per_gpu",
            "max_total_num_tokens", "max_running_requests", "requests_at_context", "findings"]
    assert all(k in j for k in keys)
    assert all(isinstance(j[k], int) for k in keys[1:4] + keys[5:11])
    assert set(j["requests_at_context"]) == {"8192", "32768", "131072", "262144"}
    assert j["kv_dtype"] == "bfloat16" and j["kv_bytes_per_token_per_gpu"] == 15360
    assert [c["kv_dtype"] for c in j["candidates"]] == ["bfloat16", "fp8_e4m3"]


def _documented_kv_keys() -> tuple[set[str], set[str]]:
    """docs/json.md's `kv --json` entry: (the keys it names outside `inputs`, the keys it says `inputs` holds)."""
    text = (REPO / "docs" / "json.md").read_text()
    entry = text[text.index("- `kv --json`"):]
    entry = entry[:entry.index("\n- `", 3)]
    outer, inner = entry.split("`inputs` holds exactly:")
    def names(t):
        return set(re.findall(r"`([a-z_0-9]+)`", t))
    return names(outer) - {"inputs"}, names(re.sub(r"\([^)]*\)", "", inner))


def test_kv_json_has_the_documented_keys(cli):
    """Every key docs/json.md names for `kv --json` is there, and `inputs` holds exactly the documented keys
    (nvfp4_scale_layouts went missing from it once without a word)."""
    outer, inputs = _documented_kv_keys()
    assert "nvfp4_scale_layouts" in inputs and len(inputs) >= 30, inputs
    for args in (("kv", "--json"), ("kv", "--json", "--kv-dtype", "nvfp4", "--attention-backend", "flashinfer",
                                    "--compute-capability", "10.0")):
        j = json.loads(cli(*args).stdout)
        scenario_keys = set(j["scenarios"][0])
        assert not {k for k in outer if k not in j and k not in scenario_keys}, outer - set(j) - scenario_keys
        assert set(j["inputs"]) == inputs, set(j["inputs"]) ^ inputs
    assert j["inputs"]["kv_dtype"] == "nvfp4" and j["inputs"]["nvfp4_scale_layouts"] == 2   # SM100 + FlashInfer prefill


def test_cli_kv_overrides(cli):
    d = MODELS / "qwen3.5-397b-a17b"
    j = json.loads(cli("kv", d, "--tp", "1", "--kv-dtype", "fp8_e4m3", "--kv-budget-gib", "60", "--contexts", "8192,65536",
                       "--json").stdout)
    assert j["kv_bytes_per_token_per_gpu"] == 15360 and j["state_bytes_per_request_per_gpu"] == 192_061_440
    assert set(j["requests_at_context"]) == {"8192", "65536"}
    j = json.loads(cli("kv", d, "--tp", "8", "--json").stdout)
    assert j["max_total_num_tokens"] is None and j["requests_at_context"] == {}
    assert any(f["id"] == "kv.budget" and f["status"] == "skip" for f in j["findings"])  # no GPU memory or weights given


@pytest.mark.parametrize("args, message", [
    (["--tp", "0"], "--tp must be at least 1"),
    (["--tp", "8", "--attn-dp", "3"], "--attn-dp 3 must divide --tp 8"),
    (["--gpu-mem-gib", "-5"], "--gpu-mem-gib must be positive"),
    (["--kv-dtype", "fp7"], "--kv-dtype fp7: not a KV cache dtype"),
])
def test_cli_kv_bad_input(cli, args, message):
    cp = cli("kv", MODELS / "llama-3.1-70b", *args)
    assert cp.returncode == 2 and message in cp.stderr and len(cp.stderr.strip().splitlines()) == 1


def test_budget_smaller_than_weights_is_a_fail_finding():
    r = kvmem.compute(load("llama-3.1-70b"), kvmem.Inputs(tp=2, gpu_mem_gib=80, weights_bytes_per_gpu=70 * 2**30, mem_fraction_static=0.85))
    f = {x.id: x for x in r.findings}
    assert f["kv.budget"].status == "fail" and r.max_total_num_tokens is None


def test_unrecognised_architecture_falls_back_with_warn():
    a = arch.from_config({"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512})
    r = kvmem.compute(a, kvmem.Inputs())
    warns = [f for f in r.findings if f.id == "kv.assumption"]
    assert r.kv_bytes_per_token_per_gpu == 8 * 128 * 4 * 2
    assert any("assumed MHA" in f.title for f in warns) and any("standard attention formula" in f.title for f in warns)


def test_missing_family_fields_are_clear_errors():
    cfg = json.loads((MODELS / "qwen3.5-397b-a17b" / "config.json").read_text())
    del cfg["text_config"]["linear_num_value_heads"]
    a = arch.from_config(cfg)   # without the linear fields it is not treated as Qwen3-Next: layer_types decide
    assert len(a.full_layer_ids) == 15 and a.linear is None and any("not sized" in x for x in a.assumptions)
    cfg = json.loads((MODELS / "deepseek-v3" / "config.json").read_text())
    del cfg["qk_rope_head_dim"]
    with pytest.raises(InputError, match="'qk_rope_head_dim' must be a positive integer"):
        arch.from_config(cfg)


# ---- properties --------------------------------------------------------------------------------

CONFIGS = ["qwen3.5-397b-a17b", "deepseek-v3", "gpt-oss-120b", "llama-3.1-70b"]
tps = st.sampled_from([1, 2, 4, 8, 16])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CONFIGS), tps)
def test_fp8_is_half_of_bf16(name, tp):
    a = load(name)
    b = cells.cell_bytes(a, "bfloat16", tp, len(a.full_layer_ids), len(a.swa_layer_ids))
    f = cells.cell_bytes(a, "fp8_e4m3", tp, len(a.full_layer_ids), len(a.swa_layer_ids))
    assert f * 2 == b


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CONFIGS), tps, st.floats(20, 300), st.floats(20, 300))
def test_capacity_grows_with_memory(name, tp, m1, m2):
    a = load(name)
    lo, hi = sorted((m1, m2))
    t = [kvmem.compute(a, kvmem.Inputs(tp=tp, kv_budget_gib=m)).max_total_num_tokens for m in (lo, hi)]
    assert t[0] <= t[1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_never_less_than_one_kv_head_per_gpu(heads, tp):
    a = arch.from_config({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 64,
                          "num_key_value_heads": heads, "hidden_size": 4096})
    assert cells.kv_heads_per_gpu(a, tp) >= 1
    assert cells.replication(a, tp) >= 1 or heads % tp


@settings(max_examples=30, deadline=None)
@given(tps, tps)
def test_mla_independent_of_tp(t1, t2):
    a = load("deepseek-v3")
    assert cell("deepseek-v3", t1, "bfloat16") == cell("deepseek-v3", t2, "bfloat16") == 70272
    assert cells.kv_heads_per_gpu(a, t1) == 1


@pytest.mark.parametrize("flag,value", [
    ("speculative-num-steps", "three"), ("speculative-num-draft-tokens", 0), ("speculative-eagle-topk", 2.5),
    ("mamba-ssm-dtype", "float64"), ("cuda-graph-max-bs", -4), ("max-running-requests", 2**40),
    ("speculative-algorithm", True), ("disable-overlap-schedule", "sometimes"),
])
def test_new_kv_flags_from_the_spec_are_validated(flag, value):
    """Hostile values for the flags the KV stage now reads: one line naming the flag (from the spec loader or
    the stage), never a traceback or a silent number."""
    from conftest import spec_data

    from runbook.core.errors import SpecError
    flags = dict(spec_data()["serving"]["flags"], **{flag: value})
    with pytest.raises((SpecError, InputError)) as e:
        kvplan.assess(spec.from_dict(spec_data(**{"serving.flags": flags}), str(REPO / "deployments" / "x.yaml")))
    assert flag in str(e.value) and "\n" not in str(e.value)


def test_head_dim_derived_as_zero_is_an_input_error_not_a_plan(cli, tmp_path):
    """hidden_size below the head count derives head_dim 0 (0 B of KV per token); a config error, one line."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 32,
           "num_key_value_heads": 8, "hidden_size": 16, "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
    with pytest.raises(InputError, match=r"m/config.json: 'hidden_size' 16 is smaller than 'num_attention_heads' 32"):
        arch.from_config(cfg, "m/config.json")
    assert arch.from_config({**cfg, "head_dim": 64}).head_dim == 64   # an explicit head_dim is not derived
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    cp = cli("kv", tmp_path)
    assert cp.returncode == 2 and cp.stdout == "", (cp.returncode, cp.stdout)
    err = cp.stderr.strip()
    assert "\n" not in err and str(tmp_path / "config.json") in err and "'hidden_size'" in err and "'head_dim'" in err, err


# ---- the MTP draft's own pool on hybrid linear-attention models ------------------------------------------------------

@pytest.mark.parametrize("name, tp, dtype, draft", [
    # one full-attention layer: KV heads per GPU × (K+V 512) × bytes
    ("qwen3.5-397b-a17b", 8, "bfloat16", 1 * 512 * 2),        # 1,024 (was 0): the story's deployment with MTP
    ("qwen3.5-397b-a17b", 1, "bfloat16", 2 * 512 * 2),        # 2,048
    ("qwen3.5-397b-a17b", 8, "fp8_e4m3", 1 * 512 * 1),        # 512
    ("qwen3-next-80b-a3b-thinking", 2, "bfloat16", 1 * 512 * 2)])   # 2 KV heads, head_dim 256
def test_a_hybrid_models_mtp_draft_pool_is_one_layer_outside_the_budget(name, tp, dtype, draft):
    """kv_cache_configurator.py: with no num_nextn_predict_layers in the target config, the budget's cell holds no
    draft share; the draft worker then builds its own pool of one full-attention layer with the target's tokens."""
    a = load(name)
    plain = kvmem.compute(a, kvmem.Inputs(kv_dtype=dtype, tp=tp, kv_budget_gib=40))
    r = kvmem.compute(a, kvmem.Inputs(kv_dtype=dtype, tp=tp, kv_budget_gib=40, speculative_algorithm="NEXTN",
                                      speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4))
    assert (r.draft_kv_bytes_per_token_per_gpu, r.draft_kv_budget_bytes_per_token_per_gpu) == (draft, 0)
    assert r.kv_bytes_per_token_per_gpu == plain.kv_bytes_per_token_per_gpu   # the target's cell is unchanged
    assert r.draft_kv_pool_bytes_per_gpu == (r.max_total_num_tokens + r.page_size) * draft
    f = {x.id: x for x in r.findings}["kv.draft_pool"]
    assert f.status == "info" and f"{draft:,} B/token" in f.title and "does not change max_total_num_tokens" in f.detail
    assert "kv.draft_pool" not in {x.id for x in plain.findings}


def test_a_draft_share_in_the_budget_is_the_draft_pool():
    """Nemotron-3-Super declares num_nextn_predict_layers 1: the budget's cell carries the draft's layer (SGLang's
    oracle: 4,096 + 512 at TP 8), and that share is the draft pool; no separate allocation."""
    r = kvmem.compute(load("nemotron-3-super-120b-a12b"), kvmem.Inputs(tp=8, kv_budget_gib=40, speculative_algorithm="NEXTN"))
    assert (r.kv_bytes_per_token_per_gpu, r.draft_kv_bytes_per_token_per_gpu, r.draft_kv_budget_bytes_per_token_per_gpu) == (
        4608, 512, 512)
    assert r.draft_kv_pool_bytes_per_gpu is None and "kv.draft_pool" not in {x.id for x in r.findings}


# ---- the quantization method's minimum GPU capability --------------------------------------------------------------

@pytest.mark.parametrize("cc", ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"])
@pytest.mark.parametrize("method, need", [("modelopt_fp8", 89), ("fp8", 80), ("mxfp8", 100), ("w4afp8", 90),
                                          ("modelopt_fp4", 80), ("w8a8_fp8", 89), (None, 0)])
def test_the_plan_refuses_a_quantization_the_gpu_is_too_old_for(cc, method, need):
    """model_loader/loader.py _get_quantization_config: below get_min_capability() SGLang raises before loading."""
    r = kvmem.compute(load("llama-3.1-70b"), kvmem.Inputs(tp=8, kv_budget_gib=40, compute_capability=cc, quantization=method))
    major, minor = cc.split(".")
    cap = int(major) * 10 + int(minor)
    fails = [f for f in r.findings if f.id == "kv.refused" and "Minimum capability" in f.title]
    assert bool(fails) == (cap < need), (cc, method, fails)
    if fails:
        assert f"{method} is not supported" in fails[0].title and f"Minimum capability: {need}. Current capability: {cap}." in \
            fails[0].title and f"{need // 10}.{need % 10} or newer" in fails[0].remedy


@pytest.mark.parametrize("cc, refused", [("8.0", True), ("8.6", True), ("8.9", False), ("9.0", False), ("10.0", False),
                                         ("12.0", False)])
def test_a_modelopt_fp8_checkpoint_on_an_ampere_gpu_is_refused_by_the_kv_plan(tmp_path, cc, refused):
    """The real Llama-3.1-70B-Instruct-FP8 config (hf_quant_config.json FP8 → modelopt_fp8) through `runbook kv`'s
    entry point: SGLang needs SM 8.9 for it, so an A100 (8.0) or an A6000 (8.6) is a kv.refused fail."""
    from conftest import spec_data

    d = spec.from_dict(spec_data(**{"model.path": str(MODELS / "llama-3.1-70b-instruct-fp8"), "model.card": None,
                                    "model.size_gib": 70, "hardware.compute_capability": cc, "hardware.gpu_memory_gib": 80,
                                    "serving.flags": {}}), str(REPO / "deployments" / "x.yaml"))
    p = kvplan.assess(d)
    assert p.inputs.quantization == "modelopt_fp8"
    fails = [f for f in p.findings if f.id == "kv.refused"]
    assert bool(fails) == refused, (cc, [f.title for f in fails])


def test_warm_sessions_beside_the_storys_token_count():
    """Notebook 20's figures for the story's deployment: 2,019,948 BF16 tokens hold 40 agents' 50K contexts and 20 at
    100K; FP8 KV twice that. (The notebook's text quotes them.)"""
    df = kvreport.warm_sessions_frame(kvplan.assess(spec.load()))
    assert df.loc[("bfloat16", "50,000"), "warm sessions"] == 40 and df.loc[("bfloat16", "100,000"), "warm sessions"] == 20
    assert df.loc[("fp8_e4m3", "50,000"), "warm sessions"] == 80 and df.loc[("fp8_e4m3", "100,000"), "warm sessions"] == 40
    assert df.loc[("bfloat16", "50,000"), "pool tokens"] == 2_019_948
