"""Stage 35's tables and plot: predicted vs observed, the warnings SGLang logged, start-up timeline. Each takes the
stage's report and returns None for an empty one (an input error: `registry.display`)."""
from __future__ import annotations

from typing import Any

from runbook.core import plots
from runbook.core.registry import display


@display
def compare_frame(rep: Any):
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook verify` loads this module for text_table alone

    return pd.DataFrame(rep.rows()).set_index("quantity")


@display
def warnings_frame(rep: Any):
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook verify` loads this module for text_table alone

    rows = [{"id": w.id, "count": w.count, "first line": w.lines[0] if w.lines else ""} for w in rep.facts.warnings.values()]
    return pd.DataFrame(rows, columns=["id", "count", "first line"])


@display
def startup_frame(rep: Any):
    """Per TP rank: weight load, KV pool (the target's, then with speculative decoding the draft's), and each
    CUDA-graph capture (GiB as SGLang logs them)."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook verify` loads this module for text_table alone

    f = rep.facts
    rows = []
    for step, weights, pools in (("weights + KV pool", f.weights, f.kv), ("draft weights + KV pool", f.weights_draft, f.kv_draft)):
        for r in sorted(set(weights) | set(pools)):
            w, k = weights.get(r, {}), pools.get(r, {})
            rows.append({"rank": r, "step": step, "seconds": w.get("elapsed_s"), "GiB": w.get("usage_gib"),
                         "detail": f"KV {k.get('dtype') or 'dtype not logged'} {k.get('tokens') or 0:,} tokens, "
                                   f"{k.get('size_gib')} GiB" if k else ""})
    for g in f.graphs:
        rows.append({"rank": g["rank"], "step": f"capture {g['name']}", "seconds": g["elapsed_s"], "GiB": g["mem_gib"],
                     "detail": (f"max bs {g['max_bs']}, " if g.get("max_bs") else "")
                     + (f"{g['avail_gib']} GiB free after" if g.get("avail_gib") is not None else "")})
    return pd.DataFrame(rows, columns=["rank", "step", "seconds", "GiB", "detail"])


@display
def fleet_frame(rep: Any):
    """With a topology: one row per replica — whether it answers, the gateway's view of it, its pool against the plan."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook verify` loads this module for text_table alone

    return pd.DataFrame(fleet_rows(rep), columns=list(_FLEET_COLUMNS))


_FLEET_COLUMNS = ("replica", "url", "answers", "registered", "healthy", "tokens observed", "tokens planned")


def fleet_rows(rep: Any) -> list[dict[str, Any]]:
    yes = lambda v: None if v is None else ("yes" if v else "no")   # noqa: E731
    return [{"replica": r["name"], "url": r["url"], "answers": yes(r["up"]), "registered": yes(r["registered"]),
             "healthy": yes(r["healthy"]),
             "tokens observed": r["observed"].get("max_total_num_tokens") or r["server"].get("max_total_num_tokens"),
             "tokens planned": r["predicted"].get("max_total_num_tokens")} for r in rep.replicas or []]


@display
def text_table(rep: Any) -> str:
    """`replanned`: the plan re-derived from the memory the log saw (free before the weights, the weights' size)."""
    if rep.replicas is not None:
        return _fleet_text(rep)
    lines = [f"{'quantity':<33} {'predicted':>14} {'observed':>14} {'server':>14} {'replanned':>14}"]
    for r in rep.rows():
        cell = lambda v: "—" if v is None else (f"{v:,}" if isinstance(v, int) else str(v))   # noqa: E731
        lines.append(f"{r['quantity']:<33} {cell(r['predicted']):>14} {cell(r['observed']):>14} {cell(r['server']):>14} "
                     f"{cell(r['replanned']):>14}")
    return "\n".join(lines)


@display
def plot_memory(rep: Any):
    """One GPU (rank 0): weights, KV pool and CUDA graphs, predicted beside observed; None when the log gave no weights."""
    if not rep.observed.get("weights_gib_per_gpu"):
        return None
    fig, ax = plots.figure((7, 2.6))
    pred, obs = rep.predicted, rep.observed
    kv0 = rep.facts.rank0(rep.facts.kv) or {}
    graphs = sum(g["mem_gib"] or 0.0 for g in rep.facts.graphs if g["rank"] == 0)
    bars = {"predicted": [pred.get("weights_gib_per_gpu") or 0, 0, 0, pred.get("avail_mem_gib_after_start") or 0],
            "observed": [obs.get("weights_gib_per_gpu") or 0, kv0.get("size_gib") or 0, graphs, obs.get("avail_mem_gib_after_start") or 0]}
    labels = ["weights", "KV pool", "CUDA graphs", "free after start"]
    for i, vals in enumerate(bars.values()):
        left = 0.0
        for lab, v in zip(labels, vals, strict=True):
            ax.barh(i, v, left=left, label=lab if i == 1 else None)
            left += v
    ax.set_yticks([0, 1], list(bars))
    ax.set_xlabel("GiB per GPU")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _fleet_text(rep: Any) -> str:
    cell = lambda v: "—" if v is None else (f"{v:,}" if isinstance(v, int) else str(v))   # noqa: E731
    rows = [dict(zip(_FLEET_COLUMNS, _FLEET_COLUMNS, strict=True)), *fleet_rows(rep)]
    width = {c: max(len(cell(r[c])) for r in rows) for c in _FLEET_COLUMNS}
    lines = ["  ".join(cell(r[c]).ljust(width[c]) for c in _FLEET_COLUMNS).rstrip() for r in rows]
    g = rep.gateway
    if g:
        pol = g.get("policy") or {}
        lines.append(f"gateway {g['url']}: " + (g["error"] or f"{len(g['workers'] or [])} worker(s)")
                     + f"; policy {pol.get('seen') or 'not read'} (spec: {pol.get('spec')})")
    return "\n".join(lines)
