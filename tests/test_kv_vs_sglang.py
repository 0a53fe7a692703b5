"""Differential test: every KV figure the runbook prints equals SGLang 0.5.23's own, case by case.

The oracle (tests/oracle/sglang_kv.py) runs in the serving venv and drives SGLang's argument parser,
server-argument resolution, ModelConfig, KV-dtype resolution, pool configurator and
resolve_max_num_reqs on CPU; only the GPU probes are emulated (listed in its docstring). The
cases (tests/oracle/kv_cases.py) cover the real model configs in tests/fixtures/models over TP, PP,
attention DP, KV dtypes, speculative decoding, GPUs and memory flags. The runbook side goes through
the same entry point as `runbook kv` and notebook 20: a deployment spec whose flags are the case's argv.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import REPO, spec_data

from runbook import kv
from runbook.core import spec as spec_mod
from runbook.core.errors import InputError, SpecError

ORACLE = REPO / "tests" / "oracle"
SERVING_PY = os.environ.get("RUNBOOK_SERVING_PYTHON") or str(REPO / ".venv-serving" / "bin" / "python")
pytestmark = [pytest.mark.serving,
              pytest.mark.skipif(not Path(SERVING_PY).exists(), reason=f"no serving venv at {SERVING_PY} (make serving-env)")]

sys.path.insert(0, str(ORACLE))
import kv_cases  # noqa: E402

CASES = kv_cases.cases()
# Findings that mean "SGLang would not start with this": the runbook must say so where SGLang refuses.
REFUSAL_IDS = {"kv.context", "kv.state_pool", "kv.budget", "kv.dtype", "kv.refused"}
_PARALLEL = {"--tp-size": "tp", "--tp": "tp", "--pp-size": "pp", "--pp": "pp", "--dp-size": "attn_dp", "--dp": "attn_dp",
             "--attn-dp-size": "attn_dp"}


@lru_cache(maxsize=1)
def oracle() -> dict[str, dict]:
    proc = subprocess.run([SERVING_PY, str(ORACLE / "sglang_kv.py")], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=900, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads(proc.stdout)}


def _typed(v: str):
    """An argv word as the YAML scalar a spec author would write (8 → int, 0.88 → float)."""
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def argv_to_spec(case: dict) -> spec_mod.Deployment:
    """The case's SGLang argv as a deployment spec: parallelism from the parallel flags, the rest as serving.flags."""
    argv, flags, par = list(case["argv"]), {}, {"tp": 1, "pp": 1, "attn_dp": 1}
    dp_attention = "--enable-dp-attention" in argv
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        takes_value = nxt is not None and not nxt.startswith("--")
        if a in _PARALLEL and takes_value:
            par[_PARALLEL[a]] = int(nxt)
        elif a == "--enable-dp-attention":
            pass
        elif takes_value:
            flags[a[2:]] = _typed(nxt)
        else:
            flags[a[2:]] = True
        i += 2 if takes_value else 1
    if not dp_attention and "--attn-dp-size" not in argv:
        par["attn_dp"] = 1
    gpu = case["gpu"]
    n = par["tp"] * par["pp"]
    data = spec_data(**{"model.path": case["model_dir"], "model.card": None, "model.size_gib": None,
                        "hardware.gpu_count": max(8, n), "hardware.gpu_memory_gib": gpu.get("memory_gib") or gpu["total_mib"] / 1024,
                        "hardware.compute_capability": gpu["sm"], "hardware.gpu_model": gpu["name"],
                        "parallelism.tp": par["tp"], "parallelism.pp": par["pp"], "parallelism.attn_dp": par["attn_dp"],
                        "serving.flags": flags})
    return spec_mod.from_dict(data, f"<case {case['id']}>")


