"""Tables and plots for the accuracy notebook (numpy and pandas imported inside each: the registry imports the package).
The tables and plots take the study's rows and the probes' data; what notebook 50 calls with the report itself returns
None for an empty one (an input error: `registry.display`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runbook.accuracy.kld import TAIL_KLD
from runbook.core import tables
from runbook.core.plots import figure
from runbook.core.registry import display


def kv_table(rows: Sequence[dict[str, Any]]):
    """Worst layer per source × format × scaling."""
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    agg = df.groupby(["source", "format", "scaling"]).agg(
        k_rel_err=("k_rel_err", "max"), v_rel_err=("v_rel_err", "max"), clipped_frac=("clipped_frac", "max"),
        flushed_frac=("flushed_frac", "max"), attn_out_rel_err=("attn_out_rel_err", "max"))
    return (agg * 100).round(3).rename(columns=lambda c: c + " %")


def kv_layer_table(layers: Sequence[dict[str, Any]]):
    """Which layers clip at scale 1.0 (kvstats.clipping_layers: the worst KV head per layer), clipping ones first;
    shares in percent."""
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    df = pd.DataFrame(layers)
    if df.empty:
        return df
    df = df.sort_values(["clips_e4m3", "layer"], ascending=[False, True]).set_index("layer")
    df["clips at 1.0"] = df["clips_e4m3"].map({True: "E4M3", False: "no"}).where(~df["clips_e5m2"], "E4M3 and E5M2")
    for c in ("k_e4m3_clip_share", "v_e4m3_clip_share", "k_e5m2_clip_share", "v_e5m2_clip_share"):
        df[c] = df[c] * 100
    cols = {"clips at 1.0": "clips at 1.0", "k_absmax": "K |max|", "v_absmax": "V |max|", "k_e4m3_clip_share": "K > 448 %",
            "v_e4m3_clip_share": "V > 448 %", "k_e5m2_clip_share": "K > 57,344 %", "v_e5m2_clip_share": "V > 57,344 %"}
    return df[list(cols)].rename(columns=cols)


def kv_layer_errors(rows: Sequence[dict[str, Any]]):
    """Attention-output relative error (%) per layer (rows) and storage format × scaling (columns)."""
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["variant"] = df["format"] + " " + df["scaling"]
    return (df.pivot_table(index="layer", columns="variant", values="attn_out_rel_err", aggfunc="max") * 100).round(3)


def plot_layers(layers: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]):
    """Per layer: |K| and |V| maxima against FP8's limits (left), attention-output error per format (right)."""
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    lf, rf = pd.DataFrame(layers), pd.DataFrame(rows)
    fig, (a, b) = figure((11, 3.8), ncols=2)
    if not lf.empty:
        a.semilogy(lf["layer"], lf["k_absmax"], marker="o", label="K (after RoPE)")
        a.semilogy(lf["layer"], lf["v_absmax"], marker="s", label="V")
        a.axhline(448, color="red", ls="--", lw=1, label="E4M3 max 448")
    a.set_title("Largest |value| per layer (worst KV head)", fontsize=10)
    a.set_xlabel("layer")
    a.grid(True, alpha=0.3)
    a.legend(fontsize=7)
    if not rf.empty:
        for (fmt, sc), g in rf.groupby(["format", "scaling"]):
            b.semilogy(g["layer"], g["attn_out_rel_err"].clip(lower=1e-6) * 100, marker=".", label=f"{fmt} {sc}")
    b.set_title("Attention-output error per layer", fontsize=10)
    b.set_xlabel("layer")
    b.set_ylabel("relative error (%)")
    b.grid(True, alpha=0.3)
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig


# The tool-call cases as two tables that fit a page, one row per tool and mode: what came back, then the arguments.
TOOLCALL_ANSWER = ["called", "name", "in_content", "in_reasoning", "content_chars", "finish_reason", "error"]
TOOLCALL_ARGUMENTS = ["arguments_valid", "schema_errors", "arguments_chars", "argument_deltas", "last_delta_share"]


