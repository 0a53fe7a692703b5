"""Stage 40's contract: its settings and `evaluate`, the sweep plus the regression check against this
deployment's newest archived benchmark."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from runbook.bench import workloads
from runbook.core import paths
from runbook.core.archive import number
from runbook.core.options import Integer, NonNegFloat, NonNegInt, Options, PosFloat, PosInt, Url
from runbook.core.registry import Stage, register
from runbook.core.spec import SLO, Deployment, level_meets_slo

if TYPE_CHECKING:
    from runbook.bench.run import BenchOptions, BenchResult


class BenchStageOptions(Options):
    url: Url | None = Field(None, description="server base URL (default: the spec's host:port)")
    model: str | None = Field(None, description="model name to send (default: the server's first /v1/models entry)")
    concurrency: list[PosInt] | None = Field(None, description="fixed-concurrency levels, e.g. 1,2,4 (default: the spec's plan)")
    rates: list[PosFloat] | None = Field(None, alias="rate", description="Poisson request-rate levels (requests/s), run alone")
    requests: PosInt | None = Field(None, description="measured requests per level (default: the spec's)")
    duration: PosFloat | None = Field(None, description="measure each level for S seconds (no request starts later)")
    workload: str | None = Field(None, description=workloads.help_text() + " (default: the spec's)")
    turns: PosInt | None = Field(None, description="agentic: turns per session (default 4)")
    think_time: NonNegFloat | None = Field(None, description="agentic: pause between turns, fixed or an exponential's mean (default 0)")
    think_dist: Literal["fixed", "exp"] | None = Field(None, description="agentic: think time fixed, or exponential with that mean")
    tool_result_len: NonNegInt | None = Field(None, description="agentic: synthetic tool-result tokens per turn (default 256)")
    trace_speed: PosFloat | None = Field(None, description="trace:FILE: replay X times as fast (default 1)")
    find_max: Literal["slo"] | None = Field(None, description="slo: bracket then bisect concurrency (or --rate START) for the "
                                                                  "highest load meeting the spec's SLOs, instead of the fixed levels")
    workers: PosInt | None = Field(None, description="load-generator processes for fixed-concurrency levels (default 1): each "
                                                       "takes every N-th request and a share of the concurrency, one clock, records merged")
    transport: Literal["h1", "aiohttp"] | None = Field(None, description="HTTP client for the streamed requests: h1 (asyncio "
                                                                           "protocol over httptools; default) or aiohttp")
    input_len: PosInt | None = Field(None, description="prompt tokens (random, longctx, prefix; default: the spec's)")
    output_len: PosInt | None = Field(None, description="generated tokens per request, ignore_eos (default: the spec's)")
    chat: bool = Field(False, description="use /v1/chat/completions")
    tokenizer: str | None = Field(None, description="dir with tokenizer.json for exact lengths and client token counts")
    warmup: NonNegInt | None = Field(None, description="warm-up requests per level (default: the spec's)")
    out: str | None = Field(None, description="write records.jsonl and summary.json here")
    compare_url: Url | None = Field(None, description="A/B: the same workload against this second endpoint")
    seed: Integer = Field(0, description="the workload is deterministic from this seed")
    timeout: PosFloat = Field(600.0, description="per-request timeout, seconds")
    flush_cache: bool = Field(False, description="POST /flush_cache before each level (default: the spec's benchmark.flush_cache, off)")
    archive: str | None = Field(None, description="compare with this deployment's newest benchmark archived here "
                                                     "(default: outputs/; '' to skip)")
    progress: bool = Field(False, description="progress bars on stderr")

    @model_validator(mode="after")
    def _requests_or_duration(self) -> BenchStageOptions:
        if self.requests and self.duration:
            raise ValueError("--requests and --duration both bound a level: give one")
        return self


def evaluate(spec: Deployment, options: BenchStageOptions) -> BenchResult:
    """The sweep with the spec's plan under the options, then the regression check against the newest
    archived run under `archive` (default: the outputs dir; '' skips it)."""
    from runbook.bench.run import measure  # the HTTP client and numpy: only when the stage runs

    return measure(spec, merged(spec, options), archive_root=_archive(options.archive))


def merged(spec: Deployment, o: BenchStageOptions) -> BenchOptions:
    """The one merge of the spec's benchmark plan with the options (CLI and notebook alike)."""
    from runbook.bench.run import options_from

    return options_from(spec, o.url, model=o.model, concurrency=o.concurrency, rates=o.rates, requests=o.requests,
                        duration_s=o.duration, workload=o.workload, input_len=o.input_len, output_len=o.output_len,
                        chat=o.chat or None, tokenizer=o.tokenizer, warmup=o.warmup, out=Path(o.out) if o.out else None,
                        seed=o.seed, compare_url=o.compare_url, timeout_s=o.timeout, flush=o.flush_cache or None,
                        progress=o.progress, turns=o.turns, think_time_s=o.think_time, think_dist=o.think_dist,
                        tool_result_len=o.tool_result_len, trace_speed=o.trace_speed, find_max=o.find_max,
                        workers=o.workers, transport=o.transport)


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
    from runbook.bench.report import text_table  # lazy: pandas (~0.35 s), only when a table is printed

    return text_table(result)


STAGE = register(Stage(40, "benchmark", "bench", "benchmark a running OpenAI-compatible server (SGLang, or llama-server for demos)",
                       BenchStageOptions, evaluate, figures=figures,
                       trends=("max_concurrency_within_slo", "max_rate_within_slo"),
                       runner_params={"artifact_dir": "out", "archive_root": "archive", "interactive": "progress"},
                       text=text, cli_defaults=lambda: {"progress": sys.stderr.isatty()}))
