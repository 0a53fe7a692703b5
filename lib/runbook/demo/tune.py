"""A deployment spec whose engine is llama-server (the tiny CPU model), with tune candidates over
llama-server's real knobs: parallel slots, the KV cache types (f16, q8_0, q4_0), the batch size and n-gram
speculative decoding — and one flag this llama-server removed, which the pre-check skips with its own
message. Written with absolute paths to the cached build and model (`make demo`, the tune tests). The workload
is `code` (completions): in chat, the random-weight model sometimes streams only tokens that detokenize to
nothing, which the SLO search counts as failed requests (tests/bench/test_llama_server.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from runbook.core.fsutil import atomic_write_text
from runbook.demo import sglang

CANDIDATES: dict[str, dict[str, Any]] = {
    "q8-kv": {"description": "8-bit KV cache", "flags": {"cache-type-k": "q8_0", "cache-type-v": "q8_0"}},
    "q4-kv": {"description": "4-bit KV cache", "flags": {"cache-type-k": "q4_0", "cache-type-v": "q4_0"}},
    "np4": {"description": "4 slots of 1024 tokens", "flags": {"parallel": 4}},
    "batch-128": {"description": "logical batch 128", "flags": {"batch-size": 128, "ubatch-size": 128}},
    "ngram": {"description": "n-gram speculative decoding", "flags": {"spec-type": "ngram-simple",
                                                                       "spec-ngram-simple-size-n": 3, "spec-draft-n-max": 4}},
    "old-draft-flag": {"description": "a flag llama-server removed", "flags": {"draft-max": 4}},
}


def spec_data(exe: Path, model_dir: Path, port: int, candidates: dict[str, dict[str, Any]] | None = None,
              **tune: Any) -> dict[str, Any]:
    return {
        "name": "tiny-llama-cpu",
        "description": "llama-server on CPU serving a tiny random-weight model: tune's CPU engine (figures say nothing "
                       "about a deployment)",
        "model": {"path": str(model_dir / "model.gguf"), "served_name": "tiny-llama"},
        "hardware": {"gpu_model": "none (CPU)", "gpu_count": 1, "gpu_memory_gib": 1},
        "serving": {"python": "/usr/bin/python3", "host": "127.0.0.1", "port": port,
                    "flags": {"threads": 1, "parallel": 2, "ctx-size": 4096, "jinja": True, "no-cache-prompt": True,
                              "cache-ram": 0, "metrics": True, "ignore-eos": True}},
        "systemd": {"unit_name": "runbook-demo-llama", "timeout_start_sec": 60, "ready_path": "/health"},
        "benchmark": {"input_len": 256, "output_len": 32, "concurrency": [1, 2, 4], "requests_per_level": 8, "warmup": 1},
        "accuracy": {"recall_lengths": [512, 1024], "recall_depths": [0.5]},
        "slo": {"tpot_ms_p99": 400},
        "tune": {"engine": "llama-server", "llama_server": str(exe), "candidates": CANDIDATES if candidates is None else candidates,
                 "workload": "code", "concurrency": [1, 2], "requests_per_level": 6, "turns": 2, "input_len": 256,
                 "output_len": 24, "search_levels": 3, "buckets": [512, 1024, 2048], "longest_context": 1024, "budget_per_candidate_s": 600,
                 "budget_s": 3600, "ready_timeout_s": 60,
                 "guard": {"identity_prompts": 4, "identity_max_tokens": 32, "min_identical_tokens": 8,
                           "recall_lengths": [512, 1024], "toolcall": True}, **tune},
    }


def write_spec(path: Path, exe: Path, model_dir: Path, port: int, **kw: Any) -> Path:
    atomic_write_text(path, "# written by runbook.demo: tune's CPU demo deployment\n"
                      + yaml.safe_dump(spec_data(exe, model_dir, port, **kw), sort_keys=False))
    return path


# SGLang's own knobs on CPU (the real server, runbook.demo.sglang). `fp8-kv` is the failure the guard exists to catch:
# an FP8 KV cache with no scales, which SGLang's log flags and the guard compares with the BF16 reference; `old-flag` is a flag this
# SGLang refuses, skipped by its own parser before anything is launched. sglang_candidates() adds the upgrade canary.
SGLANG_CANDIDATES: dict[str, dict[str, Any]] = {
    "no-radix": {"description": "radix (prefix) cache off", "flags": {"disable-radix-cache": True}},
    "chunked-512": {"description": "chunked prefill of 512 tokens, 8 running requests",
                    "flags": {"chunked-prefill-size": 512, "max-running-requests": 8}},
    "fp8-kv": {"description": "FP8 KV cache without scaling factors (the checkpoint has none)",
               "flags": {"kv-cache-dtype": "fp8_e4m3"}},
    "old-flag": {"description": "a flag this SGLang does not have", "flags": {"enable-dp-lm-head-typo": True}},
}

def sglang_candidates() -> dict[str, dict[str, Any]]:
    """The demo's SGLang candidates, and the upgrade canary where `make serving-canary` has built it (make demo does):
    the same flags on the other SGLang version installed beside the serving env."""
    py = sglang.canary_python()
    if not py.is_file():
        return dict(SGLANG_CANDIDATES)
    v = sglang.CANARY_SGLANG_VERSION
    return {**SGLANG_CANDIDATES, f"sglang-{v}": {"python": str(py), "description": f"the same flags on SGLang {v} (an "
                                                                                  "upgrade canary, here the other way round)"}}


SGLANG_TUNE: dict[str, Any] = {
    "engine": "sglang", "workload": "code", "concurrency": [1, 2], "requests_per_level": 4, "turns": 1,
    "input_len": 128, "output_len": 16, "slo_search": False, "buckets": [512, 1024], "longest_context": 1024,
    "ready_timeout_s": 240, "budget_per_candidate_s": 600, "budget_s": 3600,
    "reference_runs": 2,     # one more SGLang start (25-55 s here) at the end: the noise a gain must clear
    "guard": {"identity_prompts": 4, "identity_max_tokens": 24, "min_identical_tokens": 8, "recall_lengths": [512],
              "toolcall": False},
}


def sglang_spec_data(port: int, candidates: dict[str, dict[str, Any]] | None = None, python: str | None = None,
                     source: Path | None = None, **tune: Any) -> dict[str, Any]:
    """An SGLang demo deployment (`source`: deployments/tiny-llama-sglang-cpu.yaml by default; the demo's is the real
    model's, deployments/smollm2-sglang-cpu.yaml), paths made absolute, on `port`, with a tune section over SGLang's
    own knobs; `python`: another serving interpreter for it (the reference's SGLang)."""
    src = Path(source or sglang.spec_path())
    data = yaml.safe_load(src.read_text(encoding="utf-8"))
    dep = sglang.deployment(port, source=src)
    data["serving"].update(python=python or dep.serving.python, port=port)
    data["serving"]["flags"].update(sglang.BESIDE_SIBLINGS)
    data["model"]["path"] = dep.model.path
    data["tune"] = {**SGLANG_TUNE, "candidates": sglang_candidates() if candidates is None else candidates, **tune}
    return data


def write_sglang_spec(path: Path, port: int, **kw: Any) -> Path:
    atomic_write_text(path, "# written by runbook.demo: tune on the real SGLang server on CPU\n"
                      + yaml.safe_dump(sglang_spec_data(port, **kw), sort_keys=False))
    return path
