"""Every form of SGLang's start-up lines since 0.4, rendered from each release's own format strings.

Hosts lag behind releases, so `runbook verify` reads logs of SGLang versions other than the one in
.venv-serving. For each release where one of these lines changed (VERSIONS), the wheel's own source is the
oracle: the string literals (f-strings and %-formats) of each kind below are found by AST, filled with the
sample values in VALUES, and fed to the parser; EXPECT says what it must read from each.
`fixtures/sglang_log_forms.json` keeps the rendered lines with the version and file:line each came from, so
the fast suite covers every form without a network; `test_log_forms.py` re-renders them from the wheels.

Regenerate the fixture (fetches the wheels into .cache/sglang-wheels once):
    PYTHONPATH=lib:tests python -m verify.log_forms --write
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runbook.verify import logparse

from .sglang_formats import fill, line, literal_text

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "sglang-wheels"
FIXTURE = Path(__file__).parent / "fixtures" / "sglang_log_forms.json"
# A release on each side of every change to these lines (no 0.5.0 was published).
VERSIONS = ("0.4.0", "0.4.3", "0.4.6.post5", "0.4.10.post2", "0.5.1", "0.5.3", "0.5.6", "0.5.9", "0.5.12", "0.5.15",
            "0.5.18", "0.5.20", "0.5.23")

# kind -> whether a string literal's text (placeholders as {}) is a line of that kind
KINDS: dict[str, Callable[[str], bool]] = {
    "weights_begin": lambda t: t.startswith("Load weight begin."),
    "weights_end": lambda t: t.startswith("Load weight end.") and "avail mem=" in t,
    "kv_pool": lambda t: ("K size: " in t or "KV size: " in t) and ("KV Cache" in t or "#tokens" in t)
    and not t.startswith("Post-capture"),
    "kv_post": lambda t: t.startswith("Post-capture KV sizing:") and "allocated" in t,
    "kv_dtype": lambda t: t.startswith("Using KV cache dtype"),
    "scheduler": lambda t: t.startswith("max_total_num_tokens="),
    "mamba": lambda t: t.startswith("Mamba Cache is allocated."),
    "graph_begin": lambda t: t.startswith("Capture ") and " begin" in t,
    "graph_end": lambda t: t.startswith("Capture ") and " end." in t,
}
TOKENS, K_GIB, KV_GIB, FREE, AFTER, USAGE, ELAPSED = 123456, 1.5, 2.25, 94.0, 64.0, 30.0, 12.5
GRAPH_S, GRAPH_GIB, GRAPH_AVAIL, SLOTS = 41.5, 1.2, 4.4, 1169
# placeholder expression (as ast.unparse writes it) -> sample value, per kind; a new expression is a KeyError
VALUES: dict[str, dict[str, Any]] = {
    "weights_begin": {"get_available_gpu_memory(self.device, self.gpu_id)": FREE},
    "weights_end": {"get_available_gpu_memory(self.device, self.gpu_id)": AFTER, "after_avail_memory": AFTER,
                    "before_avail_memory - after_avail_memory": USAGE, "self.weight_load_mem_usage": USAGE,
                    "self.weight_load_time": ELAPSED, "time.perf_counter() - tic_total": ELAPSED,
                    "type(self.model).__name__": "Qwen3ForCausalLM", "self.dtype": "torch.bfloat16",
                    "quant_str + ', ' if quant_str else ''": "quant=fp8, "},
    "kv_pool": {"size": TOKENS, "num_tokens": TOKENS, "k_size / GB": K_GIB, "k_size_GB": K_GIB, "v_size / GB": K_GIB,
                "v_size_GB": K_GIB, "kv_size / GB": KV_GIB, "kv_size_GB": KV_GIB, "self.dtype": "torch.float8_e4m3fn",
                "cache_name": "KV Cache", "'VA upper bound' if self.post_capture_active else 'is allocated'": "is allocated"},
    "kv_dtype": {"self.kv_cache_dtype": "torch.float8_e4m3fn"},
    "scheduler": {"self.max_total_num_tokens": TOKENS, "server_args.chunked_prefill_size": 8192,
                  "self.server_args.chunked_prefill_size": 8192, "get_schedule().chunked_prefill_size": 8192,
                  "self.max_prefill_tokens": 16384, "self.max_running_requests": 48, "self.model_config.context_len": 32768,
                  "avail_mem": GRAPH_AVAIL, "self.startup_available_gpu_memory_gb": GRAPH_AVAIL,
                  "'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'": "available_gpu_mem"},
    "mamba": {"size": SLOTS, "get_tensor_size_bytes(conv_state) / GB": 3.1, "get_tensor_size_bytes(temporal_state) / GB": 23.0,
              "get_tensor_size_bytes(intermediate_ssm_state_cache) / GB": 1.0, "intermediate_ssm_gb": 1.0,
              "get_tensor_size_bytes(intermediate_conv_window_cache) / GB": 0.5,
              "get_tensor_size_bytes(self._intermediate_conv_window_phys) / GB": 0.5},
}
_GRAPH = {"'cpu graph' if self.device == 'cpu' else 'cuda graph'": "cuda graph", "graph_backend[self.device]": "cuda graph",
          "graph_backend[model_runner.device]": "CUDA graph", "capture_name": "target decode", "before_mem": GRAPH_AVAIL + GRAPH_GIB,
          "after_mem": GRAPH_AVAIL, "before_mem - after_mem": GRAPH_GIB, "mem_usage": GRAPH_GIB, "memory_usage_gb": GRAPH_GIB,
          "self.cuda_graph_mem_usage": GRAPH_GIB, "self.graph_mem_usage": GRAPH_GIB, "capture_time": GRAPH_S,
          "time.perf_counter() - tic": GRAPH_S, "time.time() - tic": GRAPH_S, "runner.capture_bs": [1, 2, 4, 8], "capture_bs": [1, 2],
          "step": 0, "capture_num_tokens": [8192], "decode_backend": "full", "prefill_backend": "full", "num_tokens_per_bs": 1,
          "num_tokens_per_req": 1, "self.topk": 1, "self.speculative_num_draft_tokens": 4, "self.forward_width": 4}
VALUES["graph_begin"] = VALUES["graph_end"] = _GRAPH
# %-format lines (kv_pool_runtime.py): the arguments in order
ARGS = {"kv_post": ("torch.bfloat16", TOKENS, KV_GIB, GRAPH_AVAIL)}


def _literals(tree: ast.AST):
    """Whole string literals: f-strings, and plain strings that are not a piece of one."""
    inner = {id(c) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for c in n.values}
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in inner):
            yield n


def forms(srt: Path, version: str) -> list[dict[str, str]]:
    """Each line of each kind that sglang/srt under `srt` can log, rendered: {version, source, kind, message}."""
    out = []
    for path in sorted(srt.rglob("*.py")):
        rel = path.relative_to(srt).as_posix()
        if rel.startswith(("hardware_backend/", "rust_server/")):   # other devices' runners, a separate server
            continue
        text = path.read_text(errors="replace")
        if not any(w in text for w in ("Load weight", "KV Cache", "KV cache", "max_total_num_tokens=", "Mamba Cache", "Capture ")):
            continue
        for node in _literals(ast.parse(text)):
            t = literal_text(node)
            kind = next((k for k, pred in KINDS.items() if pred(t)), None)
            if kind is None:
                continue
            args = ARGS.get(kind, ())[: t.count("%") - 2 * t.count("%%")] if isinstance(node, ast.Constant) and "%" in t else ()
            msg = fill(node, VALUES.get(kind, {}), args, f"sglang {version} {rel}:{node.lineno}")
            out.append({"version": version, "source": f"{rel}:{node.lineno}", "kind": kind, "message": msg})
    return out


def _graph_expect(msg: str) -> dict[str, Any]:
    figures = "elapsed" in msg.lower() or "mem usage" in msg
    return {"graphs": [{"elapsed_s": GRAPH_S if "elapsed" in msg.lower() else None, "mem_gib": GRAPH_GIB if "mem usage" in msg else None,
                        "avail_gib": GRAPH_AVAIL if "avail mem" in msg else None,
                        "max_bs": 8 if "bs=[1, 2, 4, 8]" in msg else None}] if figures else []}


def read(kind: str, message: str) -> dict[str, Any]:
    """What the parser reads from one line of `kind` (the weight line after its begin line, as SGLang logs them)."""
    lines = [line(message)]
    if kind == "weights_end":
        lines.insert(0, line(f"Load weight begin. avail mem={FREE:.2f} GB"))
    f = logparse.parse(lines)
    if kind == "weights_begin":
        return {"begin": f._begin.get(0)}
    if kind == "weights_end":
        w = f.weights.get(0, {})
        return {k: w.get(k) for k in ("elapsed_s", "type", "avail_gib", "usage_gib", "begin_avail_gib")}
    if kind in ("kv_pool", "kv_post"):
        pool = (f.kv_draft if "draft" in message else f.kv).get(0, {})
        return {"dtype": pool.get("dtype"), "tokens": pool.get("tokens"), "size_gib": pool.get("size_gib"),
                "unparsed": f.kv_unparsed}
    if kind == "kv_dtype":
        return {"kv_dtype_logged": f.kv_dtype_logged}
    if kind == "scheduler":
        return dict(f.scheduler or {})
    if kind == "mamba":
        return dict(f.mamba.get(0, {}))
    if kind == "graph_begin":
        return {"capturing": f.capturing}
    return {"graphs": [{k: g[k] for k in ("elapsed_s", "mem_gib", "avail_gib", "max_bs")} for g in f.graphs]}


def expect(kind: str, message: str) -> dict[str, Any]:
    """What the line says, from the sample values and which fields the form carries."""
    if kind == "weights_begin":
        return {"begin": FREE}
    if kind == "weights_end":
        return {"elapsed_s": ELAPSED if "elapsed=" in message else None, "type": "Qwen3ForCausalLM", "avail_gib": AFTER,
                "usage_gib": USAGE, "begin_avail_gib": FREE}
    if kind in ("kv_pool", "kv_post"):
        dtype = ("fp8_e4m3" if kind == "kv_pool" else "bfloat16") if "dtype:" in message else None
        return {"dtype": dtype, "tokens": TOKENS if "#tokens" in message else None,
                "size_gib": 2 * K_GIB if "K size" in message else KV_GIB, "unparsed": []}
    if kind == "kv_dtype":
        return {"kv_dtype_logged": "fp8_e4m3"}
    if kind == "scheduler":
        return {"max_total_num_tokens": TOKENS, "chunked_prefill_size": 8192 if "chunked_prefill_size" in message else None,
                "max_prefill_tokens": 16384, "max_running_requests": 48, "context_len": 32768,
                "available_gpu_mem_gib": GRAPH_AVAIL if "available_gpu_mem" in message else None}
    if kind == "mamba":
        return {"max_mamba_cache_size": SLOTS if "max_mamba_cache_size" in message else None, "conv_gib": 3.1, "ssm_gib": 23.0}
    if kind == "graph_begin":
        return {"capturing": True}
    return _graph_expect(message)


def fetch(version: str, cache: Path = CACHE) -> Path:
    """sglang/srt of one release, from its wheel (pip download, once; only the .py files are unpacked)."""
    srt = cache / "src" / version / "sglang" / "srt"
    if srt.is_dir():
        return srt
    cache.mkdir(parents=True, exist_ok=True)
    wheels = list(cache.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        pip = Path(sys.executable).with_name("pip")
        subprocess.run([str(pip), "download", "--no-deps", "--only-binary=:all:", "--quiet", f"sglang=={version}", "-d", str(cache)],
                       check=True, capture_output=True, timeout=600)
        wheels = list(cache.glob(f"sglang-{version}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        for name in z.namelist():
            if name.startswith("sglang/srt/") and name.endswith(".py"):
                z.extract(name, cache / "src" / version)
    return srt


def fixture_rows(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per distinct line, with every (version, file:line) that logs it."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        row = out.setdefault((r["kind"], r["message"]), {"kind": r["kind"], "message": r["message"], "from": []})
        row["from"].append(f"{r['version']} {r['source']}")
    return sorted(out.values(), key=lambda r: (r["kind"], r["from"][0]))


if __name__ == "__main__" and "--write" in sys.argv:
    every = [r for v in VERSIONS for r in forms(fetch(v), v)]
    FIXTURE.write_text(json.dumps({"versions": list(VERSIONS), "forms": fixture_rows(every)}, indent=1) + "\n")
    print(f"{FIXTURE}: {len(fixture_rows(every))} distinct lines from {len(every)} format strings")