def toolcall_frames(cases: Sequence[dict[str, Any]]) -> list[Any]:
    """The probe's cases indexed by tool and streamed or not, split by TOOLCALL_ANSWER and TOOLCALL_ARGUMENTS, with
    headers in words (a snake_case header cannot wrap); an empty list without cases."""
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    if not cases:
        return []
    df = pd.DataFrame(cases)
    if "schema_errors" in df:
        df["schema_errors"] = df["schema_errors"].map(lambda e: "; ".join(e) if e else None)
    df["stream"] = df["stream"].map(lambda s: "streamed" if s else "not streamed")
    df = df.set_index(["tool", "stream"])
    return [f.rename(columns=lambda c: c.replace("_", " ")) for f in tables.split(df, TOOLCALL_ANSWER, TOOLCALL_ARGUMENTS)]


def plot_growth(growth: Sequence[dict[str, Any]]):
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
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
    import numpy as np  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
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


def _bucket(r: dict[str, Any]) -> str:
    return f"[{r['from']:,}, {r['to']:,})"


def _pct(x: Any) -> float | None:
    return 100 * x if isinstance(x, (int, float)) else None


def kld_table(doc: dict[str, Any]):
    """The KLD probe per depth bucket and overall: the candidate beside the noise floor (`doc`: probes.run_kld's
    document, or any {"candidate": KldResult.data(), "floor": KldResult.data()})."""
    import pandas as pd  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    cand, floor = doc.get("candidate") or {}, doc.get("floor") or {}
    rows = list(cand.get("by_depth") or []) + ([{**cand["overall"], "from": None}] if cand.get("overall") else [])
    frows = list(floor.get("by_depth") or []) + ([floor["overall"]] if floor.get("overall") else [])
    out = []
    for i, r in enumerate(rows):
        f = frows[i] if i < len(frows) else {}
        ci = r.get("kld_ci") or [None, None]
        out.append({"depth": "all" if r.get("from") is None else _bucket(r), "positions": r.get("positions"),
                    "mean KLD": r.get("kld_mean"), "KLD 95 % CI": (f"{ci[0]:.5f} … {ci[1]:.5f}" if ci[0] is not None else None),
                    "floor mean KLD": f.get("kld_mean"), "KLD p99": r.get("kld_p99"), "KLD max": r.get("kld_max"),
                    f"% above {TAIL_KLD:g} nats": _pct(r.get("kld_share_above")),
                    f"floor % above {TAIL_KLD:g}": _pct(f.get("kld_share_above")),
                    "same top-1 %": 100 * r["same_top1"] if r.get("same_top1") is not None else None,
                    "floor same top-1 %": 100 * f["same_top1"] if f.get("same_top1") is not None else None,
                    "PPL ratio": r.get("ppl_ratio"), "RMS Δp %": 100 * r["dp_rms"] if r.get("dp_rms") is not None else None})
    df = pd.DataFrame(out)
    return df.set_index("depth") if not df.empty else df


