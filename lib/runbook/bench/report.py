"""Tables and plots from a benchmark summary, and the previous archived run to compare with. The tables take the
summary (`BenchResult.data()`: {} for an empty report); what notebook 40 calls with the result itself returns None
for an empty one (an input error: `registry.display`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from runbook.bench import metrics
from runbook.bench.server_side import beside
from runbook.core import tables
from runbook.core.plots import figure
from runbook.core.registry import display
from runbook.endpoint.client import RequestRecord


def frame(summary: dict[str, Any]):
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    rows = []
    for s in summary.get("levels", []):
        rows.append({"level": s["label"], "completed": s["completed"], "failed": s["failed"],
                     "output tok/s": round(s["output_tok_s"], 1), "total tok/s": round(s["total_tok_s"], 1),
                     "req/s": round(s["request_s"], 2),
                     "TTFT p50 ms": s["ttft_ms"]["p50"], "TTFT p99 ms": s["ttft_ms"]["p99"],
                     "TPOT p50 ms": s["tpot_ms"]["p50"], "TPOT p99 ms": s["tpot_ms"]["p99"],
                     "ITL p50 ms": s["itl_ms"]["p50"], "ITL p99 ms": s["itl_ms"]["p99"],
                     "E2E p99 ms": s["e2e_ms"]["p99"], "tokens/chunk": s["tokens_per_chunk"],
                     "cache hit": s.get("cache_hit_rate"),
                     "client-bound": s["client_bound"], "loop lag p99 ms": s["lag_ms"]["p99"]})
    df = pd.DataFrame(rows)
    return df.set_index("level").round(2) if not df.empty else df


# The level table is too wide for a page: what the level delivered, then how long it took.
THROUGHPUT_COLUMNS = ["completed", "failed", "output tok/s", "total tok/s", "req/s", "tokens/chunk", "cache hit",
                      "client-bound", "loop lag p99 ms"]
LATENCY_COLUMNS = ["TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "ITL p50 ms", "ITL p99 ms", "E2E p99 ms"]


def frames(summary: dict[str, Any]) -> list[Any]:
    """The level table as two that fit a page: throughput, then latency (empty list without levels)."""
    df = frame(summary)
    return tables.split(df, THROUGHPUT_COLUMNS, LATENCY_COLUMNS) if not df.empty else []


def text_table(result: Any) -> str:
    """Plain text for the CLI: throughput and latency per level, then ours beside the server's own figures."""
    if not result.summary.get("levels"):
        return ""
    text = "\n\n".join(tables.text(df) for df in frames(result.summary))
    srv = server_frame(result.summary)
    if not srv.empty:
        cols = ["ours_mean_ms", "server_mean_ms", "ratio_mean", "ours_p50_ms", "server_p50_ms", "ours_p99_ms", "server_p99_ms"]
        text += "\n\nOurs beside the server's own figures (its /metrics; percentiles within its buckets):\n" + tables.text(srv[cols])
    reps = replicas_frame(result.summary)
    if not reps.empty:
        text += ("\n\nEach replica's share (its own /metrics), beside the client's count:\n"
                 + tables.text(reps.set_index(["level", "server"])))
    spec = speculation_frame(result.summary)
    if not spec.empty:
        text += "\n\nSpeculative decoding per corpus kind and context (--speculation):\n" + tables.text(spec)
    return text


