"""The tune run as one table (candidate × pre-check, start-up time (launch to ready), predicted/observed tokens, load within
the SLOs, throughput, TTFT/TPOT per context-length bucket, acceptance, J/token, guard, verdict), a Pareto
plot (throughput against latency, accuracy failures marked) and the recommendation's text."""
from __future__ import annotations

from typing import Any

from runbook.core.plots import figure
from runbook.tune import noise


def _ms(a: Any, b: Any) -> str:
    return "—" if a is None and b is None else f"{a or 0:.0f}/{b or 0:.0f}"


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per candidate (what the table, the text and the notebook show)."""
    out = []
    for r in data.get("candidates", []):
        pred, obs, b = r.get("predicted") or {}, r.get("observed") or {}, r.get("bench") or {}
        row = {"candidate": r["name"], **({"gateway policy": r["policy"]} if r.get("policy") else {}),
               "pre-check": r.get("precheck"), "KV dtype": pred.get("kv_dtype"),
               "KV B/token": pred.get("kv_bytes_per_token"),
               "start-up s": r.get("ready_s"), "tokens predicted": pred.get("max_total_num_tokens"),
               "tokens observed": obs.get("max_total_num_tokens"), "running cap": pred.get("max_running_requests"),
               "load within SLO": b.get("slo_limit"), "tok/s": round(b["output_tok_s"], 1) if b.get("output_tok_s") else None,
               "gain vs reference": noise.describe(r.get("gain") or r.get("noise")) or None}
        for k in b.get("buckets", []):
            row[f"TTFT p50/p99 ms {k['bucket']}"] = _ms(k["ttft_ms_p50"], k["ttft_ms_p99"])
            row[f"TPOT p50/p99 ms {k['bucket']}"] = _ms(k["tpot_ms_p50"], k["tpot_ms_p99"])
            if k.get("accept_length"):
                row[f"accept {k['bucket']}"] = k["accept_length"]
        if any(t.get("cache_hit_rate") is not None for t in b.get("turns") or []):
            row["cache hit per turn"] = cache_hits(b["turns"])
        if b.get("warm_sessions"):       # tune.warm_search: the knee beside the plan's
            row["warm sessions"] = warm_cell(b["warm_sessions"])
        row.update({"acceptance": b.get("accept_length"), "J/token": b.get("j_per_token"),
                    "guard": (r.get("guard") or {}).get("status"), "verdict": r.get("verdict") or r.get("status"),
                    "reason": r.get("reason") or ""})
        out.append(row)
    return out


def warm_cell(w: dict[str, Any]) -> str:
    """`7 (plan 6)`: the most sessions kept warm; `> 8` when every level tried stayed warm, 0 when one was cold."""
    most = max((x["sessions"] for x in w.get("levels") or []), default=0)
    knee = (w.get("knee_sessions") or 0) if w.get("reached") else f"> {most}"
    return f"{knee} (plan {w.get('predicted_sessions')})"


def cache_hits(turns: list[dict[str, Any]]) -> str:
    """`0 % / 81 % / 88 %`: the prefix-cache hit rate of turn 1, 2, 3, …"""
    return " / ".join("—" if t.get("cache_hit_rate") is None else f"{t['cache_hit_rate'] * 100:.0f} %" for t in turns)


def turns_frame(data: dict[str, Any]):
    """Per candidate and agentic turn: requests, failed, TTFT p50 and the prefix-cache hit rate."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    recs = [{"candidate": r["name"], **t} for r in data.get("candidates", []) for t in (r.get("bench") or {}).get("turns") or []]
    return pd.DataFrame(recs).set_index(["candidate", "turn"]) if recs else pd.DataFrame()


def frame(data: dict[str, Any]):
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    return pd.DataFrame(rows(data)).set_index("candidate")


