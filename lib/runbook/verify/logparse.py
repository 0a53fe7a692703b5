"""SGLang's own start-up and warning lines -> facts. Pure: lines in, `Facts` out.

The patterns read every form SGLang has logged since 0.4 (each names the file it follows): hosts lag behind
releases, and an upgrade is when verify matters. `tests/verify/test_verify.py` renders lines from the installed
SGLang's own format strings, `tests/verify/test_log_forms.py` from those of each release where a line changed.
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
_SGLANG = re.compile(r"(?:^|[\s|])\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)((?: [A-Za-z_]+\d+)*)\] (.*)$")
_RANK = re.compile(r"\bTP(\d+)\b")
_SYSTEMD_START = re.compile(r"^Starting (\S+?)(?:\.service)?(?:\s|$)")

# Each pattern below reads every form SGLang has logged since 0.4 (tests/verify/test_log_forms.py renders the lines
# from each version's own format strings; tests/verify/fixtures/sglang_log_forms.json keeps them with file:line).
# model_executor/model_runner.py load_model, all versions
_WEIGHTS_BEGIN = re.compile(r"^Load weight begin\. avail mem=([\d.]+) GB")
# ... "Load weight end. [elapsed=X s, ]type=T, [dtype=D, | quant=…, ]avail mem=A GB[, mem usage=U GB]."
# (elapsed= since 0.5.9, mem usage= since 0.4.6, quantization instead of dtype= since 0.5.12)
_WEIGHTS = re.compile(r"^Load weight end\. (?:elapsed=([\d.]+) s, )?type=([^,]+), (?:(.+?), )?avail mem=([\d.]+) GB"
                      r"(?:, mem usage=([\d.]+) GB)?")
# mem_cache/memory_pool.py: "[label ]KV Cache is allocated|VA upper bound. [dtype: D, ][#tokens: N, ]K size: … GB, V size: … GB"
# (MHA) or "… KV size: … GB" (MLA); #tokens since 0.4.6, dtype: since 0.5.15, a label (Full, SWA, index pools) since 0.5.18
_KV = re.compile(r"^(?:(.+?) )?KV Cache (is allocated|VA upper bound)\. (?:dtype: (\S+), )?(?:#tokens: (\d+), )?"
                 r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")
# model_runner_components/kv_pool_runtime.py (post-capture KV sizing, 0.5.18+; the draft's own line since 0.5.23)
_KV_POST = re.compile(r"^Post-capture KV sizing: (draft )?KV cache allocated\. dtype: (\S+), #tokens: (\d+), KV size: ([\d.]+) GB")
_KV_MENTION = re.compile(r"KV Cache (?:is allocated|VA upper bound)|KV cache allocated")   # a pool line, understood or not
# model_executor/model_runner.py, 0.5.3 to 0.5.12 (rank 0): the pool's dtype, before the KV line carried it
_KV_DTYPE = re.compile(r"^Using KV cache dtype: (\S+)")
# managers/scheduler.py (TP rank 0 only): "max_total_num_tokens=N, [chunked_prefill_size=C, ]max_prefill_tokens=P,
# max_running_requests=R, context_len=L[, available_gpu_mem=A GB]" (chunked_prefill_size since 0.4.3, the memory since 0.4.10)
_SCHED_FIELD = re.compile(r"\b(max_total_num_tokens|chunked_prefill_size|max_prefill_tokens|max_running_requests|context_len|"
                          r"available_(?:gpu|cpu)_mem)=(-?[\d.]+|None)")
# mem_cache/memory_pool.py (hybrid models' state pool; max_mamba_cache_size since 0.5.6)
_MAMBA = re.compile(r"^Mamba Cache is allocated\. (?:max_mamba_cache_size: (\d+), )?conv_state size: ([\d.]+) ?GB, "
                    r"ssm_state size: ([\d.]+) ?GB")
# CUDA-graph captures: model_runner.py (0.4–0.5.12: "Capture cuda graph begin/end. … Time elapsed: X s. mem usage=… avail mem=…",
# no memory before 0.4.6), model_runner_components/cuda_graph_setup.py and speculative/*.py (0.5.15+: "Capture NAME CUDA graph
# end. [bs=[…], ]elapsed=X s, mem usage=… GB, avail mem=… GB.", "Capture single-CG draft extend end. …"). The fields are
# read by name: their order changed.
_GRAPH = re.compile(r"^Capture (.*?)\s*\b(begin|end)\b")
_GRAPH_KIND = re.compile(r"\s*(?:\b(?:cuda|CUDA|cpu|CPU|npu|NPU|xpu|XPU)\s+)?graph$")   # "target decode CUDA graph" -> "target decode"
_GRAPH_FIELDS = {"elapsed_s": re.compile(r"(?:elapsed=|Time elapsed: )([\d.]+) s"), "mem_gib": re.compile(r"mem usage=([\d.]+) GB"),
                 "avail_gib": re.compile(r"avail mem=([\d.]+) GB")}
_GRAPH_BS = re.compile(r"\bbs=(\[[^\]]*\])")
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
    # managers/scheduler.py (decode retraction when the KV pool is full; 0.5.23 appends ", #new_token_ratio: a -> b")
    ("retraction", re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), #new_tokens_gained: (-?\d+)")),
    # managers/tp_worker.py (0.5.23): a pool smaller than one request at the context length
    ("pool_below_context", re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)\.")),
    # mem_cache/allocation.py (0.5.23): the token pool had no room for a batch ("Out of memory." in alloc_token_slots,
    # "Prefill out of memory." / "Decode out of memory." in the paged allocators); the scheduler raises after the line
    ("kv_pool_oom", re.compile(r"\b(?:(Prefill|Decode) out|Out) of memory\. Try to lower your batch size\.")),
    # managers/schedule_batch.py retract_decode (0.5.23): a request aborted under decode memory pressure, the last one
    # after every other was retracted, or one that cannot be retracted (no KV backup)
    ("oom_abort", re.compile(r"retract_decode: aborted (?:last )?request (\S+?)(?::? due to OOM$|: (.*))")),
    # mem_cache/allocation.py alloc_req_slots: no request slot left (--max-running-requests)
    ("req_slots_oom", re.compile(r"alloc_req_slots runs out of memory\.")),
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
    """What the last start's log says. GB in SGLang's lines is GiB (it divides by 1 << 30).

    With speculative decoding each rank loads and sizes the target model first, then the draft: the first weight
    line and KV pool of a rank are the target's (`weights`, `kv`), the next ones the draft's (`weights_draft`,
    `kv_draft`), so the draft never replaces the target."""

    start_time: str | None = None
    start_marker: str = ""                  # what began the last start
    starts_seen: int = 0
    lines: int = 0
    sglang_lines: int = 0
    ready: bool = False
    ready_time: str | None = None
    weights: dict[int, dict[str, Any]] = field(default_factory=dict)   # TP rank -> elapsed_s, type, quant, avail_gib, usage_gib,
    weights_draft: dict[int, dict[str, Any]] = field(default_factory=dict)   # begin_avail_gib (free before the weights)
    kv: dict[int, dict[str, Any]] = field(default_factory=dict)        # TP rank -> pool, dtype, tokens, size_gib, k_gib, v_gib
    kv_draft: dict[int, dict[str, Any]] = field(default_factory=dict)
    kv_labelled: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)   # rank -> label (Full, SWA, …) -> pool
    kv_dtype_logged: str | None = None      # "Using KV cache dtype: …" (0.5.3–0.5.12, where the pool line has no dtype)
    kv_unparsed: list[str] = field(default_factory=list)   # pool lines present but not understood (first few)
    scheduler: dict[str, Any] | None = None
    mamba: dict[int, dict[str, Any]] = field(default_factory=dict)
    graphs: list[dict[str, Any]] = field(default_factory=list)         # rank, name, elapsed_s, mem_gib, avail_gib, bs
    warnings: dict[str, Warning_] = field(default_factory=dict)
    capturing: bool = False                 # a CUDA-graph capture began and has not ended
    _begin: dict[int, float] = field(default_factory=dict, repr=False)   # rank -> last "Load weight begin" avail mem

    def rank0(self, table: dict[int, Any]) -> Any:
        return table.get(0) or (table[min(table)] if table else None)

    def kv_dtype(self) -> str | None:
        """The KV pool's dtype: the token pool's line, else 0.5.3–0.5.12's `Using KV cache dtype:`, else a labelled
        pool's (a sliding-window model logs only its Full and SWA pools)."""
        kv = self.rank0(self.kv) or {}
        labelled = self.rank0(self.kv_labelled) or {}
        return kv.get("dtype") or self.kv_dtype_logged or next((p["dtype"] for p in labelled.values() if p.get("dtype")), None)

    def to_json(self) -> dict[str, Any]:
        by_rank = lambda t: {str(k): v for k, v in sorted(t.items())}   # noqa: E731
        return {"start_time": self.start_time, "ready": self.ready, "ready_time": self.ready_time, "lines": self.lines,
                "starts_seen": self.starts_seen, "weights": by_rank(self.weights), "weights_draft": by_rank(self.weights_draft),
                "kv_cache": by_rank(self.kv), "kv_cache_draft": by_rank(self.kv_draft), "kv_cache_labelled": by_rank(self.kv_labelled),
                "kv_dtype_logged": self.kv_dtype_logged,
                "kv_unparsed": self.kv_unparsed, "scheduler": self.scheduler, "mamba": by_rank(self.mamba),
                "cuda_graphs": self.graphs, "warning_counts": {k: w.count for k, w in self.warnings.items()}}


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
        sm = _SGLANG.search(msg)   # also behind a container runtime's prefix ("sglang-1  | [")
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
        if msg.startswith("Load weight "):
            self._weights(f, msg, rank)
        elif "KV Cache" in msg or "KV cache" in msg:
            self._kv(f, msg, rank)
        elif msg.startswith("max_total_num_tokens="):
            fields = dict(_SCHED_FIELD.findall(msg))
            if "max_total_num_tokens" in fields and "context_len" in fields:
                f.sglang_lines += 1
                avail = next((v for k, v in fields.items() if k.startswith("available_")), None)
                f.scheduler = {"max_total_num_tokens": int(fields["max_total_num_tokens"]),
                               "chunked_prefill_size": _num(fields.get("chunked_prefill_size")),
                               "max_prefill_tokens": _num(fields.get("max_prefill_tokens")),
                               "max_running_requests": _num(fields.get("max_running_requests")),
                               "context_len": int(fields["context_len"]),
                               "available_gpu_mem_gib": float(avail) if avail not in (None, "None") else None}
        elif msg.startswith("Mamba Cache is allocated."):
            m = _MAMBA.search(msg)
            if m and rank not in f.mamba:   # a draft's state pool (if any) comes after the target's
                f.sglang_lines += 1
                f.mamba[rank] = {"max_mamba_cache_size": _num(m.group(1)), "conv_gib": float(m.group(2)),
                                 "ssm_gib": float(m.group(3))}
        elif msg.startswith("Capture "):
            self._graph(f, msg, rank)
        elif _READY in msg:
            f.ready, f.ready_time = True, ts

    def _weights(self, f: Facts, msg: str, rank: int) -> None:
        b = _WEIGHTS_BEGIN.search(msg)
        if b:
            f._begin[rank] = float(b.group(1))
            return
        m = _WEIGHTS.search(msg)
        if not m:
            return
        f.sglang_lines += 1
        before = f._begin.pop(rank, None)
        quant = m.group(3) or ""
        avail = float(m.group(4))
        usage = float(m.group(5)) if m.group(5) else (round(before - avail, 2) if before is not None else None)
        entry = {"elapsed_s": float(m.group(1)) if m.group(1) else None, "type": m.group(2),
                 "quant": "" if quant.startswith("dtype=") else quant, "dtype": quant[6:] if quant.startswith("dtype=") else None,
                 "avail_gib": avail, "usage_gib": usage, "begin_avail_gib": before}
        (f.weights_draft if rank in f.weights else f.weights).setdefault(rank, entry)

    def _kv(self, f: Facts, msg: str, rank: int) -> None:
        m = _KV.search(msg)
        p = _KV_POST.search(msg) if not m else None
        d = _KV_DTYPE.search(msg) if not (m or p) else None
        if d:
            f.sglang_lines += 1
            f.kv_dtype_logged = f.kv_dtype_logged or kv_dtype_name(d.group(1))
        elif m:
            f.sglang_lines += 1
            k, v, kvs = m.group(5), m.group(6), m.group(7)
            entry = {"dtype": kv_dtype_name(m.group(3)) if m.group(3) else None, "tokens": _num(m.group(4)),
                     "size_gib": float(k) + float(v) if k is not None and v is not None else float(kvs),
                     "k_gib": float(k) if k else None, "v_gib": float(v) if v else None,
                     "upper_bound": m.group(2) != "is allocated"}
            if m.group(1) is not None:   # a labelled pool (Full, SWA, an index pool): kept apart from the token pool
                f.kv_labelled.setdefault(rank, {}).setdefault(m.group(1), entry)
                return
            table = f.kv_draft if rank in f.kv else f.kv
            table.setdefault(rank, {"pool": "draft" if table is f.kv_draft else "target", **entry})
        elif p:
            f.sglang_lines += 1
            draft = p.group(1) is not None
            (f.kv_draft if draft else f.kv)[rank] = {
                "pool": "draft" if draft else "target", "dtype": kv_dtype_name(p.group(2)), "tokens": int(p.group(3)),
                "size_gib": float(p.group(4)), "k_gib": None, "v_gib": None, "upper_bound": False, "post_capture": True}
        elif _KV_MENTION.search(msg) and len(f.kv_unparsed) < MAX_WARNING_LINES:
            f.kv_unparsed.append(msg)

    def _graph(self, f: Facts, msg: str, rank: int) -> None:
        g = _GRAPH.search(msg)
        if not g:
            return
        if g.group(2) == "begin":
            f.capturing = True
            return
        f.capturing = False
        vals = {k: float(x.group(1)) if (x := pat.search(msg)) else None for k, pat in _GRAPH_FIELDS.items()}
        if vals["elapsed_s"] is None and vals["mem_gib"] is None:
            return   # a capture that logs no figures (Frozen-KV MTP draft)
        f.sglang_lines += 1
        bsm = _GRAPH_BS.search(msg)
        bs = [int(x) for x in re.findall(r"\d+", bsm.group(1))] if bsm else []
        name = _GRAPH_KIND.sub("", g.group(1)).strip() or "decode"   # before 0.5.15 the main capture is the decode graphs
        f.graphs.append({"rank": rank, "name": name, **vals, "batch_sizes": bs[:64],
                         "max_bs": max(bs) if bs else None})


def parse(lines: Iterable[str], unit: str | None = None) -> Facts:
    p = Parser(unit)
    for ln in lines:
        p.feed(ln)
    return p.facts