def server_frame(summary: dict[str, Any]):
    """Ours beside the server's own figures (SGLang's /metrics histograms), per level and metric: mean, p50 and p99
    each way and the ratio of the means. Empty when the server exposed none (no --enable-metrics)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    rows = [r for s in summary.get("levels", []) for r in beside(s)]
    df = pd.DataFrame(rows)
    return df.set_index(["level", "metric"]).round(2) if not df.empty else df


def queue_frame(summary: dict[str, Any]):
    """Per level, how the server held the load: its queue time (SGLang's queue_time_seconds), the most requests
    waiting and running (telemetry), and the requests it retracted or aborted over the level."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    rows = []
    for s in summary.get("levels", []):
        srv, tel = s.get("server_side") or {}, s.get("telemetry") or {}
        q = srv.get("queue_ms") or {}
        rows.append({"level": s["label"], "queue p50 ms": q.get("p50"), "queue p99 ms": q.get("p99"),
                     "queue mean ms": q.get("mean"), "waiting (max)": (tel.get("num_queue_reqs") or {}).get("max"),
                     "running (max)": (tel.get("num_running_reqs") or {}).get("max"),
                     "KV usage (max)": (tel.get("kv_token_usage") or {}).get("max"),
                     "retracted": srv.get("retracted_requests"), "aborted": srv.get("aborted_requests")})
    df = pd.DataFrame(rows)
    return df.set_index("level").round(2) if not df.empty else df


def _conc(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in summary.get("levels", []) if s.get("concurrency") and s["completed"]]


def plot_throughput(summary: dict[str, Any]):
    lv = _conc(summary)
    fig, ax = figure((6, 3.4))
    ax.plot([s["concurrency"] for s in lv], [s["output_tok_s"] for s in lv], marker="o", label="output")
    ax.plot([s["concurrency"] for s in lv], [s["total_tok_s"] for s in lv], marker="s", ls="--", label="input + output")
    ax.set_xscale("log", base=2)
    ax.set_title(f"Throughput vs concurrency ({summary.get('workload')})")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("tokens / s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_latency(summary: dict[str, Any]):
    lv = _conc(summary)
    fig, axes = figure((9, 3.4), ncols=2)
    c = [s["concurrency"] for s in lv]
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for p in ("p50", "p90", "p99"):
            ax.plot(c, [s[key][p] for s in lv], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{title} percentiles vs concurrency")
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(f"{title} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def plot_cdf(records: list[RequestRecord]):
    import numpy as np  # lazy: numpy only when a plot is drawn (the CLI's start-up stays light)

    fig, ax = figure((6, 3.4))
    by_level: dict[str, list[float]] = {}
    for r in records:
        if r.ok and metrics.e2e_s(r) is not None:
            by_level.setdefault(r.level, []).append(cast(float, metrics.e2e_s(r)) * 1000)
    for level, values in by_level.items():
        xs = np.sort(values)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=level)
    ax.set_title("End-to-end latency CDF by level")
    ax.set_xlabel("E2E latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(True, alpha=0.3)
    if by_level:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def spec_decoding_frame(summary: dict[str, Any]):
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    df = pd.DataFrame([{"level": s["label"], "tokens per chunk": s["tokens_per_chunk"], "TPOT p50 ms": s["tpot_ms"]["p50"],
                        "accept length (per request)": s.get("spec_accept_length_mean"), **s.get("spec_accept", {})}
                       for s in summary.get("levels", [])])
    return df.set_index("level") if not df.empty else df


def turns_frame(summary: dict[str, Any]):
    """Agentic sessions: one row per level and turn index (TTFT, TPOT, input tokens, prefix-cache hit rate)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    rows = [{"level": s["label"], "turn": t["turn"], "requests": t["requests"], "failed": t["failed"],
             "input tokens (mean)": t["input_tokens"]["mean"], "cache hit rate": t["cache_hit_rate"],
             "TTFT p50 ms": t["ttft_ms"]["p50"], "TTFT p99 ms": t["ttft_ms"]["p99"], "TPOT p50 ms": t["tpot_ms"]["p50"]}
            for s in summary.get("levels", []) for t in s.get("turns") or []]
    return pd.DataFrame(rows)


def replicas_frame(summary: dict[str, Any]):
    """Through a gateway: one row per level and replica (requests and tokens it served, from its own /metrics, and
    its share), then the level's `client` row (what the client sent, completed and counted), so the replicas' sum
    stands beside the client's own figures. Empty when the run read no replicas."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    rows = []
    for s in summary.get("levels", []):
        for r in s.get("replicas") or []:
            rows.append({"level": s["label"], "server": r["name"], "requests": r["requests"], "request share": r["request_share"],
                         "prompt tokens": r["prompt_tokens"], "generated tokens": r["generation_tokens"],
                         "token share": r["token_share"], "cached tokens": r["cached_tokens"],
                         "read": "yes" if r["scraped"] else "no answer"})
        if s.get("replicas"):
            rows.append({"level": s["label"], "server": "client", "requests": (s.get("completed") or 0) + (s.get("failed") or 0),
                         "generated tokens": s.get("output_tokens"), "read": f"{s.get('failed') or 0} failed"})
    return pd.DataFrame(rows)


def plot_turns(summary: dict[str, Any]):
    """Agentic sessions: TTFT p50 against the mean context length of each turn, one line per level."""
    fig, ax = figure((6, 3.4))
    drawn = False
    for s in summary.get("levels", []):
        ts = [t for t in s.get("turns") or [] if t["input_tokens"]["mean"] is not None and t["ttft_ms"]["p50"] is not None]
        if not ts:
            continue
        xs, ys = [t["input_tokens"]["mean"] for t in ts], [t["ttft_ms"]["p50"] for t in ts]
        ax.plot(xs, ys, marker="o", label=s["label"])
        for t, x, y in zip(ts, xs, ys, strict=True):
            hit = t.get("cache_hit_rate")
            ax.annotate(f"t{t['turn']}" + (f" {hit:.0%}" if hit is not None else ""), (x, y), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
        drawn = True
    ax.set_title("TTFT vs context length per turn (label: turn, prefix-cache hit rate)")
    ax.set_xlabel("input tokens (mean over the turn's requests)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_slo_search(summary: dict[str, Any]):
    """`--find-max slo`: SLO attainment of each level tried against its load, the limit marked."""
    r = summary.get("slo_search") or {}
    metric = r.get("metric", "concurrency")
    tried = sorted(r.get("levels_tried") or [], key=lambda t: t[metric])
    fig, ax = figure((6, 3.4))
    xs = [t[metric] for t in tried]
    ys = [(t.get("slo_attainment") or 0.0) * 100 for t in tried]
    ax.plot(xs, ys, color="0.6", zorder=1)
    ax.scatter(xs, ys, c=["tab:green" if t["meets_slo"] else "tab:red" for t in tried], zorder=2)
    if r.get("limit") is not None:
        ax.axvline(r["limit"], ls="--", color="tab:green", label=f"max under SLO: {r['limit']:g}")
        ax.legend(fontsize=8)
    ax.set_title("SLO attainment per level tried (green: level meets the SLOs)")
    ax.set_xlabel("concurrent requests" if metric == "concurrency" else "requests / s")
    ax.set_ylabel("requests meeting every SLO (%)")
    ax.set_ylim(-2, 102)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def warm_frame(summary: dict[str, Any]):
    """`--find-max warm`: one row per level the search ran (sessions at once): turns 2+ warm, cache hit, TTFT,
    tokens prefilled again per turn, the context the sessions came back to; empty when no warm search ran."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    r = summary.get("warm_sessions") or {}
    return pd.DataFrame([{"sessions": x["sessions"], "warm": "yes" if x["warm"] else "no", "turns 2+ warm": x["warm_share"],
                          "cache hit (turns 2+)": x["cache_hit_rate"], "TTFT p50 ms": x["ttft_ms"].get("p50"),
                          "TTFT p90 ms": x["ttft_ms"].get("p90"), "prefilled again / turn": x["reprefill_tokens_per_turn"],
                          "held context": x["context_tokens"], "plan holds": r.get("predicted_sessions")}
                         for x in r.get("levels") or []])


def plot_warm(summary: dict[str, Any]):
    """`--find-max warm`: cache hit and TTFT p50 of turns 2+ against concurrent sessions, the plan's prediction and
    the measured knee as vertical lines."""
    r = summary.get("warm_sessions") or {}
    rows = sorted(r.get("levels") or [], key=lambda x: x["sessions"])
    fig, ax = figure((6, 3.4))
    xs = [x["sessions"] for x in rows]
    ax.plot(xs, [(x["cache_hit_rate"] or 0.0) * 100 for x in rows], marker="o", color="tab:blue", label="cache hit, turns 2+")
    ax.set_xlabel("concurrent agent sessions")
    ax.set_ylabel("cache hit (%)", color="tab:blue")
    ax.set_ylim(-2, 102)
    tw = ax.twinx()
    tw.plot(xs, [x["ttft_ms"].get("p50") for x in rows], marker="s", color="tab:red", label="TTFT p50, turns 2+")
    tw.set_ylabel("TTFT p50 (ms)", color="tab:red")
    if r.get("predicted_sessions") is not None:
        ax.axvline(r["predicted_sessions"], ls="--", color="0.4", label=f"plan: {r['predicted_sessions']:,} warm")
    if r.get("knee_sessions") is not None:
        ax.axvline(r["knee_sessions"], ls=":", color="tab:green", label=f"measured knee: {r['knee_sessions']:,}")
    ax.set_title(f"Warm agent sessions at ~{r.get('context_tokens') or 0:,} tokens, think {r.get('think_time_s') or 0:g} s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left")
    fig.tight_layout()
    return fig


def telemetry_samples(result: Any) -> list[dict[str, Any]]:
    """Every level's telemetry samples of a BenchResult, in order (what plot_telemetry draws)."""
    return [s for lv in getattr(result, "levels", []) for s in (getattr(lv, "telemetry", None) or {}).get("samples", [])]


def _load_telemetry(samples: Any) -> list[dict[str, Any]]:
    """Samples as given, a BenchResult's, or read from a telemetry.jsonl path (one JSON object a line)."""
    if hasattr(samples, "levels"):
        return telemetry_samples(samples)
    if isinstance(samples, (str, bytes)) or hasattr(samples, "read_text"):
        return [json.loads(line) for line in Path(samples).read_text(encoding="utf-8").splitlines() if line.strip()]
    return list(samples or [])


def plot_telemetry(samples: Any):
    """Telemetry against time (s from the first sample): GPU utilisation and memory per GPU (left), the
    server's KV token usage and queued requests (right); dotted lines mark where each level starts.
    `samples`: a BenchResult, the bench's telemetry samples, or the path of a run's telemetry.jsonl."""
    rows = sorted((s for s in _load_telemetry(samples) if isinstance(s.get("t"), (int, float))), key=lambda s: s["t"])
    fig, (ax_gpu, ax_srv) = figure((11, 3.4), ncols=2)
    t0 = rows[0]["t"] if rows else 0.0
    ts = [s["t"] - t0 for s in rows]
    ax_mem, ax_q = ax_gpu.twinx(), ax_srv.twinx()
    gpus = sorted({g.get("gpu", 0) for s in rows for g in s.get("gpus") or []})
    for i in gpus:
        pts = [(t, g) for t, s in zip(ts, rows, strict=True) for g in s.get("gpus") or [] if g.get("gpu", 0) == i]
        util = [(t, g["gpu_util_pct"]) for t, g in pts if g.get("gpu_util_pct") is not None]
        mem = [(t, g["gpu_mem_used_gib"]) for t, g in pts if g.get("gpu_mem_used_gib") is not None]
        if util:
            ax_gpu.plot(*zip(*util, strict=True), color="tab:blue", alpha=0.8, label=f"GPU {i} util" if len(gpus) > 1 else "util")
        if mem:
            ax_mem.plot(*zip(*mem, strict=True), color="tab:orange", ls="--", alpha=0.8,
                        label=f"GPU {i} memory" if len(gpus) > 1 else "memory")
    kv = [(t, s["server"]["kv_token_usage"] * 100) for t, s in zip(ts, rows, strict=True)
          if (s.get("server") or {}).get("kv_token_usage") is not None]
    q = [(t, s["server"]["num_queue_reqs"]) for t, s in zip(ts, rows, strict=True)
         if (s.get("server") or {}).get("num_queue_reqs") is not None]
    if kv:
        ax_srv.plot(*zip(*kv, strict=True), color="tab:green", label="KV token usage")
    if q:
        ax_q.step(*zip(*q, strict=True), where="post", color="tab:red", alpha=0.8, label="queued requests")
    prev = None
    for t, s in zip(ts, rows, strict=True):            # level boundaries: where the label changes
        if s.get("level") != prev:
            prev = s.get("level")
            for ax in (ax_gpu, ax_srv):
                ax.axvline(t, color="0.5", ls=":", lw=1)
                ax.annotate(str(prev or ""), (t, 1.0), xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                            va="top", ha="right", color="0.35")
    ax_gpu.set_title("GPU utilisation and memory" + ("" if gpus else " (no NVML samples)"))
    ax_gpu.set_ylabel("utilisation (%)")
    ax_gpu.set_ylim(-2, 102)
    ax_mem.set_ylabel("memory used (GiB)")
    ax_srv.set_title("KV token usage and queue" + ("" if kv or q else " (no /metrics samples)"))
    ax_srv.set_ylabel("KV token usage (%)")
    ax_srv.set_ylim(-2, 102)
    ax_q.set_ylabel("queued requests")
    for ax, twin in ((ax_gpu, ax_mem), (ax_srv, ax_q)):
        ax.set_xlabel("time since the first sample (s)")
        ax.grid(True, alpha=0.3)
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def speculation_frame(summary: dict[str, Any]):
    """--speculation: one row per corpus kind and context length (bench/speculation.py's figures)."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    rows = [{"kind": b["kind"], "context": b["context_tokens"], "prompt tokens": b["prompt_tokens_mean"],
             "requests": b["requests"], "drafted": b["drafted"], "accepted": b["accepted"],
             "acceptance %": None if b["acceptance"] is None else round(100 * b["acceptance"], 1),
             "accept length": b["accept_length"], "tokens/pass": b["tokens_per_pass"],
             "tok/s spec": b["tok_s"], "tok/s off": b["tok_s_base"], "speed-up": b["speedup"],
             "speed-up 95% CI": "—" if not b.get("speedup_ci") else f"{b['speedup_ci'][0]:.2f}–{b['speedup_ci'][1]:.2f}"}
            for b in (summary.get("speculation") or {}).get("buckets", [])]
    df = pd.DataFrame(rows)
    return df.set_index(["kind", "context"]).round(2) if not df.empty else df


def plot_speculation(summary: dict[str, Any]):
    """--speculation: acceptance (left) and speed-up (right) by context length, one line per corpus kind; random
    tokens dashed."""
    study = summary.get("speculation") or {}
    fig, axes = figure((9, 3.4), ncols=2)
    for key, ax, scale, label in (("acceptance", axes[0], 100, "acceptance (%)"), ("speedup", axes[1], 1, "speed-up (×)")):
        kinds = dict.fromkeys(b["kind"] for b in study.get("buckets", []))
        for kind in kinds:
            pts = [(b["context_tokens"], b[key] * scale) for b in study["buckets"] if b["kind"] == kind and b[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ls="--" if kind == "random" else "-", label=kind)
        if key == "speedup":
            ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (prompt tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    mode = study.get("mode")
    axes[0].set_title(f"draft acceptance: real text vs random tokens{f' ({mode})' if mode else ''}")
    axes[1].set_title("decode speed-up over speculation off")
    fig.tight_layout()
    return fig


@display
def headline(result: Any) -> str:
    """What the run sent (the workload's description), or why nothing ran (its first finding)."""
    return str(result.summary.get("workload_description") or (result.findings[0].title if result.findings else ""))


@display
def level_plots(result: Any) -> list[Any]:
    """Throughput and latency against load, and the latency CDF, when levels ran."""
    if not result.summary.get("levels"):
        return []
    return [plot_throughput(result.summary), plot_latency(result.summary),
            plot_cdf([r for lv in result.levels for r in lv.sound])]


@display
def load_plots(result: Any) -> list[Any]:
    """Telemetry against time, then, where the run has them, the agentic turns and the SLO search."""
    figs = [plot_telemetry(result)] if any(lv.telemetry for lv in result.levels) else []
    if result.summary.get("turns"):          # --workload agentic: TTFT against the growing context, per turn
        figs.append(plot_turns(result.summary))
    if result.summary.get("slo_search"):     # --find-max slo: attainment per level tried, the limit marked
        figs.append(plot_slo_search(result.summary))
    if result.summary.get("warm_sessions"):  # --find-max warm: cache hit and TTFT against sessions, plan and knee
        figs.append(plot_warm(result.summary))
    return figs


@display
def speculation_plot(result: Any):
    """--speculation's plot (`plot_speculation`) when the study ran."""
    return plot_speculation(result.summary) if result.summary.get("speculation") else None


@display
def speculation_headline(result: Any) -> str:
    """--speculation's verdict line (its `bench.spec.real_vs_random` finding), or what to do to get one."""
    f = next((f for f in result.findings if f.id == "bench.spec.real_vs_random"), None)
    if f is not None:
        return f"{f.title}\n{f.detail}"
    return ("not measured: run with speculation=True (--speculation) against a server that speculates, and "
            "speculation_baseline_url (--speculation-baseline-url) set to the same server with speculation off")