def runbook_figures(case: dict) -> dict:
    try:
        dep = argv_to_spec(case)
        p = kv.assess(dep, case["model_dir"], weights_gib=case["weights_bytes_per_gpu"] / 2**30)
    except (InputError, SpecError) as e:
        return {"input_error": str(e)}
    r = p.result
    return {"plan": p, "refusals": [f for f in p.findings if f.status == "fail" and f.id in REFUSAL_IDS],
            "mem_fraction_static": r.mem_fraction_static, "context_len": r.context_len, "page_size": r.page_size,
            "kv_cache_dtype": r.kv_dtype, "cell_size": r.kv_bytes_per_token_per_gpu,
            "cell_bytes": max(s["cell_bytes"] for s in r.stages),   # unrounded: hybrid SWA's is fractional
            "state_bytes_per_request": r.state_bytes_per_request_per_gpu or None,
            "state_pool_bytes": r.state_pool_bytes_per_gpu if r.max_state_slots is not None else None,
            "mamba_slots_per_request": r.state_slots_per_request or None, "max_mamba_cache_size": r.max_state_slots,
            "max_total_num_tokens": r.max_total_num_tokens, "swa_max_total_num_tokens": r.swa_tokens,
            "max_running_requests": r.max_running_requests, "rest_bytes": r.kv_budget_bytes_per_gpu,
            "kv_budget_bytes": r.kv_pool_bytes_per_gpu, "draft_pool_bytes_per_token": r.draft_kv_bytes_per_token_per_gpu}


def differences(case: dict, want: dict, got: dict) -> list[str]:
    if "input_error" in got:
        return [f"runbook refused the inputs: {got['input_error']}"]
    if want.get("refused"):
        return [] if got["refusals"] else [f"SGLang refuses ({want['refused'][:160]}) but the runbook has no fail finding"]
    out = [f"runbook says SGLang refuses ({f.id}: {f.title}) but SGLang starts" for f in got["refusals"]]
    want = dict(want)
    ranks = want.get("pp_ranks") or []
    if len(ranks) > 1:
        # the runbook prints the binding (largest) stage; the oracle's top level is PP rank 0
        want["total_cell_size"] = max(r["total_cell_size"] for r in ranks)
    if want.get("state_bytes_per_slot") is not None:
        # what SGLang's MambaPool holds per slot and in all on the rank with the most linear layers
        binding = max(ranks or [want], key=lambda r: r["state_bytes_per_slot"])
        want["state_bytes_per_request"] = binding["state_bytes_per_slot"]
        want["state_pool_bytes"] = binding["state_pool_allocated_bytes"]
    for key in ("context_len", "page_size", "kv_cache_dtype", "state_bytes_per_request", "state_pool_bytes",
                "mamba_slots_per_request",
                "max_mamba_cache_size", "max_total_num_tokens", "swa_max_total_num_tokens", "max_running_requests",
                "rest_bytes", "kv_budget_bytes"):   # the KV+state budget and the KV pool's share of it, to the byte
        if key in want and want[key] != got[key]:
            out.append(f"{key}: SGLang {want[key]!r}, runbook {got[key]!r}")
    if want.get("draft_pool_bytes_per_token") is not None and want["draft_pool_bytes_per_token"] != got[
            "draft_pool_bytes_per_token"]:   # the MTP draft worker's own pool on a hybrid linear-attention model
        out.append(f"draft pool bytes/token: SGLang {want['draft_pool_bytes_per_token']!r}, "
                   f"runbook {got['draft_pool_bytes_per_token']!r}")
    cell = want.get("total_cell_size", want.get("cell_size"))   # target + draft: what the pool divides by
    if cell is not None and (cell != got["cell_bytes"] or math.ceil(cell) != got["cell_size"]):
        out.append(f"cell_size: SGLang {cell!r}, runbook {got['cell_bytes']!r} ({got['cell_size']!r} B/token printed)")
    if want.get("mem_fraction_static") is not None and want["mem_fraction_static"] != got["mem_fraction_static"]:
        out.append(f"mem_fraction_static: SGLang {want['mem_fraction_static']!r}, runbook {got['mem_fraction_static']!r}")
    return out


def test_the_table_is_big_enough():
    assert len(CASES) >= 150
    models = {Path(c["model_dir"]).name for c in CASES}
    assert len(models) >= 10, models


