"""The few figures a fleet follows over time, taken from a run's results files into its summary.json,
so the fleet index reads one small file per run: KV pool tokens planned (20_kv_memory) and observed
(30_service's /server_info), output tok/s per benchmark level, the highest level within the SLOs, and
the accuracy probes' scores. Absent figures are left out: a run without a server has only the plan."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from runbook.core.spec import level_meets_slo


def _data(run_dir: Path, notebook: str) -> dict[str, Any]:
    try:
        doc = json.loads((run_dir / f"{notebook}.results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    data = doc.get("data") if isinstance(doc, dict) else None
    return data if isinstance(data, dict) else {}


def _num(v: Any) -> Optional[float]:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bench(levels: list[Any], slo: Any, out: dict[str, Any], search: Any = None) -> None:
    levels = [lv for lv in levels if isinstance(lv, dict) and lv.get("label")]
    tps = {str(lv["label"]): round(float(lv["output_tok_s"]), 2) for lv in levels if _num(lv.get("output_tok_s")) is not None}
    if tps:
        out["output_tok_s"] = tps
    has_slo = slo is not None and any(getattr(slo, f"{m}_ms_p99", None) for m in ("ttft", "tpot", "e2e"))
    conc = [lv for lv in levels if _num(lv.get("concurrency"))]
    if isinstance(search, dict) and search.get("metric") in ("concurrency", "rate"):
        # --find-max slo ran: its limit is the figure (its rule also bounds failed requests); 0 = no load met them
        limit = _num(search.get("limit"))
        if search["metric"] == "concurrency":
            out["max_concurrency_within_slo"] = int(limit) if limit else 0
        else:
            out["max_rate_within_slo"] = round(float(limit), 3) if limit else 0
    elif has_slo and conc:
        ok = [lv for lv in conc if level_meets_slo(lv, slo)]
        out["max_concurrency_within_slo"] = max(int(lv["concurrency"]) for lv in ok) if ok else 0


def _accuracy(data: dict[str, Any], out: dict[str, Any]) -> None:
    grid = (data.get("recall") or {}).get("grid") or []
    total = sum(int(c.get("total") or 0) for c in grid if isinstance(c, dict))
    if total:
        out["recall"] = round(sum(int(c.get("correct") or 0) for c in grid if isinstance(c, dict)) / total, 4)
    ident = [r for r in (data.get("identity") or []) if isinstance(r, dict)]
    if ident:
        out["greedy_identical"] = round(sum(1 for r in ident if r.get("identical")) / len(ident), 4)
    rows = [r for r in ((data.get("kvquant") or {}).get("rows") or []) if isinstance(r, dict)]
    active = (data.get("kvquant") or {}).get("active")
    if rows and isinstance(active, list) and len(active) == 2:
        errs = [_num(r.get("attn_out_rel_err")) for r in rows if [r.get("format"), r.get("scaling")] == active]
        errs_ok = [e for e in errs if e is not None]
        if errs_ok:
            out["kvquant_attn_rel_err_max"] = round(max(errs_ok), 6)


def figures(run_dir: Path, slo: Any = None) -> dict[str, Any]:
    """{kv_tokens_planned, kv_tokens_observed, output_tok_s{label: v}, max_concurrency_within_slo (the
    SLO search's limit when it ran, else the highest fixed level meeting them), max_rate_within_slo, recall,
    greedy_identical, kvquant_attn_rel_err_max}: whichever this run measured."""
    out: dict[str, Any] = {}
    kv = _data(run_dir, "20_kv_memory")
    if _num(kv.get("max_total_num_tokens")) is not None:
        out["kv_tokens_planned"] = int(kv["max_total_num_tokens"])
    server = _data(run_dir, "30_service").get("server") or {}
    if isinstance(server, dict) and _num(server.get("max_total_num_tokens")) is not None:
        out["kv_tokens_observed"] = int(server["max_total_num_tokens"])
    bench = _data(run_dir, "40_benchmark")
    if isinstance(bench.get("levels"), list):
        _bench(bench["levels"], slo, out, bench.get("slo_search"))
    _accuracy(_data(run_dir, "50_accuracy"), out)
    return out
