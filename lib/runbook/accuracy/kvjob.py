"""Run in the SERVING interpreter (torch, transformers), never imported by the runbook: `python kvjob.py JOB.json`.

Captures the K and V a decoder caches, per layer and KV head, with transformers on CPU in float32 (the FP32
reference the storage formats are measured against). K is taken after RoPE, where SGLang's cache receives it:
SGLang's transformers backend registers its own attention function (sglang/srt/models/transformers.py:326,
`ALL_ATTENTION_FUNCTIONS["sglang"]`), which transformers' LlamaAttention calls with the rotated key
(transformers/models/llama/modeling_llama.py:248, then :257) and which hands it to RadixAttention, whose backend
writes it to the pool (torch_native_backend.py:299, `set_kv_buffer(layer, loc, k, v)`). Here an attention
function registered the same way records (query, key, value) and then runs transformers' own SDPA.

The job (JSON): {"model_dir", "windows": [[token ids], ...], "query_positions": [int, ...], "out": "x.npz"}.
The output (npz, no pickles): k{L}/v{L} [windows, kv_heads, tokens, head_dim] and q{L} [windows, heads,
len(query_positions), head_dim], float32, plus `meta` (a JSON string). A failure is one line on stderr, exit 3.
"""
from __future__ import annotations

import json
import sys
import time


def fail(msg: str) -> None:
    print(msg, file=sys.stderr)
    sys.exit(3)


def main(job_path: str) -> None:
    try:
        import numpy as np  # lazy: this file runs in the serving interpreter only; the imports fail elsewhere
        import torch  # lazy: as above
        from transformers import AutoModelForCausalLM  # lazy: as above
        from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: as above
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # lazy: as above
    except ImportError as e:
        fail(f"{sys.executable}: cannot import {e.name or e} (the K/V capture needs torch, transformers and numpy); "
             "build the serving environment with `make serving-env`")
    with open(job_path) as f:
        job = json.load(f)
    torch.set_num_threads(max(1, int(job.get("threads") or torch.get_num_threads())))
    pos = [int(p) for p in job["query_positions"]]
    seen: dict[int, tuple] = {}

    def capture(module, query, key, value, attention_mask, **kw):   # [batch, heads, tokens, head_dim], after RoPE
        seen[module.layer_idx] = (query[:, :, pos].detach().clone(), key.detach().clone(), value.detach().clone())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    ALL_ATTENTION_FUNCTIONS["runbook_capture"] = capture
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, attn_implementation="runbook_capture")
    except Exception as e:  # transformers raises many kinds for a broken checkpoint; one line for all
        fail(f"{job['model_dir']}: transformers cannot load it ({' '.join(str(e).split())[:200]}); re-download the checkpoint")
    model.eval()
    load_s = time.perf_counter() - t0
    layers = model.config.num_hidden_layers
    got: dict[str, list] = {}
    t1 = time.perf_counter()
    with torch.inference_mode():
        for ids in job["windows"]:
            seen.clear()
            model(input_ids=torch.tensor([ids]), use_cache=False)
            if len(seen) != layers:
                fail(f"{job['model_dir']}: captured {len(seen)} of {layers} layers; the model does not call transformers' "
                     "attention interface (not a standard decoder)")
            for i, (q, k, v) in seen.items():
                for name, t in (("q", q), ("k", k), ("v", v)):
                    got.setdefault(f"{name}{i}", []).append(t[0].float().numpy())
    meta = {"layers": layers, "kv_heads": int(model.config.num_key_value_heads), "heads": int(model.config.num_attention_heads),
            "head_dim": int(getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads),
            "model_type": model.config.model_type, "torch": torch.__version__, "load_s": round(load_s, 3),
            "forward_s": round(time.perf_counter() - t1, 3), "threads": torch.get_num_threads()}
    arrays = {k: np.stack(v) for k, v in got.items()}
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(job["out"], allow_pickle=False, **arrays)   # plain arrays and one string: nothing to pickle


if __name__ == "__main__":
    main(sys.argv[1])