def test_the_oracle_ran_every_case():
    res = oracle()
    assert set(res) == {c["id"] for c in CASES}
    broken = {k: v["oracle_error"] for k, v in res.items() if v.get("oracle_error")}
    assert not broken, broken


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_runbook_equals_sglang(case):
    want = oracle()[case["id"]]
    if want.get("oracle_error"):
        pytest.fail(f"oracle could not run this case: {want['oracle_error']}")
    diffs = differences(case, want, runbook_figures(case))
    assert not diffs, f"{case['id']} ({' '.join(case['argv'])}):\n  " + "\n  ".join(diffs)


_LISTS = r"""
import inspect, json, re, sys
sys.path.insert(0, sys.argv[1]); import sglang_env; sglang_env.install()
import sglang.srt.configs.model_config as m
src = inspect.getsource(m.ModelConfig)
shapes = inspect.getsource(m.ModelConfig._derive_model_shapes)   # every branch that sets AttentionArch.MLA
mla = set()
for block in re.split(r"\n        (?=if |elif |else:)", shapes):
    if "attention_arch = AttentionArch.MLA" in block:
        mla |= set(re.findall(r'"(\w+)" in self.hf_config.architectures', block.split("self.attention_arch")[0]))
hs = inspect.getsource(m.is_hybrid_swa_model); hs = hs[hs.index("hybrid_swa_archs = {"):]; hs = hs[:hs.index("}")]
import sglang.srt.configs.hybrid_arch as H
import sglang.srt.configs.linear_attn_model_registry as R
import sglang.srt.configs.gigachat35  # noqa: F401  (registers itself with R)
state = {v.model_type for k, v in vars(H).items() if k.endswith("Config") and isinstance(v, type)}
state |= {s.config_class.model_type for s in R._LINEAR_ATTN_MODEL_REGISTRY}
state |= set(re.findall(r'"model_type", None\) == "(\w+)"', inspect.getsource(H)))
import transformers
ctx = {}
for mt in json.loads(sys.argv[2]):
    ctx[mt] = getattr(transformers.AutoConfig.for_model(mt), "max_position_embeddings", None)
print(json.dumps({
    "MULTIMODAL_ARCHS": list(m.multimodal_model_archs),
    "MULTIMODAL_BREAKABLE_GRAPH_ARCHS": list(m.multimodal_breakable_cuda_graph_supported_model_archs),
    "MLA_ARCHS": sorted(mla),
    "HYBRID_SWA_ARCHS": re.findall(r'"(\w+)"', hs) + list(m.SWA_SINK_ARCHS) + list(m.MIMO_V2_MODEL_ARCHS),
    "SWA_SINK_ARCHS": list(m.SWA_SINK_ARCHS), "MIMO_V2_ARCHS": list(m.MIMO_V2_MODEL_ARCHS),
    "DSA_ARCHS": [a for a in re.findall(r'"(\w+)"', inspect.getsource(m.is_deepseek_dsa)) if a != "index_topk"],
    "STATE_POOL_MODEL_TYPES": sorted(state), "context_defaults": ctx,
    "sglang_context_defaults": {"kimi_linear": __import__("sglang.srt.configs", fromlist=["x"]).KimiLinearConfig().max_position_embeddings},
    "MAMBA_EXTRA_BUFFER_ARCHS": sorted(__import__("sglang.srt.arg_groups.overrides", fromlist=["x"])._MAMBA_EXTRA_BUFFER_ARCHS)}))
"""


