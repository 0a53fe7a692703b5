"""Tables and plots for the accuracy notebook (imported on first use: runbook.accuracy's lazy exports)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from runbook.core import tables
from runbook.core.plots import figure


def kv_table(rows: Sequence[dict[str, Any]]):
    """Worst layer per source × format × scaling."""
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    agg = df.groupby(["source", "format", "scaling"]).agg(
        k_rel_err=("k_rel_err", "max"), v_rel_err=("v_rel_err", "max"), clipped_frac=("clipped_frac", "max"),
        flushed_frac=("flushed_frac", "max"), attn_out_rel_err=("attn_out_rel_err", "max"))
    return (agg * 100).round(3).rename(columns=lambda c: c + " %")


# The tool-call cases as two tables that fit a page, one row per tool and mode: what came back, then the arguments.
TOOLCALL_ANSWER = ["called", "name", "in_content", "in_reasoning", "content_chars", "finish_reason", "error"]
TOOLCALL_ARGUMENTS = ["arguments_valid", "schema_errors", "arguments_chars", "argument_deltas", "last_delta_share"]


def toolcall_frames(cases: Sequence[dict[str, Any]]) -> list[Any]:
    """The probe's cases indexed by tool and streamed or not, split by TOOLCALL_ANSWER and TOOLCALL_ARGUMENTS, with
    headers in words (a snake_case header cannot wrap); an empty list without cases."""
    if not cases:
        return []
    df = pd.DataFrame(cases)
    if "schema_errors" in df:
        df["schema_errors"] = df["schema_errors"].map(lambda e: "; ".join(e) if e else None)
    df["stream"] = df["stream"].map(lambda s: "streamed" if s else "not streamed")
    df = df.set_index(["tool", "stream"])
    return [f.rename(columns=lambda c: c.replace("_", " ")) for f in tables.split(df, TOOLCALL_ANSWER, TOOLCALL_ARGUMENTS)]


def plot_growth(growth: Sequence[dict[str, Any]]):
    df = pd.DataFrame(growth)
    fig, axes = figure((10, 3.6), ncols=2)
    for ax, src in zip(axes, sorted(df["source"].unique()) if not df.empty else [], strict=False):
        d = df[df["source"] == src].groupby(["format", "scaling", "length"])["attn_out_rel_err"].max().reset_index()
        for (fmt, sc), g in d.groupby(["format", "scaling"]):
            ax.plot(g["length"], g["attn_out_rel_err"] * 100, marker="o", label=f"{fmt} {sc}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"Attention-output error vs context\n{src}", fontsize=10)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("relative error (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_recall(grid: Sequence[dict[str, Any]], title: str = "Needle recall (exact match)"):
    lengths = sorted({c["length"] for c in grid})
    depths = sorted({c["depth"] for c in grid})
    m = np.full((len(depths), len(lengths)), np.nan)
    for c in grid:
        m[depths.index(c["depth"]), lengths.index(c["length"])] = c["correct"] / c["total"] if c["total"] else np.nan
    fig, ax = figure((1.2 * len(lengths) + 2.5, 0.5 * len(depths) + 2))
    im = ax.imshow(m, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{L // 1024}K" if L >= 1024 else str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("haystack length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="fraction recalled")
    fig.tight_layout()
    return fig
