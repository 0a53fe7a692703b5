"""Differential test: the quant stage's reading of a checkpoint against SGLang 0.5.23's own code.

The oracle (tests/oracle/sglang_quant.py) runs in .venv-serving, where the real sglang is installed, and
builds SGLang's ModelConfig, quantization config and KV-cache dtype for each checkpoint directory. It is
started once for the whole module. Every real quant example in tests/fixtures/quant-examples is a case,
plus constructed variants (string/dict KV schemes, mixed precision, unsupported GPTQ, hostile types,
config.json contradicting hf_quant_config.json, mismatching --quantization flags).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ckpt_factory import llama_config, make
from conftest import REPO

from runbook import quant
from runbook.core.errors import InputError
from runbook.model import checkpoint

SERVING_PY = Path(os.environ.get("RUNBOOK_SERVING_PYTHON") or REPO / ".venv-serving" / "bin" / "python")
ORACLE = REPO / "tests" / "oracle" / "sglang_quant.py"
EX = REPO / "tests" / "fixtures" / "quant-examples"
REFUSAL_IDS = ("quant.refused", "quant.flag")
pytestmark = pytest.mark.serving

if not SERVING_PY.is_file():
    pytest.skip(f"no SGLang serving python at {SERVING_PY} (set RUNBOOK_SERVING_PYTHON, or build .venv-serving "
                "from requirements-serving.txt)", allow_module_level=True)


def ex(name: str) -> dict[str, Any]:
    return json.loads((EX / name).read_text())


def llama(quant: Any = None, dtype: str = "bfloat16") -> dict[str, Any]:
    c = llama_config(quant=quant, dtype=dtype)
    c.update(vocab_size=128, intermediate_size=128)
    return c


def kimi(quant: Any = "keep") -> dict[str, Any]:
    """The real Kimi-K2 config (DeepseekV3ForCausalLM, MLA), with its quantization_config replaced."""
    c = ex("fp8block_kimi-k2-instruct.config.json")
    if quant != "keep":
        c.pop("quantization_config", None)
        if quant is not None:
            c["quantization_config"] = quant
    return c


def mo_flat(algo: str, **kw: Any) -> dict[str, Any]:
    return {"quant_method": "modelopt", "quant_algo": algo, "producer": {"name": "modelopt", "version": "0.35.0"}, **kw}


def mo_nested(algo: str, **kw: Any) -> dict[str, Any]:
    return {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {"quant_algo": algo, **kw}}


def ct(kv: Any = None, **kw: Any) -> dict[str, Any]:
    q = {"quant_method": "compressed-tensors", "format": "float-quantized", "version": "0.9.0", "ignore": ["lm_head"],
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                                          "symmetric": True, "dynamic": False},
                                       "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                             "symmetric": True, "dynamic": True}}},
         "quantization_status": "compressed", **kw}
    if kv is not None:
        q["kv_cache_scheme"] = kv
    return q


def gptq(**kw: Any) -> dict[str, Any]:
    return {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True, **kw}


FP8_KV = {"type": "float", "num_bits": 8, "strategy": "tensor", "dynamic": False, "symmetric": True}
NVFP4_LAYER = {"quant_algo": "NVFP4", "group_size": 16}
FP8_LAYER = {"quant_algo": "FP8"}
W4A8_LAYER = {"quant_algo": "W4A8_AWQ", "group_size": 128}
LLAMA33_FP4 = "modelopt_hf_quant_config.nvidia-Llama-3.3-70B-Instruct-FP4.json"
QWEN3_FP4 = "modelopt_hf_quant_config.nvidia-Qwen3-235B-A22B-NVFP4.json"
R1_FP4 = "modelopt_hf_quant_config.deepseek-r1-fp4.peaceh-nv-TensorRT-LLM.json"
GENZ_SIDE = "gptq_genz-70b-3bit.quantize_config.json"


def _del(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    d = copy.deepcopy(d)
    for k in keys:
        d.pop(k, None)
    return d


def _hq_only(cfg: dict[str, Any]) -> dict[str, Any]:
    return _del(cfg, "quantization_config")


# id -> (config.json, hf_quant_config.json or None, other files, flags); a "side" flag is the --quantization
# that reads quantize_config.json (checked against the project's quant.side_file finding).
CASES: dict[str, tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any], dict[str, str]]] = {
    # ---- the real examples, as published ----
    "real/compressed-tensors llama4 fp8-dynamic": (ex("compressed-tensors_llama4-fp8-dynamic.config.json"), None, {}, {}),
    "real/fbgemm_fp8 llama-3.1-405b": (ex("fbgemm-fp8_llama-3.1-405b-instruct-fp8.config.json"), None, {}, {}),
    "real/fp8 block kimi-k2": (ex("fp8block_kimi-k2-instruct.config.json"), None, {}, {}),
    "real/fp8 block qwen3-8b": (ex("fp8block_qwen3-8b-fp8.config.json"), None, {}, {}),
    "real/fp8 block deepseek-v4-pro block on kimi":
        (kimi(ex("fp8block_deepseek-v4-pro.quantization_config.excerpt.json")["quantization_config"]), None, {}, {}),
    "real/gptq 3-bit genz-70b config.json": (ex("gptq_genz-70b-3bit.config.json"), None, {}, {}),
    "real/gptq 4-bit llama-2-13b fp16": (ex("gptq_llama-2-13b-chat.config.json"), None, {}, {}),
    "real/gptq 4-bit qwen-vl block on llama": (llama(ex("gptq_qwen-vl-chat-int4.config.json")["quantization_config"]), None, {}, {}),
    "real/mxfp4 gpt-oss-120b": (ex("mxfp4_gpt-oss-120b.config.json"), None, {}, {}),
    "real/mxfp4 gpt-oss-20b": (ex("mxfp4_gpt-oss-20b.config.json"), None, {}, {}),
    "real/awq zephyr block on llama bf16":
        (llama(ex("awq_zephyr-7B-alpha-AWQ.quantization_config.excerpt.json")["quantization_config"]), None, {}, {}),
    "real/awq zephyr block on llama fp16":
        (llama(ex("awq_zephyr-7B-alpha-AWQ.quantization_config.excerpt.json")["quantization_config"], "float16"), None, {}, {}),
    "real/modelopt nvfp4 llama-3.3 hf_quant_config": (llama(), ex(LLAMA33_FP4), {}, {}),
    "real/modelopt nvfp4 qwen3-235b hf_quant_config": (llama(), ex(QWEN3_FP4), {}, {}),
    "real/modelopt nvfp4 deepseek-r1 on kimi": (kimi(None), ex(R1_FP4), {}, {}),
    "real/gptq 3-bit genz side file only": (llama(), None, {"quantize_config.json": ex(GENZ_SIDE)}, {"side": "gptq_marlin"}),
    "real/gptq 4-bit llama-2 side file only":
        (llama(dtype="float16"), None, {"quantize_config.json": ex("gptq_llama-2-13b-chat.quantize_config.json")}, {"side": "gptq_marlin"}),
    "real/gptq 4-bit qwen-vl side file only":
        (llama(), None, {"quantize_config.json": ex("gptq_qwen-vl-chat-int4.quantize_config.json")}, {"side": "gptq_marlin"}),
    "real/gptq 3-bit genz + --quantization gptq_marlin": (ex("gptq_genz-70b-3bit.config.json"), None, {}, {"quantization": "gptq_marlin"}),
    "real/fbgemm + --quantization fp8": (ex("fbgemm-fp8_llama-3.1-405b-instruct-fp8.config.json"), None, {}, {"quantization": "fp8"}),
    "real/nvfp4 hq + --quantization modelopt": (llama(), ex(LLAMA33_FP4), {}, {"quantization": "modelopt"}),
    "real/nvfp4 hq + --quantization modelopt_fp8": (llama(), ex(LLAMA33_FP4), {}, {"quantization": "modelopt_fp8"}),
    "real/fp8 block kimi + --quantization modelopt_fp4":
        (ex("fp8block_kimi-k2-instruct.config.json"), None, {}, {"quantization": "modelopt_fp4"}),
    "real/llama4 ct + --quantization w8a8_fp8":
        (ex("compressed-tensors_llama4-fp8-dynamic.config.json"), None, {}, {"quantization": "w8a8_fp8"}),
    "real/mxfp4 gpt-oss-20b + --quantization fp8": (ex("mxfp4_gpt-oss-20b.config.json"), None, {}, {"quantization": "fp8"}),
    "real/gptq llama-2 + --quantization gptq": (ex("gptq_llama-2-13b-chat.config.json"), None, {}, {"quantization": "gptq"}),
    # ---- ModelOpt flat quantization_config in config.json ----
    "modelopt flat FP8, kv_cache_scheme 'FP8' string": (llama(mo_flat("FP8", kv_cache_scheme="FP8", ignore=["lm_head"])), None, {}, {}),
    "modelopt flat FP8, kv_cache_scheme dict":
        (llama(mo_flat("FP8", kv_cache_scheme={"type": "float", "num_bits": 8, "dynamic": False})), None, {}, {}),
    "modelopt flat FP8, kv_cache_quant_algo FP8": (llama(mo_flat("FP8", kv_cache_quant_algo="FP8")), None, {}, {}),
    "modelopt flat FP8, kv_cache_scheme int8 dict": (llama(mo_flat("FP8", kv_cache_scheme={"type": "int", "num_bits": 8})), None, {}, {}),
    "modelopt flat NVFP4, kv_cache_scheme 'FP8' string":
        (llama(mo_flat("NVFP4", kv_cache_scheme="FP8", group_size=16, ignore=["lm_head"])), None, {}, {}),
    "modelopt flat NVFP4, kv_cache_scheme fp4 dict":
        (llama(mo_flat("NVFP4", kv_cache_scheme={"type": "float", "num_bits": 4}, ignore=[])), None, {}, {}),
    "modelopt flat NVFP4, no group_size, kv dict":
        (llama(mo_flat("NVFP4", kv_cache_scheme={"type": "float", "num_bits": 8}, ignore=["lm_head"])), None, {}, {}),
    "modelopt flat W4A8_AWQ (no SGLang kernel)": (llama(mo_flat("W4A8_AWQ")), None, {}, {}),
    "modelopt flat, no quant_method, quant_algo FP8":
        (llama(_del(mo_flat("FP8", kv_cache_quant_algo="FP8"), "quant_method")), None, {}, {}),
    "modelopt flat MXFP8, kv dict":
        (llama(mo_flat("MXFP8", kv_cache_scheme={"type": "float", "num_bits": 8}, group_size=32)), None, {}, {}),
    "modelopt flat MIXED_PRECISION without NVFP4 layers":
        (llama(mo_flat("MIXED_PRECISION", quantized_layers={"model.layers.0.mlp": W4A8_LAYER})), None, {}, {}),
    "modelopt flat MIXED_PRECISION with NVFP4, no kv info, no hq file":
        (llama(mo_flat("MIXED_PRECISION", quantized_layers={"model.layers.0.mlp": NVFP4_LAYER})), None, {}, {}),
    "modelopt flat MIXED_PRECISION with NVFP4 and kv dict":
        (llama(mo_flat("MIXED_PRECISION", kv_cache_scheme={"type": "float", "num_bits": 8},
                       quantized_layers={"model.layers.0.mlp": NVFP4_LAYER, "model.layers.1.mlp": FP8_LAYER})), None, {}, {}),
    "modelopt flat MIXED_PRECISION + --quantization modelopt_mixed, no NVFP4":
        (llama(mo_flat("MIXED_PRECISION", quantized_layers={"model.layers.0.mlp": W4A8_LAYER})), None, {},
         {"quantization": "modelopt_mixed"}),
    # ---- ModelOpt hf_quant_config.json (nested) ----
    "modelopt hq FP8, kv FP8": (llama(), mo_nested("FP8", kv_cache_quant_algo="FP8", exclude_modules=["lm_head"]), {}, {}),
    "modelopt hq FP8, kv 'fp8' lower case": (llama(), mo_nested("FP8", kv_cache_quant_algo="fp8"), {}, {}),
    "modelopt hq NVFP4, no kv, no group_size": (llama(), mo_nested("NVFP4", exclude_modules=["lm_head"]), {}, {}),
    "modelopt hq MIXED_PRECISION without NVFP4 layers": (llama(), mo_nested("MIXED_PRECISION", kv_cache_quant_algo="FP8",
                                                                            quantized_layers={"model.layers.0.mlp": W4A8_LAYER}), {}, {}),
    "modelopt hq MIXED_PRECISION with NVFP4 layers, kv FP8": (llama(), mo_nested("MIXED_PRECISION", kv_cache_quant_algo="FP8",
                                                                                 quantized_layers={"model.layers.0.mlp": NVFP4_LAYER}), {},
                                                                                 {}),
    "modelopt hq MIXED_PRECISION, quantized_layers empty": (llama(), mo_nested("MIXED_PRECISION", quantized_layers={}), {}, {}),
    "modelopt hq MIXED_PRECISION + --quantization modelopt_mixed, no NVFP4":
        (llama(), mo_nested("MIXED_PRECISION", quantized_layers={"a": W4A8_LAYER}), {}, {"quantization": "modelopt_mixed"}),
    "modelopt hq W4A8_AWQ (unknown to the parser)": (llama(), mo_nested("W4A8_AWQ"), {}, {}),
    "modelopt hq MXFP8, kv FP8": (llama(), mo_nested("MXFP8", kv_cache_quant_algo="FP8"), {}, {}),
    "modelopt hq FP8, producer is a string": (llama(), {"producer": "modelopt", "quantization": {"quant_algo": "FP8"}}, {}, {}),
    "modelopt hq FP8, no producer": (llama(), {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, {}, {}),
    "modelopt hq, quantization is a list": (llama(), {"producer": {"name": "modelopt"}, "quantization": ["FP8"]}, {}, {}),
    # ---- contradictions between config.json and hf_quant_config.json ----
    "config.json flat FP8 (no kv) vs hq NVFP4 kv FP8": (llama(mo_flat("FP8")), ex(LLAMA33_FP4), {}, {}),
    "config.json fp8 block vs hq NVFP4":
        (llama({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}), ex(LLAMA33_FP4), {}, {}),
    "config.json flat NVFP4 kv string vs hq FP8 no kv":
        (llama(mo_flat("NVFP4", kv_cache_scheme="FP8", ignore=[])), mo_nested("FP8"), {}, {}),
    "config.json quantization_config null + hq FP8":
        (dict(llama(), quantization_config=None), mo_nested("FP8", kv_cache_quant_algo="FP8"), {}, {}),
    "config.json ct kv FP8 vs hq NVFP4": (llama(ct(FP8_KV)), ex(LLAMA33_FP4), {}, {}),
    # ---- fp8 (DeepSeek-style block / per-tensor) ----
    "fp8 with kv_cache_quant_algo FP8":
        (llama({"quant_method": "fp8", "activation_scheme": "static", "kv_cache_quant_algo": "FP8"}), None, {}, {}),
    "fp8 without activation_scheme": (llama({"quant_method": "fp8", "weight_block_size": [128, 128]}), None, {}, {}),
    "fp8 quant_method upper case FP8": (llama({"quant_method": "FP8", "activation_scheme": "dynamic"}), None, {}, {}),
    "fp8 block on kimi, kv FP8":
        (kimi({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "kv_cache_quant_algo": "FP8"}),
         None, {}, {}),
    # ---- compressed-tensors KV schemes ----
    "ct kv static per-tensor FP8": (llama(ct(FP8_KV)), None, {}, {}),
    "ct kv without strategy": (llama(ct(_del(FP8_KV, "strategy"))), None, {}, {}),
    "ct kv dynamic": (llama(ct(dict(FP8_KV, dynamic=True))), None, {}, {}),
    "ct kv asymmetric": (llama(ct(dict(FP8_KV, symmetric=False))), None, {}, {}),
    "ct kv strategy channel": (llama(ct(dict(FP8_KV, strategy="channel"))), None, {}, {}),
    "ct kv int8": (llama(ct(dict(FP8_KV, type="int"))), None, {}, {}),
    "ct kv scheme is a string": (llama(ct("fp8")), None, {}, {}),
    "ct on kimi (MLA), kv static FP8": (kimi(ct(FP8_KV)), None, {}, {}),
    "compression_config ct, kv FP8": (dict(llama(), compression_config=ct(FP8_KV)), None, {}, {}),
    # ---- GPTQ / AWQ ----
    "gptq 8-bit": (llama(gptq(bits=8)), None, {}, {}),
    "gptq 4-bit asymmetric": (llama(gptq(sym=False)), None, {}, {}),
    "gptq 4-bit without desc_act": (llama(_del(gptq(), "desc_act")), None, {}, {}),
    "gptq 4-bit group 256": (llama(gptq(group_size=256)), None, {}, {}),
    "gptq 4-bit marlin format": (llama(gptq(checkpoint_format="marlin")), None, {}, {}),
    "gptq 2-bit": (llama(gptq(bits=2)), None, {}, {}),
    "gptq 4-bit + --quantization moe_wna16": (llama(gptq()), None, {}, {"quantization": "moe_wna16"}),
    "awq zero_point false bf16": (llama({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}), None, {}, {}),
    "awq zero_point false fp16":
        (llama({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "float16"), None, {}, {}),
    "awq 4-bit + --quantization awq on bf16":
        (llama(ex("awq_zephyr-7B-alpha-AWQ.quantization_config.excerpt.json")["quantization_config"]), None, {}, {"quantization": "awq"}),
    # ---- hostile forms ----
    "quantization_config without quant_method": (llama({"bits": 4, "group_size": 128}), None, {}, {}),
    "quant_method is a number": (llama({"quant_method": 8}), None, {}, {}),
    "unknown quant_method": (llama({"quant_method": "bitsandbytes_nf5"}), None, {}, {}),
    "unquantized + --quantization fp8 (online)": (llama(), None, {}, {"quantization": "fp8"}),
    "unquantized": (llama(), None, {}, {}),
}


def _argv(flags: dict[str, str], quant: str | None) -> list[str]:
    return (["--quantization", quant] if quant else []) + ["--kv-cache-dtype", "auto"]


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    """Every case: the project's report, and SGLang's decision under the case's flags, with no flag, with the
    project's recommended flag and (side files) with the flag that reads quantize_config.json."""
    root = tmp_path_factory.mktemp("quant_vs_sglang")
    reports, requests, input_errors = {}, [], {}
    for i, (cid, (cfg, hq, files, flags)) in enumerate(CASES.items()):
        d = make(root / f"c{i:03d}", cfg, hf_quant_config=hq, files=files)
        fl = {k: v for k, v in flags.items() if k != "side"}
        try:
            ck = checkpoint.load(d)
        except InputError as e:
            # checkpoint.load's own field checks stopped it; compare the quant stage's rules all the same
            input_errors[cid] = str(e)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(checkpoint, "check_config", lambda *a: None)
                mp.setattr(checkpoint, "check_hf_quant_config", lambda *a: None)
                ck = checkpoint.load(d)
        rep = quant.inspect_checkpoint(ck, fl)
        reports[cid] = rep
        runs = {"main": fl.get("quantization"), "auto": None, "rec": rep.recommended_flags.get("quantization"),
                "side": flags.get("side")}
        for tag, q in runs.items():
            if tag == "main" or (tag == "auto" and fl.get("quantization")) or (tag in ("rec", "side") and q):
                requests.append({"id": f"{cid}::{tag}", "model_dir": str(d), "argv": _argv(fl, q)})
    # SM100 (Blackwell): no method is refused for the GPU generation; the refusals below it (get_min_capability:
    # mxfp8 SM100, w4afp8 SM90, modelopt_fp8 SM89) are checked per GPU in test_min_capability_refusals_at_each_gpu.
    env = dict(os.environ, PYTHONPATH="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RUNBOOK_ORACLE_SM="100")
    cp = subprocess.run([str(SERVING_PY), str(ORACLE)], input=json.dumps(requests), capture_output=True, text=True,
                        timeout=600, env=env)
    assert cp.returncode == 0, cp.stderr[-4000:]
    out = {r["id"]: r for r in json.loads(cp.stdout)}
    sg: dict[str, dict[str, Any]] = {}
    for key, r in out.items():
        cid, tag = key.rsplit("::", 1)
        sg.setdefault(cid, {})[tag] = r
    for cid in sg:
        sg[cid].setdefault("auto", sg[cid]["main"])
    return reports, sg, input_errors


def test_case_count():
    assert len(CASES) >= 40


# checkpoint.load (runbook.model.checkpoint.check_config / check_hf_quant_config, not the quant stage) rejects
# these as malformed JSON types although SGLang starts: ModelOptFp8Config.from_config ignores a string
# kv_cache_scheme, ModelOptFp4Config.from_config reads it ("FP8" -> FP8 KV), and a non-object "quantization"
# in hf_quant_config.json makes _parse_modelopt_quant_config return None (served as unquantized).
KNOWN_LOAD_REJECTS_SGLANG_SERVES: set[str] = set()   # checkpoint.load refuses nothing SGLang starts with


def test_checkpoint_load_rejects_only_what_sglang_refuses(decided):
    _, sg, input_errors = decided
    served = {cid for cid in input_errors if not sg[cid]["main"]["refusal"]}
    assert served == KNOWN_LOAD_REJECTS_SGLANG_SERVES, {cid: input_errors[cid] for cid in served}


def _refused(rep) -> list[str]:
    return [f"{f.id}: {f.title}" for f in rep.findings if f.status == "fail" and f.id in REFUSAL_IDS]


@pytest.mark.parametrize("cid", list(CASES))
def test_matches_sglang(decided, cid):
    reports, sg, _ = decided
    rep, s = reports[cid], sg[cid]
    main, auto = s["main"], s["auto"]
    why = json.dumps(s, indent=1)[:3000]
    # refusal under the deployment's flags
    if main["refusal"]:
        assert _refused(rep), f"SGLang refuses ({main['refusal']}) but the project has no fail finding\n{why}"
        assert rep.weights.sglang_refusal
    else:
        assert not _refused(rep), f"SGLang accepts it but the project says it refuses: {_refused(rep)}\n{why}"
        assert rep.weights.sglang_quantization == main["quantization"], why
        assert rep.kv_cache.kv_cache_quant_algo == main["kv_cache_quant_algo"], why
        assert rep.kv_cache.auto_resolves_to == main["kv_cache_dtype"], why
    # the recommended --quantization is what SGLang picks by itself, and SGLang accepts it
    rec = rep.recommended_flags.get("quantization")
    if auto["refusal"] is None and auto["quantization"]:
        assert rec == auto["quantization"], why
    elif auto["refusal"] is not None:
        assert rec is None, why
    if rec:
        r = s["rec"]
        assert r["refusal"] is None and r["quantization"] == rec, why
        if auto["refusal"] is None and not main["refusal"] and s["main"]["quantization"] == rec:
            assert rep.kv_cache.auto_resolves_to == r["kv_cache_dtype"], why
    # quantize_config.json alone: SGLang reads it only under the flag; refusal there is the project's fail
    if "side" in s:
        f = {x.id: x for x in rep.findings}["quant.side_file"]
        assert (f.status == "fail") == bool(s["side"]["refusal"]), why
        if not s["side"]["refusal"]:
            assert rec == s["side"]["quantization"] and f.status == "warn", why


# ---- minimum compute capability, by GPU ----------------------------------------------------------------------
_CAP_CASES = ("real/modelopt nvfp4 llama-3.3 hf_quant_config", "fp8 with kv_cache_quant_algo FP8", "ct kv static per-tensor FP8",
              "gptq 8-bit", "modelopt flat FP8, kv_cache_scheme 'FP8' string", "modelopt flat MXFP8, kv dict",
              "modelopt hq MIXED_PRECISION without NVFP4 layers", "real/awq zephyr block on llama fp16",
              "real/nvfp4 hq + --quantization modelopt_fp8", "real/llama4 ct + --quantization w8a8_fp8")
_SMS = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")


def test_min_capability_table_is_sglangs():
    """model/quant_capability.MIN_CAPABILITY (the quant stage's and the KV plan's): each registered config class's own
    get_min_capability() on a CUDA host."""
    code = r"""
import json, sys
sys.path.insert(0, sys.argv[1]); import sglang_env; sglang_env.install()
from sglang.srt.layers import quantization as q
from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config
q.QUANTIZATION_METHODS.setdefault("mxfp4", Mxfp4Config)
out = {}
for name, cls in q.QUANTIZATION_METHODS.items():
    try:
        out[name] = cls.get_min_capability()
    except TypeError:   # an instance method: Fp8Config (fp8 / mxfp8 weights) and MiniMax-M3's
        if name in ("fp8", "mxfp8"):
            out[name] = cls.from_config({"quant_method": name, "activation_scheme": "dynamic"}).get_min_capability()
print(json.dumps(out))
"""
    cp = subprocess.run([str(SERVING_PY), "-c", code, str(REPO / "tests" / "oracle")], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    sglang = json.loads(cp.stdout)
    from runbook.model.quant_capability import MIN_CAPABILITY
    assert set(sglang) <= set(MIN_CAPABILITY)
    assert {k: MIN_CAPABILITY[k] for k in sglang} == sglang


def test_min_capability_refusals_at_each_gpu(tmp_path):
    """SGLang's loader refuses a quantization method below its minimum capability (modelopt_fp8 / w8a8_fp8 below 8.9,
    w4afp8 below 9.0, mxfp8 below 10.0, ...): the project fails exactly where SGLang refuses, at each GPU generation."""
    dirs, reqs = {}, []
    for i, cid in enumerate(_CAP_CASES):
        cfg, hq, files, flags = CASES[cid]
        dirs[cid] = make(tmp_path / f"c{i:02d}", cfg, hf_quant_config=hq, files=files)
        reqs.append({"id": cid, "model_dir": str(dirs[cid]), "argv": _argv(flags, flags.get("quantization"))})
    seen_refusal = set()
    for sm in _SMS:
        env = dict(os.environ, PYTHONPATH="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   RUNBOOK_ORACLE_SM=str(int(float(sm) * 10)))
        cp = subprocess.run([str(SERVING_PY), str(ORACLE)], input=json.dumps(reqs), capture_output=True, text=True,
                            timeout=600, env=env)
        assert cp.returncode == 0, cp.stderr[-4000:]
        for r in json.loads(cp.stdout):
            cid = r["id"]
            rep = quant.inspect_checkpoint(checkpoint.load(dirs[cid]), {k: v for k, v in CASES[cid][3].items() if k != "side"},
                                compute_capability=sm)
            refused = _refused(rep)
            assert bool(refused) == bool(r["refusal"]), (sm, cid, r["refusal"], refused)
            if r["refusal"] and "Minimum capability" in r["refusal"]["message"]:
                seen_refusal.add((cid, sm))
                said = [f"{f.title} {f.detail}" for f in rep.findings if f.status == "fail" and f.id in REFUSAL_IDS]
                assert any("Minimum capability" in x for x in said), (sm, cid, said)
    # the table is exercised: FP8 below 8.9, MXFP8 below 10.0, W4AFP8 below 9.0
    assert ("modelopt flat FP8, kv_cache_scheme 'FP8' string", "8.6") in seen_refusal
    assert ("modelopt flat MXFP8, kv dict", "9.0") in seen_refusal
    assert ("modelopt hq MIXED_PRECISION without NVFP4 layers", "8.9") in seen_refusal


def test_contradicting_quant_files_and_a_null_hf_quant_config_are_named(tmp_path):
    """config.json's quantization_config wins over hf_quant_config.json (ModelConfig._parse_quant_hf_config): a
    contradiction is a warn saying which one SGLang serves; "quantization": null makes SGLang ignore the file."""
    cfg, hq, files, _ = CASES["config.json fp8 block vs hq NVFP4"]
    rep = quant.inspect_checkpoint(checkpoint.load(make(tmp_path / "a", cfg, hf_quant_config=hq, files=files)), {})
    f = {x.id: x for x in rep.findings}["quant.conflict"]
    assert f.status == "warn" and "SGLang uses config.json" in f.title and "NVFP4" in f.title and "serves fp8" in f.detail
    same = quant.inspect_checkpoint(checkpoint.load(make(tmp_path / "b", llama(), hf_quant_config=ex(LLAMA33_FP4))), {})
    assert "quant.conflict" not in {x.id for x in same.findings}
    null = quant.inspect_checkpoint(checkpoint.load(make(tmp_path / "c", llama(), hf_quant_config={"producer": {"name": "modelopt"},
                                                                                         "quantization": None})), {})
    g = {x.id: x for x in null.findings}["quant.hf_quant_config"]
    assert g.status == "warn" and "ignores the file" in g.title and "no quantization" in g.detail
    assert null.weights.sglang_quantization is None