def test_architecture_names_and_context_defaults_are_sglangs():
    """sglang_names.py's sets are SGLang's lists; HF_CONTEXT_DEFAULTS are transformers' config-class defaults."""
    from runbook.model import arch, sglang_names

    proc = subprocess.run([SERVING_PY, "-c", _LISTS, str(ORACLE), json.dumps(sorted(arch.HF_CONTEXT_DEFAULTS))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    for name in ("MULTIMODAL_ARCHS", "MULTIMODAL_BREAKABLE_GRAPH_ARCHS", "MLA_ARCHS", "HYBRID_SWA_ARCHS", "SWA_SINK_ARCHS",
                 "MIMO_V2_ARCHS", "DSA_ARCHS", "STATE_POOL_MODEL_TYPES", "MAMBA_EXTRA_BUFFER_ARCHS"):
        assert set(got[name]) == set(getattr(sglang_names, name)), name
    assert got["context_defaults"] == arch.HF_CONTEXT_DEFAULTS
    assert got["sglang_context_defaults"] == arch.SGLANG_CONTEXT_DEFAULTS


_KV_DTYPES = r"""
import argparse, json, sys, types
sys.path.insert(0, sys.argv[1]); import sglang_env; sglang_env.install()
import torch
from sglang.srt.server_args import ServerArgs
from sglang.srt.mem_cache import kv_cache_dtype as kvd
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
choices = next(a.choices for a in p._actions if "--kv-cache-dtype" in a.option_strings)
kvd.current_platform = types.SimpleNamespace(is_cpu=lambda: False)   # fp8_e5m2 is refused on CPU only
pools = {}
for c in choices:
    for model_dtype in (torch.bfloat16, torch.float16, torch.float32):
        _, dt = kvd.configure_kv_cache_dtype(server_args_kv_cache_dtype=c, model=None, model_dtype=model_dtype, is_draft_worker=False,
                                             is_dflash=False, speculative_draft_attention_backend=None)
        pools[f"{c} {model_dtype}"] = [str(dt), dt.itemsize * 8]
print(json.dumps({"choices": list(choices), "pools": pools,
                  "to_str": {str(k): v for k, v in kvd.TORCH_DTYPE_TO_KV_CACHE_STR.items()}}))
"""


def test_kv_dtype_table_is_sglangs():
    """model/sglang_names.py's KV table: the --kv-cache-dtype choices are SGLang's parser's, in its order; each
    choice's pool dtype (what the "KV Cache is allocated. dtype:" line prints) and bits are configure_kv_cache_dtype's,
    and SGLang's own torch-dtype -> name map agrees with the table's."""
    from runbook.model import sglang_names as names

    proc = subprocess.run([SERVING_PY, "-c", _KV_DTYPES, str(ORACLE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert tuple(got["choices"]) == names.KV_CACHE_DTYPE_CHOICES
    for key, (torch_dtype, itemsize_bits) in got["pools"].items():
        flag, model_dtype = key.split()
        d = names.kv_dtype(model_dtype) if flag == "auto" else names.kv_dtype(flag)
        assert d is not None and f"torch.{d.torch}" == torch_dtype, key
        resolved = names.kv_dtype(torch_dtype)   # the log's dtype reads back as this storage (mxfp8 as fp8_e4m3)
        assert resolved is not None and resolved.torch == d.torch, key
        # float4_e2m1fn_x2 packs two 4-bit elements into each byte
        assert d.bits * (2 if d.torch.endswith("_x2") else 1) == itemsize_bits, key
    for torch_dtype, sglang_name in got["to_str"].items():
        assert names.kv_dtype_name(torch_dtype) == names.kv_dtype_name(sglang_name), torch_dtype


_QKV = r"""
import json, sys
sys.path.insert(0, sys.argv[1]); import sglang_env; sglang_env.install()
import sglang.srt.layers.linear as L
L._resolve_linear_group = lambda g: g
out = {}
for h, kv, tp in json.loads(sys.argv[2]):
    L.get_group_rank_size = lambda g, tp=tp: (0, tp)     # the attention-TP group's size; nothing else is read
    try:
        L.QKVParallelLinear(hidden_size=64, head_size=8, total_num_heads=h, total_num_kv_heads=kv, bias=False, quant_config=None)
        out[f"{h},{kv},{tp}"] = None
    except AssertionError as e:
        out[f"{h},{kv},{tp}"] = str(e)
print(json.dumps(out))
"""


def test_attention_tp_that_does_not_fit_the_heads_is_refused_like_sglangs_qkv_layer():
    """SGLang's own QKVParallelLinear decides which attention TP sizes load (TP 3 on 32 or 64 heads does not):
    the runbook fails exactly there, naming the head counts, SGLang's message and the valid sizes."""
    from runbook.kv import memory as kvmem
    from runbook.model import arch

    grid = [(h, nkv, tp) for h, nkv in ((32, 8), (64, 8), (32, 32), (64, 64), (40, 8), (28, 4), (96, 8), (64, 4))
            for tp in range(1, 17)]
    proc = subprocess.run([SERVING_PY, "-c", _QKV, str(ORACLE), json.dumps(grid)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sglang = json.loads(proc.stdout)
    assert sglang["32,8,3"] == "32 is not divisible by 3" and sglang["64,8,8"] is None
    for h, nkv, tp in grid:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": h,
               "num_key_value_heads": nkv, "hidden_size": 64 * h, "max_position_embeddings": 4096}
        r = kvmem.compute(arch.from_config(cfg), kvmem.Inputs(tp=tp))
        fails = [f for f in r.findings if f.id == "kv.refused" and "attention TP" in f.title]
        why = sglang[f"{h},{nkv},{tp}"]
        assert bool(fails) == (why is not None), (h, nkv, tp, why)
        if fails:
            assert f'"{why}"' in fails[0].title and f"{h} attention heads and {nkv} KV heads" in fails[0].title, fails[0].title
            valid = [t for t in range(1, 17) if sglang[f"{h},{nkv},{t}"] is None]
            assert all(str(t) in fails[0].remedy.split("of ")[1].rstrip(".").split(", ") for t in valid), fails[0].remedy


def test_the_default_spec_plans_what_sglang_sizes_on_its_gpus():
    """deployments/'s default spec, as `runbook kv` reads it (no flags added), against the oracle's default case
    (SGLang on the GPU's NVML memory.total): the same budget to the byte, tokens, state slots and running requests."""
    want = oracle()["default|as-is"]
    case = next(c for c in CASES if c["id"] == "default|as-is")
    dep = spec_mod.load()
    assert dep.hardware.gpu_memory_gib * 1024 == case["gpu"]["total_mib"]   # the figure NVML reports
    assert int(dep.model.size_gib * 2**30) // dep.hardware.gpu_count == case["weights_bytes_per_gpu"]
    r = kv.assess(dep).result
    got = (r.kv_budget_bytes_per_gpu, r.max_total_num_tokens, r.max_state_slots, r.max_running_requests)
    assert got == (want["rest_bytes"], want["max_total_num_tokens"], want["max_mamba_cache_size"],
                   want["max_running_requests"]), got
    assert want["max_running_requests"] == 232


def test_the_mtp_draft_pool_of_hybrid_models_is_the_one_sglang_builds():
    """The MTP draft worker's own KV pool on hybrid linear-attention models, built by SGLang's code for every
    speculative case (oracle: the draft's ModelConfig, KV dtype and layer info, _build_token_to_kv_pool): one
    full-attention layer with the target's token count. The story's deployment: 1,024 B/token (was planned as 0)."""
    measured = {k: v["draft_pool_bytes_per_token"] for k, v in oracle().items() if v.get("draft_pool_bytes_per_token")}
    families = {k.split("|")[0] for k in measured}
    assert {"default", "qwen3.5-397b-a17b", "qwen3-next-80b-a3b-thinking", "nemotron-3-super-120b-a12b"} <= families, families
    assert measured["default|mtp"] == 1024 and measured["qwen3.5-397b-a17b|B200|tp8|mtp-fp8"] == 512
    r = runbook_figures(next(c for c in CASES if c["id"] == "default|mtp"))["plan"].result
    assert (r.draft_kv_bytes_per_token_per_gpu, r.draft_kv_budget_bytes_per_token_per_gpu) == (1024, 0)
    assert r.draft_kv_pool_bytes_per_gpu == (r.max_total_num_tokens + r.page_size) * 1024
