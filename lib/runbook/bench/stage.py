"""Stage 40's contract: its settings and `evaluate`, the sweep plus the regression check against this
deployment's newest archived benchmark."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from runbook.bench import workloads
from runbook.bench.report import text_table
from runbook.bench.run import BenchResult, assess
from runbook.bench.settings import BenchSettings
from runbook.core import paths
from runbook.core.numeric import number
from runbook.core.options import Options
from runbook.core.registry import Stage, register
from runbook.core.settings import options_view
from runbook.core.spec import SLO, Deployment, level_meets_slo

# The flags and notebook parameters: the settings (bench/settings.py) a user sets, None meaning the spec's value.
BenchStageOptions = options_view(BenchSettings, "BenchStageOptions",
                                 help={"workload": workloads.help_text() + " (default: the spec's)"})


def evaluate(spec: Deployment, options: Options) -> BenchResult:
    """The sweep with the spec's plan under the options, then the regression check against the newest
    archived run under `archive` (default: the outputs dir; '' skips it)."""
    s = BenchSettings.resolve(spec, options)
    res = assess(spec, s, archive_root=_archive(s.archive_root))
    if s.speculation and res.summary.get("levels"):     # a server that answered the levels: the study after them
        _speculation(res, s)
    return res


def _speculation(res: BenchResult, s: BenchSettings) -> None:
    """--speculation: the study's figures as the summary's `speculation`, its findings (the verdict first) before the rest."""
    from runbook.bench import speculation_study  # lazy: the study's client only when asked for

    st = speculation_study.run(s, s.model or res.summary.get("model"), os.environ.get(s.api_key_env) if s.api_key_env else None)
    res.summary["speculation"] = st.data()
    res.findings[:0] = st.findings


def _archive(archive: str | None) -> Path | None:
    if archive == "":
        return None
    if archive is None:
        return paths.outputs_dir()
    return Path(archive)



def figures(data: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    """output_tok_s per level, and max_concurrency_within_slo: the SLO search's limit when it ran
    (max_rate_within_slo for a rate search), else the highest fixed level meeting the SLOs."""
    out: dict[str, Any] = {}
    levels = [lv for lv in (data.get("levels") or []) if isinstance(lv, dict) and lv.get("label")]
    tps = {str(lv["label"]): round(float(lv["output_tok_s"]), 2) for lv in levels if number(lv.get("output_tok_s")) is not None}
    if tps:
        out["output_tok_s"] = tps
    search = data.get("slo_search")
    has_slo = slo is not None and any(getattr(slo, f"{m}_ms_p99", None) for m in ("ttft", "tpot", "e2e"))
    conc = [lv for lv in levels if number(lv.get("concurrency"))]
    if isinstance(search, dict) and search.get("metric") in ("concurrency", "rate"):
        # --find-max slo ran: its limit is the figure (its rule also bounds failed requests); 0 = no load met them
        limit = number(search.get("limit"))
        if search["metric"] == "concurrency":
            out["max_concurrency_within_slo"] = int(limit) if limit else 0
        else:
            out["max_rate_within_slo"] = round(float(limit), 3) if limit else 0
    elif has_slo and conc:
        ok = [lv for lv in conc if level_meets_slo(lv, slo)]
        out["max_concurrency_within_slo"] = max(int(lv["concurrency"]) for lv in ok) if ok else 0
    return out


def text(result: BenchResult) -> str:
    """What `runbook bench` prints above its findings: the levels' tables."""
    return text_table(result)


STAGE = register(Stage(40, "benchmark", "bench", "benchmark a running OpenAI-compatible server (SGLang, or llama-server for demos)",
                       BenchStageOptions, evaluate, figures=figures,
                       trends=("max_concurrency_within_slo", "max_rate_within_slo"),
                       text=text, cli_defaults=lambda: {"interactive": sys.stderr.isatty()}))
