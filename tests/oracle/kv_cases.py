"""Case table for the SGLang KV-sizing oracle (tests/oracle/sglang_kv.py).

``cases()`` returns the JSON the oracle reads: every model folder under
tests/fixtures/models/<name>/config.json (discovered, so new folders join automatically) plus
the project's default deployment. Run ``python tests/oracle/kv_cases.py > cases.json``.

``weights_bytes_per_gpu`` is an input to both sides, so it only has to be sane: a rough
parameter count from config.json times bytes per parameter for the checkpoint's quantization,
divided by tp*pp. A combination is only generated when those weights leave room for KV
(at most 72 % of the GPU), i.e. one SGLang would plausibly be launched with; a model that
fits nowhere is taken at TP 8 with its weights capped at 72 % of the GPU.
"""
from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "models")
DEFAULT_MODEL_DIRS = (
    os.path.join(ROOT, "models", "qwen3.5-397b-a17b-nvfp4"),
    os.path.join(FIXTURES, "qwen3.5-397b-a17b-nvfp4"),
)

GPUS = {
    "H200": {"name": "NVIDIA H200", "total_mib": 143771, "sm": "9.0"},
    "B200": {"name": "NVIDIA B200", "total_mib": 183359, "sm": "10.0"},
    "RTX6000": {"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "total_mib": 97887, "sm": "12.0"},
}
# GPUs used only by the cases that name them (not in the per-GPU loops). An 80 GiB A100 reports
# exactly 81,920 MiB: there SGLang's GiB-float budget truncates a byte below total × fraction − weights.
EXTRA_GPUS = {"A100": {"name": "NVIDIA A100-SXM4-80GB", "total_mib": 81920, "sm": "8.0"},
              # the GPU generations between Ampere and Hopper, where the quantization methods' minimum capability bites
              "A6000": {"name": "NVIDIA RTX A6000", "total_mib": 49140, "sm": "8.6"},
              "L40S": {"name": "NVIDIA L40S", "total_mib": 46068, "sm": "8.9"}}
GIB = 1 << 30
MIB = 1 << 20
SPEC = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
DEFAULT_FLAGS = ["--tp-size", "8", "--quantization", "modelopt_fp4", "--kv-cache-dtype", "bf16",
                 "--moe-runner-backend", "flashinfer_cutlass", "--attention-backend", "triton",
                 "--mem-fraction-static", "0.88", "--context-length", "262144",
                 "--chunked-prefill-size", "8192", "--trust-remote-code"]


# --------------------------------------------------------------------------------------
# Model facts from config.json
# --------------------------------------------------------------------------------------
def _load(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    hq = os.path.join(model_dir, "hf_quant_config.json")
    hf_quant = None
    if os.path.exists(hq):
        with open(hq) as f:
            hf_quant = json.load(f)
    return {"cfg": cfg, "hf_quant": hf_quant}


def _text(cfg: dict) -> dict:
    for k in ("text_config", "llm_config", "language_config"):
        if isinstance(cfg.get(k), dict):
            merged = dict(cfg[k])
            return merged
    return cfg


def _bytes_per_param(info: dict) -> float:
    cfg = info["cfg"]
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    algo = ""
    if info["hf_quant"]:
        algo = str((info["hf_quant"].get("quantization") or {}).get("quant_algo", "")).upper()
    algo = algo or str(q.get("quant_algo", "")).upper()
    if "FP4" in algo or method in ("mxfp4",) or "fp4" in method:
        return 0.6
    if "FP8" in algo or method in ("fp8", "compressed-tensors", "modelopt"):
        return 1.05
    return 2.0


def param_count(cfg: dict) -> float:
    t = _text(cfg)
    h = t.get("hidden_size", 4096)
    L = t.get("num_hidden_layers", 32)
    nq = t.get("num_attention_heads", 32)
    hd = t.get("head_dim") or h // max(nq, 1)
    nkv = t.get("num_key_value_heads", nq)
    vocab = t.get("vocab_size", cfg.get("vocab_size", 150000))
    attn = h * nq * hd * 2 + h * nkv * hd * 2
    if t.get("kv_lora_rank"):
        attn = h * (t.get("q_lora_rank") or h) + (t.get("q_lora_rank") or h) * nq * (
            t.get("qk_nope_head_dim", 128) + t.get("qk_rope_head_dim", 64)) + h * (
            t["kv_lora_rank"] + t.get("qk_rope_head_dim", 64)) + t["kv_lora_rank"] * nq * (
            t.get("qk_nope_head_dim", 128) + t.get("v_head_dim", 128)) + nq * t.get("v_head_dim", 128) * h
    experts = t.get("n_routed_experts") or t.get("num_experts") or t.get("num_local_experts") or 0
    moe_i = t.get("moe_intermediate_size") or t.get("intermediate_size", 4 * h)
    dense_i = t.get("intermediate_size", 4 * h)
    if experts:
        shared = t.get("n_shared_experts") or (1 if t.get("shared_expert_intermediate_size") else 0)
        mlp = 3 * h * moe_i * (experts + shared)
    else:
        mlp = 3 * h * dense_i
    return L * (attn + mlp) + 2 * vocab * h


def weights_per_gpu(info: dict, tp: int, pp: int) -> int:
    total = param_count(info["cfg"]) * _bytes_per_param(info)
    return int(total / (tp * pp))


def has_mtp(cfg: dict) -> bool:
    t = _text(cfg)
    arch = (cfg.get("architectures") or [""])[0]
    if (t.get("num_nextn_predict_layers") or 0) > 0:
        return True
    if (t.get("mtp_num_hidden_layers") or 0) > 0:
        return True
    return "Qwen3Next" in arch


def is_hybrid_linear(cfg: dict) -> bool:
    t = _text(cfg)
    arch = (cfg.get("architectures") or [""])[0]
    return bool(t.get("linear_num_value_heads") or "Qwen3Next" in arch or "Qwen3_5" in arch
                or "NemotronH" in arch or t.get("layer_types") and "linear_attention" in t.get("layer_types"))


def is_mla(cfg: dict) -> bool:
    return bool(_text(cfg).get("kv_lora_rank"))


def is_fp4_ckpt(info: dict) -> bool:
    return _bytes_per_param(info) < 1


def _quant_flag(info: dict) -> list[str]:
    """The --quantization flag a deployment passes for ModelOpt FP4 checkpoints."""
    algo = ""
    if info["hf_quant"]:
        algo = str((info["hf_quant"].get("quantization") or {}).get("quant_algo", "")).upper()
    q = info["cfg"].get("quantization_config") or {}
    algo = algo or str(q.get("quant_algo", "")).upper()
    if "FP4" in algo:
        return ["--quantization", "modelopt_fp4"]
    return []


def discover() -> list[tuple[str, str]]:
    out = []
    if os.path.isdir(FIXTURES):
        for name in sorted(os.listdir(FIXTURES)):
            d = os.path.join(FIXTURES, name)
            if os.path.isfile(os.path.join(d, "config.json")):
                out.append((name, d))
    return out


# --------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------
def _case(cid, model_dir, argv, gpu, weights):
    return {"id": cid, "model_dir": model_dir, "argv": list(argv), "gpu": dict({**GPUS, **EXTRA_GPUS}[gpu]),
            "weights_bytes_per_gpu": int(weights)}


def _fits(info, gpu, tp, pp=1, frac=0.72):
    return weights_per_gpu(info, tp, pp) <= frac * {**GPUS, **EXTRA_GPUS}[gpu]["total_mib"] * MIB


def _min_tp(info, gpu):
    """Smallest TP whose weights fit; 8 when none does (weights are then capped, see add())."""
    for tp in (1, 2, 4, 8):
        if _fits(info, gpu, tp):
            return tp
    return 8


def cases() -> list[dict]:  # noqa: C901  (one flat table, read top to bottom)
    out: list[dict] = []
    seen = set()

    def add(name, model_dir, info, gpu, tp, argv=(), tag="", pp=1, weights=None):
        if tp * pp > 8:
            return
        if weights is None:
            # Models too big for 8 GPUs at their checkpoint precision (e.g. BF16 GLM-5, Kimi-K2 on
            # H200) are taken as deployed in a smaller precision: weights capped at 72 % of the GPU.
            weights = min(weights_per_gpu(info, tp, pp), int(0.72 * {**GPUS, **EXTRA_GPUS}[gpu]["total_mib"] * MIB))
        full = ["--tp-size", str(tp)] + (["--pp-size", str(pp)] if pp > 1 else []) + _quant_flag(info) + list(argv)
        cid = f"{name}|{gpu}|tp{tp}" + (f"pp{pp}" if pp > 1 else "") + (f"|{tag}" if tag else "")
        if cid in seen:
            return
        seen.add(cid)
        out.append(_case(cid, model_dir, full, gpu, weights))

    # 1. The project's default deployment, exactly (RTX PRO 6000, 233 GiB / 8 per GPU).
    default_dir = next((d for d in DEFAULT_MODEL_DIRS if os.path.isfile(os.path.join(d, "config.json"))), None)
    if default_dir:
        w = 233 * GIB // 8
        out.append(_case("default|as-is", default_dir, DEFAULT_FLAGS, "RTX6000", w))
        out.append(_case("default|mtp", default_dir, DEFAULT_FLAGS + SPEC, "RTX6000", w))
        no_mfs = [a for i, a in enumerate(DEFAULT_FLAGS)
                  if a != "--mem-fraction-static" and (i == 0 or DEFAULT_FLAGS[i - 1] != "--mem-fraction-static")]
        out.append(_case("default|no-mem-fraction", default_dir, no_mfs, "RTX6000", w))
        seen.update({"default|as-is", "default|mtp", "default|no-mem-fraction"})

    models = discover()
    for name, d in models:
        try:
            info = _load(d)
        except Exception:
            continue
        cfg = info["cfg"]
        mla, hybrid, mtp = is_mla(cfg), is_hybrid_linear(cfg), has_mtp(cfg)

        # 2. Baseline per GPU: smallest TP that fits, and TP 8; auto KV dtype.
        for gpu in GPUS:
            tmin = _min_tp(info, gpu)
            if tmin is None:
                continue
            add(name, d, info, gpu, tmin, ["--kv-cache-dtype", "auto"], "auto")
            add(name, d, info, gpu, 8, ["--kv-cache-dtype", "auto"], "auto")
            if tmin < 4 and _fits(info, gpu, 4):
                add(name, d, info, gpu, 4, [], "default")

        tp_b = _min_tp(info, "B200")
        tp_h = _min_tp(info, "H200")
        tp_r = _min_tp(info, "RTX6000")

        # 3. KV dtypes (mxfp8/nvfp4 refused on Hopper by SGLang; valid expected results).
        if tp_b:
            for kv in ("bf16", "fp8_e4m3", "mxfp8", "nvfp4", "fp4_mx_block16"):
                add(name, d, info, "B200", tp_b, ["--kv-cache-dtype", kv], kv)
            # FP4 KV per attention backend: the recipe's scale layouts and dequant workspace follow the
            # (prefill, decode) pair SGLang resolves; NVFP4 on MLA starts with FlashInfer prefill
            for kv, be in (("nvfp4", "flashinfer"), ("nvfp4", "trtllm_mha"), ("fp4_mx_block16", "flashinfer"),
                           ("fp4_mx_block16", "triton")):
                add(name, d, info, "B200", tp_b, ["--kv-cache-dtype", kv, "--attention-backend", be], f"{kv}-{be}")
        if tp_h:
            for kv in ("fp8_e4m3", "nvfp4"):
                add(name, d, info, "H200", tp_h, ["--kv-cache-dtype", kv], kv)
        if tp_r:
            add(name, d, info, "RTX6000", tp_r, ["--kv-cache-dtype", "fp8_e4m3"], "fp8_e4m3")
            add(name, d, info, "RTX6000", tp_r, ["--kv-cache-dtype", "nvfp4"], "nvfp4")
            add(name, d, info, "RTX6000", tp_r, ["--kv-cache-dtype", "fp4_mx_block16"], "fp4_mx_block16")
            add(name, d, info, "RTX6000", tp_r, ["--kv-cache-dtype", "nvfp4", "--attention-backend", "trtllm_mha"],
                "nvfp4-trtllm_mha")

        # 4. Speculative decoding with the model's own MTP layers.
        if mtp:
            for gpu in ("H200", "B200", "RTX6000"):
                t = _min_tp(info, gpu)
                if t:
                    add(name, d, info, gpu, max(t, 8 if gpu == "RTX6000" else t), SPEC, "mtp")
            if tp_b:
                add(name, d, info, "B200", tp_b, SPEC + ["--kv-cache-dtype", "fp8_e4m3"], "mtp-fp8")
            if tp_b and hybrid:   # the draft worker's own FP4 pool: one layer's data, scales and dequant workspace
                add(name, d, info, "B200", tp_b, SPEC + ["--kv-cache-dtype", "nvfp4"], "mtp-nvfp4")
                add(name, d, info, "B200", tp_b, SPEC + ["--kv-cache-dtype", "nvfp4", "--attention-backend", "flashinfer"],
                    "mtp-nvfp4-flashinfer")
                add(name, d, info, "B200", tp_b, SPEC + ["--kv-cache-dtype", "fp4_mx_block16"], "mtp-fp4_mx_block16")

        # 5. PP 2 (TP 4) where it fits.
        for gpu in ("H200", "B200"):
            if _fits(info, gpu, 4, 2) and name in _PP_MODELS:
                add(name, d, info, gpu, 4, [], "default", pp=2)
                if mtp and gpu == "H200":
                    add(name, d, info, gpu, 4, SPEC, "mtp", pp=2)

        # 6. Attention DP (both spellings), MLA and GQA.
        if _fits(info, "H200", 8) and name in _DP_MODELS:
            dp = 8 if mla else 2
            add(name, d, info, "H200", 8, ["--dp-size", str(dp), "--enable-dp-attention"], f"dp{dp}")
            add(name, d, info, "B200", 8, ["--attn-dp-size", "4"], "attn-dp4")
            if mtp:
                add(name, d, info, "H200", 8, ["--dp-size", str(dp), "--enable-dp-attention"] + SPEC, f"dp{dp}-mtp")

        # 7. Flags on one representative launch per model.
        gpu, t = ("H200", tp_h) if tp_h else ("B200", tp_b)
        if t:
            add(name, d, info, gpu, t, ["--mem-fraction-static", "0.85"], "mfs0.85")
            add(name, d, info, gpu, t, ["--chunked-prefill-size", "4096"], "cps4096")
            add(name, d, info, gpu, t, ["--max-running-requests", "64"], "mrr64")
            add(name, d, info, gpu, t, ["--page-size", "64"], "page64")
            add(name, d, info, gpu, t, ["--context-length", "1048576"], "ctx1M")
            if hybrid:
                add(name, d, info, gpu, t, ["--mamba-ssm-dtype", "bfloat16"], "ssm-bf16")
                add(name, d, info, gpu, t, ["--disable-radix-cache"], "no-radix")
                add(name, d, info, gpu, t, ["--disable-radix-cache", "--max-running-requests", "64"], "no-radix-mrr64")
                if mtp:
                    add(name, d, info, gpu, t, SPEC + ["--mamba-ssm-dtype", "bfloat16"], "mtp-ssm-bf16")
            else:
                add(name, d, info, gpu, t, ["--disable-radix-cache"], "no-radix")
        # 8. An explicit --mem-fraction-static on an 80 GiB A100: the budget to the byte.
        for tp in (1, 2, 4, 8):
            if _fits(info, "A100", tp, frac=0.6) and _bytes_per_param(info) >= 2:   # FP8/FP4 need SM89+
                for mfs in ("0.85", "0.7"):
                    add(name, d, info, "A100", tp, ["--mem-fraction-static", mfs], f"mfs{mfs}")
                break
        # 9. TP 3: divides neither 32/64 attention heads nor 8 KV heads (SGLang's QKV layer refuses).
        if name in _TP3_MODELS:
            add(name, d, info, "H200", 3, [], "tp3")
        # 10. Attention backends where they matter.
        if tp_b:
            if mla:
                for be in ("flashinfer", "triton", "trtllm_mla"):
                    add(name, d, info, "B200", tp_b, ["--attention-backend", be], f"attn-{be}")
            else:
                for be in ("triton", "flashinfer", "trtllm_mha"):
                    add(name, d, info, "B200", tp_b, ["--attention-backend", be], f"attn-{be}")
        if tp_h and not mla:
            add(name, d, info, "H200", tp_h, ["--attention-backend", "flashinfer"], "attn-flashinfer")
        if tp_r:
            add(name, d, info, "RTX6000", tp_r, ["--attention-backend", "triton"], "attn-triton")
        # 11. Quantized checkpoints on the GPU generations below Hopper: SGLang's loader refuses a method below its
        # get_min_capability() (ModelOpt FP8 needs 8.9), the others start.
        if name in _QUANT_GENERATION_MODELS:
            for gpu in ("A100", "A6000", "L40S"):
                add(name, d, info, gpu, _min_tp(info, gpu), [], "sm-generation")
    # 12. An explicit --mem-fraction-static on GPUs given in decimal GiB, as specs give them (whole bytes on SGLang's side).
    for name, gpu, tp, mfs in (("llama-3.1-70b", "H200-140.4", 2, "0.85"), ("llama-3.1-70b", "B200-179.06", 2, "0.85"),
                               ("qwen3-vl-235b-a22b-thinking", "H200-140.4", 8, "0.85"),
                               ("qwen3.5-397b-a17b-nvfp4", "RTX6000-95.59", 8, "0.88")):
        d = os.path.join(FIXTURES, name)
        if os.path.isfile(os.path.join(d, "config.json")):
            info = _load(d)
            out.append({"id": f"{name}|{gpu}|tp{tp}|mfs{mfs}", "model_dir": d, "gpu": dict(SWEEP_GPUS[gpu]),
                        "argv": ["--tp-size", str(tp), *_quant_flag(info), "--mem-fraction-static", mfs],
                        "weights_bytes_per_gpu": weights_per_gpu(info, tp, 1)})
    # 13. The budget across GPU memory sizes, fractions, weights and world sizes (float32 free memory above one rank).
    out += sweep_cases()
    return out


# GPUs of the memory sweep: the memory.total (MiB) each reports, beside GPUS and EXTRA_GPUS
SWEEP_GPUS = {"A100-40": {"name": "NVIDIA A100-SXM4-40GB", "total_mib": 40960, "sm": "8.0"},
              "H100": {"name": "NVIDIA H100 80GB HBM3", "total_mib": 81559, "sm": "9.0"},
              "H100-NVL": {"name": "NVIDIA H100 NVL", "total_mib": 95830, "sm": "9.0"},
              "L4": {"name": "NVIDIA L4", "total_mib": 23034, "sm": "8.9"},
              "RTX4090": {"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564, "sm": "8.9"},
              # GPU memory as a spec author writes it, in decimal GiB: not a whole number of bytes, while the memory
              # SGLang measures always is
              "H200-140.4": {"name": "NVIDIA H200", "memory_gib": 140.4, "sm": "9.0"},
              "B200-179.06": {"name": "NVIDIA B200", "memory_gib": 179.06, "sm": "10.0"},
              "RTX6000-95.59": {"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "memory_gib": 95.59, "sm": "12.0"},
              "H100-79.6": {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.6, "sm": "9.0"}}
# one model per budget path: GQA, hybrid linear attention (state pool, also multimodal), MLA, multimodal
# reservation, and the FP4 checkpoint of the default deployment (SM100/SM120 only)
_SWEEP_MODELS = ("llama-3.1-70b", "qwen3.5-27b", "glm-4.7-flash", "gemma-3-27b-it", "qwen3.5-397b-a17b-nvfp4")
_SWEEP_FRACTIONS = (None, "0.5", "0.613", "0.7", "0.77", "0.837", "0.85", "0.88", "0.9", "0.93", "0.951")


def sweep_cases(seed: int = 35, random_gpus: int = 14) -> list[dict]:
    """The KV+state budget across GPU memory sizes: every GPU above (NVML totals, and decimal GiB figures as specs
    give them) and `random_gpus` more of random size (16-200 GiB, by MiB or in decimal GiB), each with every sweep
    model at a random TP/PP, memory fraction (None: SGLang's default) and weights per GPU (a random share of the
    memory, not a round number of bytes). Seeded: the same cases every run."""
    import random

    rng = random.Random(seed)
    gpus = {**GPUS, **EXTRA_GPUS, **SWEEP_GPUS}
    for i in range(random_gpus):
        sm = rng.choice(("8.0", "9.0", "10.0", "12.0"))
        if i % 2:
            mib = rng.randrange(16 * 1024, 200 * 1024)
            gpus[f"sweep{i}"] = {"name": f"GPU with {mib} MiB", "total_mib": mib, "sm": sm}
        else:
            gib = round(rng.uniform(16, 200), rng.choice((1, 2, 3)))
            gpus[f"sweep{i}"] = {"name": f"GPU with {gib} GiB", "memory_gib": gib, "sm": sm}
    out = []
    for gname, gpu in gpus.items():
        for name in _SWEEP_MODELS:
            d = os.path.join(FIXTURES, name)
            if not os.path.isfile(os.path.join(d, "config.json")):
                continue
            info = _load(d)
            if is_fp4_ckpt(info) and float(gpu["sm"]) < 10:
                continue   # NVFP4 weights need Blackwell: a refusal, not a budget
            for _ in range(2):
                tp, pp = rng.choice(((1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2)))
                frac = rng.choice(_SWEEP_FRACTIONS)
                weights = int((gpu.get("memory_gib") or gpu["total_mib"] / 1024) * GIB * rng.uniform(0.03, 0.6))
                argv = (["--tp-size", str(tp)] + (["--pp-size", str(pp)] if pp > 1 else []) + _quant_flag(info)
                        + (["--mem-fraction-static", frac] if frac else []))
                cid = f"sweep|{name}|{gname}|tp{tp}" + (f"pp{pp}" if pp > 1 else "") + f"|mfs{frac or 'default'}|w{weights}"
                out.append({"id": cid, "model_dir": d, "argv": argv, "gpu": dict(gpu), "weights_bytes_per_gpu": weights})
    return out


_QUANT_GENERATION_MODELS = {"llama-3.1-70b-instruct-fp8", "qwen3.5-397b-a17b-nvfp4", "gpt-oss-120b"}


_TP3_MODELS = {"llama-3.1-70b", "qwen3-32b-nvfp4", "glm-4.7-flash", "deepseek-v3"}
_PP_MODELS = {"llama-3.1-70b", "llama-3.3-70b-instruct", "qwen3.5-397b-a17b", "qwen3.5-397b-a17b-nvfp4",
              "deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "qwen3-next-80b-a3b-thinking", "qwen3.5-27b",
              "glm-4.7", "llama-4-scout-17b-16e-instruct", "gemma-3-27b-it"}
_DP_MODELS = {"deepseek-v3", "deepseek-v3.2", "kimi-k2-instruct", "kimi-k2.5", "glm-5", "glm-4.7-flash",
              "llama-3.1-70b", "qwen3.5-397b-a17b", "qwen3.5-397b-a17b-nvfp4", "qwen3-next-80b-a3b-thinking",
              "glm-4.7", "gpt-oss-120b"}


if __name__ == "__main__":
    print(json.dumps(cases()))