# The candidates table as three that fit a page: what was planned and launched, what was measured, the verdict.
PLAN_COLUMNS = ["gateway policy", "pre-check", "KV dtype", "KV B/token", "tokens predicted", "tokens observed", "running cap", "start-up s"]
VERDICT_COLUMNS = ["gain vs reference", "guard", "verdict", "reason"]


def frames(data: dict[str, Any]) -> list[Any]:
    """`frame` split by PLAN_COLUMNS, the measured figures (load, throughput, the per-bucket latencies,
    acceptance, energy) and VERDICT_COLUMNS; an empty list without candidates."""
    from runbook.core import tables  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    if not data.get("candidates"):
        return []
    df = frame(data)
    measured = [c for c in df.columns if c not in PLAN_COLUMNS + VERDICT_COLUMNS]
    return tables.split(df, PLAN_COLUMNS, measured, VERDICT_COLUMNS)


def buckets_frame(data: dict[str, Any]):
    """Per candidate and context-length bucket: requests, TTFT and TPOT p50/p99, acceptance length."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    recs = [{"candidate": r["name"], **k} for r in data.get("candidates", []) for k in (r.get("bench") or {}).get("buckets", [])]
    return pd.DataFrame(recs).set_index(["candidate", "bucket"]) if recs else pd.DataFrame()


def launches(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per launched candidate: its start-up time, what the server reported about itself (SGLang's /server_info), the
    difference its guard tested, and its verdict."""
    out = []
    for r in data.get("candidates", []):
        if r.get("ready_s") is None:
            continue
        si, mem = r.get("server_info") or {}, (r.get("server_info") or {}).get("memory_usage") or {}
        out.append({"candidate": r["name"], "start-up s": r["ready_s"], "version": si.get("version"),
                    "KV dtype": si.get("kv_cache_dtype") or (r.get("observed") or {}).get("kv_dtype"),
                    "token pool": si.get("max_total_num_tokens", (r.get("observed") or {}).get("max_total_num_tokens")),
                    "KV GB": mem.get("kvcache"), "chunked prefill": si.get("chunked_prefill_size"),
                    "running cap": si.get("max_running_requests"),
                    "tested against the reference": (r.get("guard") or {}).get("tested"),
                    "verdict": r.get("verdict") or r.get("status")})
    return out


def launches_frame(data: dict[str, Any]):
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)

    recs = launches(data)
    return pd.DataFrame(recs).set_index("candidate") if recs else pd.DataFrame()


def text_table(rep: Any) -> str:
    """Plain text for the CLI: the table's main columns, then the recommendation."""
    data = rep.data()
    cols = ["candidate", "pre-check", "tokens predicted", "running cap", "start-up s", "tokens observed", "load within SLO",
            "tok/s", "gain vs reference", "acceptance", "J/token", "guard", "verdict"]
    if any(r.get("policy") for r in data.get("candidates", [])):    # a gateway's policies: no pool, a cache per turn
        cols = ["candidate", "gateway policy", "pre-check", "start-up s", "load within SLO", "tok/s", "gain vs reference",
                "cache hit per turn", "guard", "verdict"]
    if data.get("plan_only"):
        cols = ["candidate", "pre-check", "KV dtype", "KV B/token", "tokens predicted", "running cap", "reason"]
    table = [[("—" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows(data)]
    widths = [max(len(c), *(len(t[i]) for t in table)) if table else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)) for t in table]
    rec = recommendation_text(data)
    return "\n".join(lines) + ("\n\n" + rec if rec else "")