def plot_kld(doc: dict[str, Any]):
    """Mean KLD (with its bootstrap CI) and same-top-1 by depth bucket: the noise floor(s) and the candidate."""
    import numpy as np  # lazy: numpy and pandas only when a table or plot is drawn (the CLI's start-up stays light)
    series = [("reference vs itself (second pass)", doc.get("floor")), ("reference vs itself (batched)", doc.get("floor_batch")),
              ("candidate", doc.get("candidate"))]
    shown = [(n, d) for n, d in series if d and d.get("by_depth")]
    fig, axes = figure((10, 3.6), ncols=2)
    for name, d in shown:
        rows = [r for r in (d or {})["by_depth"] if r.get("positions")]
        x = np.arange(len(rows))
        y = np.array([r["kld_mean"] for r in rows])
        lo = np.array([r["kld_ci"][0] if r.get("kld_ci") and r["kld_ci"][0] is not None else m for r, m in zip(rows, y, strict=False)])
        hi = np.array([r["kld_ci"][1] if r.get("kld_ci") and r["kld_ci"][1] is not None else m for r, m in zip(rows, y, strict=False)])
        axes[0].errorbar(x, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)], marker="o", capsize=3, label=name)
        axes[1].plot(x, [100 * r["same_top1"] for r in rows], marker="o", label=name)
        for ax in axes:
            ax.set_xticks(x, [_bucket(r) for r in rows], fontsize=7)
    axes[0].set_title("Mean KL divergence from the reference by depth", fontsize=10)
    axes[0].set_ylabel("nats per token")
    axes[1].set_title("Same top-1 token as the reference by depth", fontsize=10)
    axes[1].set_ylabel("%")
    for ax in axes:
        ax.set_xlabel("depth (tokens of context)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---- what notebook 50 calls with its report: one function per cell, None for an empty report ----------------------

@display
def study_text(rep: Any) -> str:
    """Where the study's K and V come from, and which of its rows are this deployment's KV cache."""
    return (f"{rep.study.source}\nthis deployment's KV cache: {rep.active[0]}, scaling {rep.active[1]} — thresholds "
            "apply to it; other rows are for comparison")


@display
def layers_frame(rep: Any):
    """A decoder's K and V per layer (`kv_layer_table`); None for the MiniLM encoder."""
    return kv_layer_table(rep.study.decoder.get("layers", [])) if rep.study.kind == "decoder" else None


@display
def layers_plot(rep: Any):
    """A decoder's clipping per layer (`plot_layers`); None for the MiniLM encoder."""
    return plot_layers(rep.study.decoder["layers"], rep.study.rows) if rep.study.kind == "decoder" else None


@display
def study_frame(rep: Any):
    """The worst layer per source, format and scaling (`kv_table`)."""
    return kv_table(rep.study.rows)


@display
def growth_plot(rep: Any):
    """The error's growth with context length (`plot_growth`)."""
    return plot_growth(rep.study.growth)


@display
def recall_plots(rep: Any, url: str | None = None, compare_url: str | None = None) -> list[Any]:
    """Needle recall per length and depth at url, then at compare_url (A/B); [] when recall was not measured."""
    grid, grid_b = rep.recall.get("grid"), rep.recall.get("grid_b")
    return ([plot_recall(grid, f"Needle recall at {url}")] if grid else []) + \
        ([plot_recall(grid_b, f"Needle recall at {compare_url}")] if grid and grid_b else [])


@display
def identity_frames(rep: Any) -> list[Any]:
    """What differs between A and B, A against B per prompt, one at a time against batch_size at once."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return [pd.DataFrame(rep.identity_differences), pd.DataFrame(rep.identity), pd.DataFrame(rep.identity_batch)]


@display
def toolcall_tables(rep: Any) -> list[Any]:
    """The tool-call probe's answers, then their arguments (`toolcall_frames`); [] when not probed."""
    return toolcall_frames(rep.toolcall.get("cases") or [])


@display
def kld_text(rep: Any) -> str:
    """The KL divergence's verdict line, or "" when it was not measured."""
    kl = rep.kld
    return f"{kl['verdict']['status']}: {kl['tested']}; floor used: {kl['floor_used']}" if kl else ""


@display
def kld_frame(rep: Any):
    """The KL divergence per depth (`kld_table`); None when it was not measured."""
    return kld_table(rep.kld) if rep.kld else None


@display
def kld_plot(rep: Any):
    """The KL divergence against depth beside the noise floor (`plot_kld`); None when it was not measured."""
    return plot_kld(rep.kld) if rep.kld else None


# What a live probe with nothing to show says instead, pointing at the finding that says why.
_NOT_MEASURED = {"recall": "recall not measured (see the recall.endpoint finding)",
                 "identity": "identity not checked (see the identity.endpoint finding)",
                 "toolcall": "tool calls not probed (see the accuracy.toolcall.endpoint finding)",
                 "kld": "KL divergence not measured (see the accuracy.kld.* findings)"}


@display
def not_measured(rep: Any, part: str) -> str:
    """What a live probe (recall, identity, toolcall, kld) says when it has nothing to show, else ""."""
    shown = {"recall": rep.recall.get("grid"), "identity": rep.identity or rep.identity_batch,
             "toolcall": rep.toolcall.get("cases"), "kld": rep.kld}[part]
    return "" if shown else _NOT_MEASURED[part]
