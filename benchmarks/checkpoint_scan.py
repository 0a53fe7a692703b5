"""How long a full quant inspection takes on a 400 GB-class checkpoint, and how much it reads.

Builds a sparse checkpoint in a temp dir: ~100 shards, 20,000 tensors, real safetensors headers
(8-byte length + JSON), data regions left as holes, so the files report ~400 GB but use almost
no disk. Then times `checkpoint.load` + `quant.inspect_checkpoint` and prints wall time and bytes read.

    .venv/bin/python benchmarks/checkpoint_scan.py [--shards 100] [--tensors 20000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook import quant
from runbook.model import checkpoint

MODELOPT = {"producer": {"name": "modelopt", "version": "0.35.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16, "exclude_modules": ["lm_head"]}}


def build(root: Path, shards: int, tensors: int, total_gb: float) -> None:
    layers = 60
    cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "dtype": "bfloat16",
           "text_config": {"num_hidden_layers": layers, "full_attention_interval": 4, "num_attention_heads": 32,
                           "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 4096, "linear_num_key_heads": 16,
                           "linear_num_value_heads": 64, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                           "linear_conv_kernel_dim": 4, "dtype": "bfloat16"}}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "hf_quant_config.json").write_text(json.dumps(MODELOPT))
    per_tensor = int(total_gb * 1e9 / tensors)
    names = [f"model.language_model.layers.{i % layers}.mlp.experts.{i // layers}.up_proj.weight" for i in range(tensors)]
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        mine = names[s::shards]
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for n in mine:
            header[n] = {"dtype": "U8", "shape": [per_tensor], "data_offsets": [off, off + per_tensor]}
            off += per_tensor
            weight_map[n] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
        os.truncate(root / fname, 8 + len(raw) + off)  # the data region is a hole
        total += off
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--total-gb", type=float, default=400)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, a.shards, a.tensors, a.total_gb)
        apparent = sum(p.stat().st_size for p in root.iterdir())
        on_disk = sum(p.stat().st_blocks * 512 for p in root.iterdir())
        me = psutil.Process()
        times, read = [], 0
        for _ in range(a.repeat):
            r0 = me.io_counters().read_chars
            t0 = time.perf_counter()
            rep = quant.inspect_checkpoint(checkpoint.load(root), {}, tp=8)
            times.append(time.perf_counter() - t0)
            read = me.io_counters().read_chars - r0
        print(f"checkpoint: {a.shards} shards, {a.tensors} tensors, {apparent / 1e9:.0f} GB apparent, {on_disk / 1e6:.1f} MB on disk")
        print(f"full inspection: median {statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms over {a.repeat} runs")
        print(f"bytes read per inspection: {read / 1e6:.2f} MB ({read / apparent * 100:.5f}% of the checkpoint)")
        print(f"result: {rep.weights.algo}, {rep.kv_cache.kv_layers} KV layers, scales on {rep.kv_cache.layers_with_scales}, "
              f"{rep.weights.total_bytes / 1e9:.0f} GB weights")


if __name__ == "__main__":
    main()