def recommendation_text(data: dict[str, Any]) -> str:
    rec = data.get("recommendation")
    if data.get("plan_only"):
        return "plan only: nothing was launched"
    if not rec:
        return "no recommendation: no candidate ran and passed the accuracy guard"
    head = (f"Recommended: {rec['name']} (keep the deployment as it is)" if rec.get("is_reference")
            else f"Recommended: {rec['name']}")
    parts = [head]
    if rec.get("slo_limit") is not None:
        parts.append(f"  load within SLO: {rec['slo_limit']} concurrent requests")
    if rec.get("output_tok_s"):
        parts.append(f"  output throughput: {rec['output_tok_s']:.1f} tok/s")
    if not rec.get("is_reference") and rec.get("gain"):
        parts.append(f"  throughput gain over the reference: {noise.describe(rec['gain'])}")
    if rec.get("within_noise"):
        parts.append("  no candidate's gain was outside the noise: "
                     + "; ".join(f"{w['name']} {w['gain']}" for w in rec["within_noise"]))
    if not rec.get("is_reference"):
        parts.append(f"  install: {rec.get('command')}")
        if rec.get("diff"):
            parts.append(rec["diff"].rstrip())
        elif rec.get("note"):
            parts.append(f"  {rec['note']}")
    return "\n".join(parts)


def _latency(r: dict[str, Any]) -> float | None:
    """The candidate's TPOT p50 over its highest fixed level (ms)."""
    levels = (r.get("bench") or {}).get("levels") or []
    if not levels:
        return None
    top = max(levels, key=lambda lv: lv.get("concurrency") or 0)
    return (top.get("tpot_ms") or {}).get("p50")


def pareto(data: dict[str, Any]) -> list[str]:
    """Names on the Pareto front of the candidates that passed the guard: no other has more throughput and less latency."""
    pts: list[tuple[str, float, float]] = []
    for r in data.get("candidates", []):
        if (r.get("guard") or {}).get("status") == "fail":
            continue
        t, lat = (r.get("bench") or {}).get("output_tok_s"), _latency(r)
        if t is not None and lat is not None:
            pts.append((r["name"], float(t), float(lat)))
    return [n for n, t, lat in pts if not any(t2 >= t and l2 <= lat and (t2, l2) != (t, lat) for _, t2, l2 in pts)]


def within_noise(r: dict[str, Any]) -> bool:
    """A candidate whose throughput gain over the reference could not be told from the noise."""
    g = r.get("gain") or {}
    return bool(g) and not g.get("outside_noise")


def plot_pareto(data: dict[str, Any]):
    """Throughput against TPOT at the highest level; the front joined, accuracy failures as red crosses. None when no
    candidate was measured (a plan-only run, an empty report's {})."""
    measured = [r for r in data.get("candidates", []) if (r.get("bench") or {}).get("output_tok_s") is not None
                and _latency(r) is not None]
    if not measured:
        return None
    fig, ax = figure((7, 4.5))
    front = set(pareto(data))
    pts = []
    for r in measured:
        tps, lat = (r.get("bench") or {}).get("output_tok_s"), _latency(r)
        bad = (r.get("guard") or {}).get("status") == "fail"
        quiet = within_noise(r)
        pts.append((lat, tps, r["name"]))
        color = "#c0392b" if bad else ("#1e8449" if r.get("verdict") == "recommended" else "#2e86c1")
        ax.scatter([lat], [tps], marker="x" if bad else "o", s=70, zorder=3, color=color,
                   **({"facecolors": "none", "edgecolors": color} if quiet and not bad else {}))
        ax.annotate(r["name"] + (" (accuracy guard failed)" if bad else " (within noise)" if quiet else ""), (lat, tps),
                    textcoords="offset points", xytext=(6, 4), fontsize=8)
    fr = sorted(p for p in pts if p[2] in front)
    if len(fr) > 1:
        ax.plot([p[0] for p in fr], [p[1] for p in fr], color="#7f8c8d", lw=1, ls="--", zorder=2, label="Pareto front")
        ax.legend(loc="best", fontsize=8)
    ax.margins(0.12)                     # room for the labels at the edges
    ax.set_xlabel("TPOT p50 at the highest concurrency (ms)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Candidates: throughput against latency\n(x: accuracy guard failed; hollow: gain within the noise)", fontsize=10)
    ax.grid(alpha=0.3)
    return fig
