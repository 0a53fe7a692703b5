"""SGLang's own start-up and warning lines -> facts. Pure: lines in, `Facts` out.

The patterns follow SGLang 0.5.23's format strings (each names the file it follows);
`tests/verify/test_formats.py` renders lines from the installed SGLang's own format strings and
feeds them here, so a format change in a new SGLang breaks that test, not a production run.
Only the last start counts: a start marker (systemd's "Starting <unit>" line, or SGLang's first
`server_args=` line) clears everything seen before it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runbook.model import sglang_names

MAX_LINE = 8192          # characters kept per line (longer lines are cut: a line is evidence, not data)
MAX_WARNING_LINES = 5    # example lines kept per warning id (every occurrence is counted)

# journalctl -o short-iso: "2026-01-05T10:00:00+0000 host ident[pid]: message"
_JOURNAL = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?) \S+ ([^:\[\s]+)(?:\[\d+\])?: (.*)$")
# utils/common.py configure_logger: "[%(asctime)s{.msecs}{prefix}] %(message)s", datefmt %Y-%m-%d %H:%M:%S,
# prefix e.g. " TP0", " DP1 TP3", " PP0 TP0 EP0"
_SGLANG = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)((?: [A-Za-z_]+\d+)*)\] (.*)$")
_RANK = re.compile(r"\bTP(\d+)\b")
_SYSTEMD_START = re.compile(r"^Starting (\S+?)(?:\.service)?(?:\s|$)")

# model_executor/model_runner.py load_model
_WEIGHTS = re.compile(r"Load weight end\. elapsed=([\d.]+) s, type=([^,]+), (?:(.+?), )?avail mem=([\d.]+) GB, "
                      r"mem usage=([\d.]+) GB\.")
# mem_cache/memory_pool.py _finalize_allocation_log (MHA: K and V sizes; MLA: one KV size)
_KV = re.compile(r"(?:(.+?) )?KV Cache (is allocated|VA upper bound)\. dtype: (\S+), #tokens: (\d+), "
                 r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")
# model_runner_components/kv_pool_runtime.py (post-capture KV sizing)
_KV_POST = re.compile(r"Post-capture KV sizing: KV cache allocated\. dtype: (\S+), #tokens: (\d+), KV size: ([\d.]+) GB, "
                      r"avail mem=([\d.]+) GB")
# managers/scheduler.py (TP rank 0 only)
_SCHED = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+|None), max_prefill_tokens=(-?\d+|None), "
                    r"max_running_requests=(\d+|None), context_len=(\d+), available_(?:gpu|cpu)_mem=([\d.]+) GB")
# mem_cache/memory_pool.py (hybrid models' state pool)
_MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, "
                    r"ssm_state size: ([\d.]+)GB")
# model_runner_components/cuda_graph_setup.py
_GRAPH_BEGIN = re.compile(r"Capture (.+?) (?:CUDA|CPU|NPU|XPU|\S+) graph begin\. .*avail mem=([\d.]+) GB")
_GRAPH_END = re.compile(r"Capture (.+?) (?:CUDA|CPU|NPU|XPU|\S+) graph end\. (?:bs=(\[[^\]]*\]), )?elapsed=([\d.]+) s, "
                        r"mem usage=([\d.]+) GB, avail mem=([\d.]+) GB\.")
# runner/decode_cuda_graph_runner.py, runner/prefill_cuda_graph_runner.py
_GRAPH_FAILED = re.compile(r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: (.*)$")
_READY = "The server is fired up and ready to roll!"   # entrypoints/http_server.py
_SERVER_ARGS = re.compile(r"^server_args=")              # entrypoints/engine.py: the launch's first line (holds secrets)

# Warnings: (id, pattern). Every match is counted; a few example lines are kept.
WARNINGS: tuple[tuple[str, re.Pattern], ...] = (
    # model_runner_components/load_model_utils.py
    ("fp8_kv_no_scales", re.compile(r"Using FP8 KV cache but no scaling factors provided\. Defaulting to scaling factors of 1\.0\.")),
    # layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py
    ("moe_default_config",
     re.compile(r"Using default MoE kernel config\. Performance might be sub-optimal! Config file not found at (\S+?),? ")),
    # distributed/device_communicators/custom_all_reduce_utils.py ({cls_name} is disabled ...)
    ("custom_allreduce_disabled", re.compile(r"\b(CustomAllreduce|CustomAllReduceV2) is disabled (?:because|due to) (.*)$")),
    # managers/scheduler.py (decode retraction when the KV pool is full)
    ("retraction", re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), #new_tokens_gained: (-?\d+)")),
    # runner/*_cuda_graph_runner.py wraps torch's error; torch: "CUDA out of memory. Tried to allocate ..."
    ("oom_graph_capture", re.compile(r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*(?:out of memory|OutOfMemory)", re.I)),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.I)),
    # model_executor/pool_configurator.py
    ("not_enough_memory", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static\.")),
    # layers/deep_gemm_wrapper/compile_utils.py
    ("deepgemm_jit", re.compile(r"Try DeepGEMM JIT Compiling for <(\w+)> N=(\d+), K=(\d+), num_groups=(\d+)")),
    ("graph_capture_failed", _GRAPH_FAILED),
)


def clean(raw: str) -> str:
    """One log line as text: control characters dropped, cut at MAX_LINE."""
    s = raw.rstrip("\r\n")
    if len(s) > MAX_LINE:
        s = s[:MAX_LINE] + " …[cut]"
    return "".join(c if (c >= " " or c == "\t") and c != "\x7f" else "" for c in s)


def _num(s: str | None) -> int | None:
    return None if s in (None, "None") else int(s)  # type: ignore[arg-type]


def kv_dtype_name(torch_dtype: str) -> str:
    """'torch.bfloat16' -> 'bfloat16', 'torch.float8_e4m3fn' -> 'fp8_e4m3', 'torch.float4_e2m1fn_x2' -> 'nvfp4'
    (model/sglang_names.py's names); a dtype the table does not know stays as logged, without 'torch.'."""
    return sglang_names.kv_dtype_name(torch_dtype) or torch_dtype.replace("torch.", "").strip(",")


@dataclass
class Warning_:
    id: str
    count: int = 0
    lines: list[str] = field(default_factory=list)
    groups: list[tuple[str, ...]] = field(default_factory=list)


@dataclass
class Facts:
    """What the last start's log says. GB in SGLang's lines is GiB (it divides by 1 << 30)."""

    start_time: str | None = None
    start_marker: str = ""                  # what began the last start
    starts_seen: int = 0
    lines: int = 0
    sglang_lines: int = 0
    ready: bool = False
    ready_time: str | None = None
    weights: dict[int, dict[str, Any]] = field(default_factory=dict)   # TP rank -> elapsed_s, type, quant, avail_gib, usage_gib
    kv: dict[int, dict[str, Any]] = field(default_factory=dict)        # TP rank -> dtype, tokens, size_gib, label
    scheduler: dict[str, Any] | None = None
    mamba: dict[int, dict[str, Any]] = field(default_factory=dict)
    graphs: list[dict[str, Any]] = field(default_factory=list)         # rank, name, elapsed_s, mem_gib, avail_gib, bs
    warnings: dict[str, Warning_] = field(default_factory=dict)
    capturing: bool = False                 # a CUDA-graph capture began and has not ended

    def rank0(self, table: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
        return table.get(0) or (table[min(table)] if table else None)

    def to_json(self) -> dict[str, Any]:
        return {"start_time": self.start_time, "ready": self.ready, "ready_time": self.ready_time, "lines": self.lines,
                "starts_seen": self.starts_seen, "weights": {str(k): v for k, v in sorted(self.weights.items())},
                "kv_cache": {str(k): v for k, v in sorted(self.kv.items())}, "scheduler": self.scheduler,
                "mamba": {str(k): v for k, v in sorted(self.mamba.items())}, "cuda_graphs": self.graphs,
                "warning_counts": {k: w.count for k, w in self.warnings.items()}}


class Parser:
    """Feed lines one at a time (memory stays bounded by what one start logs)."""

    def __init__(self, unit: str | None = None):
        self.unit = unit
        self.facts = Facts()
        self._systemd_start_pending = False

    def _restart(self, ts: str | None, marker: str) -> None:
        seen = self.facts.starts_seen + 1
        self.facts = Facts(start_time=ts, start_marker=marker, starts_seen=seen)

    def feed(self, raw: str) -> None:
        line = clean(raw)
        if not line.strip() or line.startswith("-- "):   # journalctl's "-- No entries --", "-- Boot … --"
            return
        ts, ident, msg = None, "", line
        m = _JOURNAL.match(line)
        if m:
            ts, ident, msg = m.group(1), m.group(2), m.group(3)
        if ident == "systemd" or (not m and msg.startswith("Starting ")):
            s = _SYSTEMD_START.match(msg)
            if s and (self.unit is None or s.group(1) == self.unit):
                self._restart(ts, "systemd: " + msg)
                self._systemd_start_pending = True
            return
        rank: int | None = None
        sm = _SGLANG.match(msg)
        if sm:
            ts = ts or sm.group(1)
            r = _RANK.search(sm.group(2))
            rank = int(r.group(1)) if r else None
            msg = sm.group(3)
        if _SERVER_ARGS.match(msg):
            if self._systemd_start_pending:
                self._systemd_start_pending = False   # the same start systemd announced
            else:
                self._restart(ts, "sglang: server_args")
            self.facts.sglang_lines += 1
            return   # never kept: it carries the API key in clear
        f = self.facts
        f.lines += 1
        if f.start_time is None and ts:
            f.start_time = ts
        self._facts(f, msg, rank if rank is not None else 0, ts)
        matched: set[str] = set()
        for wid, pat in WARNINGS:
            w = pat.search(msg)
            if not w:
                continue
            if wid == "oom" and (f.capturing or "oom_graph_capture" in matched):
                wid = "oom_graph_capture"   # torch's own OOM line inside a capture that never ended
            if wid in matched or (wid == "graph_capture_failed" and "oom_graph_capture" in matched):
                continue
            matched.add(wid)
            entry = f.warnings.setdefault(wid, Warning_(wid))
            entry.count += 1
            if len(entry.lines) < MAX_WARNING_LINES:
                entry.lines.append(line)
                entry.groups.append(tuple(g or "" for g in w.groups()))

    def _facts(self, f: Facts, msg: str, rank: int, ts: str | None) -> None:
        if "Load weight end." in msg:
            m = _WEIGHTS.search(msg)
            if m:
                f.sglang_lines += 1
                f.weights[rank] = {"elapsed_s": float(m.group(1)), "type": m.group(2), "quant": m.group(3) or "",
                                   "avail_gib": float(m.group(4)), "usage_gib": float(m.group(5))}
        elif "KV Cache" in msg or "KV cache allocated" in msg:
            m = _KV.search(msg)
            if m and m.group(1) is None:   # the model's own pool, not an auxiliary (index) pool
                f.sglang_lines += 1
                k, v, kvs = m.group(5), m.group(6), m.group(7)
                size = float(k) + float(v) if k is not None and v is not None else float(kvs or 0)
                f.kv[rank] = {"dtype": kv_dtype_name(m.group(3)), "tokens": int(m.group(4)), "size_gib": size,
                              "k_gib": float(k) if k else None, "v_gib": float(v) if v else None,
                              "upper_bound": m.group(2) != "is allocated"}
            p = _KV_POST.search(msg)
            if p:
                f.sglang_lines += 1
                f.kv[rank] = {"dtype": kv_dtype_name(p.group(1)), "tokens": int(p.group(2)), "size_gib": float(p.group(3)),
                              "k_gib": None, "v_gib": None, "upper_bound": False, "post_capture": True}
        elif msg.startswith("max_total_num_tokens="):
            m = _SCHED.search(msg)
            if m:
                f.sglang_lines += 1
                f.scheduler = {"max_total_num_tokens": int(m.group(1)), "chunked_prefill_size": _num(m.group(2)),
                               "max_prefill_tokens": _num(m.group(3)), "max_running_requests": _num(m.group(4)),
                               "context_len": int(m.group(5)), "available_gpu_mem_gib": float(m.group(6))}
        elif msg.startswith("Mamba Cache is allocated."):
            m = _MAMBA.search(msg)
            if m:
                f.sglang_lines += 1
                f.mamba[rank] = {"max_mamba_cache_size": int(m.group(1)), "conv_gib": float(m.group(2)), "ssm_gib": float(m.group(3))}
        elif msg.startswith("Capture "):
            if _GRAPH_BEGIN.search(msg):
                f.capturing = True
            m = _GRAPH_END.search(msg)
            if m:
                f.sglang_lines += 1
                f.capturing = False
                bs = [int(x) for x in re.findall(r"\d+", m.group(2))] if m.group(2) else []
                f.graphs.append({"rank": rank, "name": m.group(1), "elapsed_s": float(m.group(3)), "mem_gib": float(m.group(4)),
                                 "avail_gib": float(m.group(5)), "batch_sizes": bs[:64], "max_bs": max(bs) if bs else None})
        elif _READY in msg:
            f.ready, f.ready_time = True, ts


def parse(lines: Iterable[str], unit: str | None = None) -> Facts:
    p = Parser(unit)
    for ln in lines:
        p.feed(ln)
    return p.facts
