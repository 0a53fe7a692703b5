"""`runbook bench`'s run, from its settings (bench/settings.py): build the workload, measure the levels (fixed, the
workload's own, or the SLO search), summarise them, A/B, then compare with the previous archived run; the same
call for CLI, notebook and tune."""
from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.bench import metrics, replicas, server_side, warm, workers, workloads
from runbook.bench.ab import ab_compare
from runbook.bench.level_findings import level_findings
from runbook.bench.regression import compare_previous
from runbook.bench.settings import DURATION_REQUESTS, BenchSettings
from runbook.bench.slo_search import slo_search, slo_search_findings
from runbook.bench.sweep import Level, LevelResult, cache_hit_from_metrics, levels_of, run_level
from runbook.bench.telemetry import Telemetry
from runbook.bench.workloads import BuildContext
from runbook.core import registry
from runbook.core.archive import previous_data
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.endpoint import client as stream_client
from runbook.endpoint.client import Client, RequestRecord
from runbook.endpoint.reach import fetch_json, model_name, probe, run_sync
from runbook.model.tokenizer import load_tokenizer

# smg 1.13.0 answers HTTP 400 to a completions `prompt` of token ids (SGLang itself takes them), so every request fails
TOKEN_IDS_THROUGH_GATEWAY = ("--workload {workload} sends token-id prompts, which the gateway refuses (smg 1.13.0: HTTP 400 "
                             "'prompt: data did not match any variant of untagged enum StringOrArray'): add --chat, or use "
                             "--workload code, prefix or agentic, or give one replica's --url")


@dataclass
class BenchResult:
    summary: dict[str, Any]
    findings: list[Finding]
    levels: list[LevelResult] = field(default_factory=list)
    records_path: Path | None = None

    def data(self) -> dict[str, Any]:
        """The results-JSON payload: the summary (with `levels`, empty when nothing ran)."""
        return dict(self.summary, levels=self.summary.get("levels", []))


def level_summary(lr: LevelResult, slo: Any = None, behind: dict[str, str] | None = None) -> dict[str, Any]:
    s = metrics.summarise(lr.records, slo)
    s.update({"label": lr.level.label, "concurrency": lr.level.concurrency, "rate": lr.level.rate,
              "client_bound": lr.client_bound, "lag_ms": lr.lag_ms, "cpu_share": lr.cpu_share,
              "client_cpu_s": lr.cpu_s, "chunks": sum(len(r.chunk_times) for r in lr.records),
              "cache_flushed": lr.flushed, "server": lr.server.get("gauges", {}), "spec_accept": lr.server.get("spec_accept", {})})
    if lr.telemetry is not None:
        s["telemetry"] = lr.telemetry.get("summary", {})
    if lr.workers_lost:
        s["workers_lost"] = lr.workers_lost
    s["cache_hit_rate"], s["cache_hit_source"] = cache_hit(lr, metrics.sound(lr.records, s["implausible"]))
    s["server_side"] = server_side.level(lr.server)
    if behind:                   # through a gateway: each replica's share, from its own counters
        s["replicas"] = replicas.rows(behind, lr.replicas)
    return s


def cache_hit(lr: LevelResult, records: list[RequestRecord] | None = None) -> tuple[float | None, str | None]:
    """The level's prefix-cache hit rate: from the server's usage (cached_tokens ÷ prompt_tokens over
    completed requests: `records`, else the level's sound ones) where it reports cached tokens, else from SGLang's
    /metrics counters."""
    pairs = [(r.cached_tokens, r.input_tokens) for r in (lr.sound if records is None else records)
             if r.ok and r.cached_tokens is not None and r.input_tokens]
    if pairs:
        return sum(c for c, _ in pairs) / sum(n for _, n in pairs), "usage"
    m = cache_hit_from_metrics(lr.server)
    return (m, "metrics") if m is not None else (None, None)


async def run_async(o: BenchSettings, slo: Any = None, vocab_size: int | None = None) -> BenchResult:
    workloads.check(o)
    ctx = BuildContext(load_tokenizer(o.tokenizer), vocab_size)   # every input read before the server is probed:
    wt = workloads.resolve(o.workload)                              # a bad one is an error whether or not a server answers
    wl = wt.start(o, ctx)
    why = await probe(o.server)
    if why:
        return _unreachable(o.server, why)
    api_key = os.environ.get(o.api_key_env) if o.api_key_env else None
    model = o.model or await model_name(o.server, api_key)
    out = Path(o.artifact_dir) if o.artifact_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl" if out else None
    runner = _LevelRunner(o, slo, ctx, model, api_key, wt, wl, out, records_path)
    runner.procs = workers.pool(o.workers) if o.workers > 1 else None     # before any level's clock starts
    try:
        search = await _levels(o, slo, wt.levels(o, wl), runner)
    except BaseException:
        workers.close(runner.procs, at_once=True)    # cancelled (a signal): the workers' shares are not waited for
        raise
    workers.close(runner.procs)
    summaries = runner.summaries
    if search is not None:
        summaries.sort(key=lambda x: (x.get("concurrency") or 0, x.get("rate") or 0))
    summary = _run_summary(o, model, wt, wl, summaries)
    findings: list[Finding] = []
    if search is not None and o.find_max == "warm":
        summary["warm_sessions"] = search
        findings += warm.findings(search)
    elif search is not None:
        summary["slo_search"] = search
        findings += slo_search_findings(search)
    findings += level_findings(summaries, o.workload, slo)
    if o.compare_url:
        ab, ab_findings = await ab_compare(o, model, api_key, ctx)
        summary["ab"] = ab
        findings += ab_findings
    summary = finite(summary)
    if out:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str, allow_nan=False))
    return BenchResult(summary, findings, runner.results, records_path)


def _unreachable(url: str, why: str) -> BenchResult:
    """No server at the URL: the run is skipped, saying how to start one."""
    f = Finding("bench.server", "skip", f"no server reachable at {url}", evidence=why,
                remedy=f"Start the server ({registry.notebook('service')}), or give its URL; "
                       "`make demo` runs a tiny CPU engine to try this notebook.")
    return BenchResult({"url": url, "levels": [], "skipped": why}, [f])


@dataclass
class _LevelRunner:
    """One run's levels, measured one at a time (the SLO search asks for them one by one)."""
    o: BenchSettings
    slo: Any
    ctx: BuildContext
    model: Any
    api_key: str | None
    wt: Any
    wl: Any
    out: Path | None
    records_path: Path | None
    procs: workers.Pool | None = None       # --workers: spawned by run_async; replaced after a worker died
    summaries: list[dict[str, Any]] = field(default_factory=list)
    results: list[LevelResult] = field(default_factory=list)

    async def measure(self, lv: Level) -> dict[str, Any]:
        """Send the level's load, summarise it, keep its telemetry samples; its summary."""
        lr = await self._send(lv)
        lr.summary = level_summary(lr, self.slo, self.o.replicas)
        lr.summary.update(self.wt.level_summary(lr))
        if lv.schedule is not None:
            lr.summary["schedule_error_ms"] = metrics.stats((r.meta.get("schedule_error_ms") for r in lr.records), scale=1.0)
        self.summaries.append(lr.summary)
        self.results.append(lr)
        if self.out and lr.telemetry and lr.telemetry.get("samples"):
            with open(self.out / "telemetry.jsonl", "a", encoding="utf-8") as tf:
                for smp in lr.telemetry["samples"]:
                    tf.write(json.dumps(finite(smp), allow_nan=False) + "\n")
        return lr.summary

    async def _send(self, lv: Level) -> LevelResult:
        """The level's load, measured: the workload's own driver, worker processes, or this process."""
        o, tok = self.o, self.ctx.tokenizer
        tel = _telemetry(o)
        flush = bool(o.flush_cache) or o.find_max == "warm"     # warm: each level's sessions start from an empty cache
        n = o.requests or (DURATION_REQUESTS if o.duration else max(8, 4 * (lv.concurrency or int((lv.rate or 1) * 10))))
        if lv.schedule is not None:
            n = len(lv.schedule)
        load = self.wt.level(o, self.wl, lv, n, self.ctx)
        if o.replicas and not load.chat and len(load.requests) and isinstance(load.requests[0].prompt, list):
            raise InputError(TOKEN_IDS_THROUGH_GATEWAY.format(workload=o.workload))
        client = Client(o.server, self.model, load.chat, self.api_key, o.timeout, tok, transport=o.transport)
        if load.driver is not None:
            return await run_level(client, load.requests, lv, o.warmup, flush, self.records_path, o.seed, o.duration,
                                   telemetry=tel, driver=load.driver, replicas=o.replicas)
        bar = _bar(len(load.requests), lv.label) if o.interactive and not o.duration and not self.procs else None
        if self.procs is not None and lv.concurrency:
            lr = await workers.run_level_workers(self.procs, client, o.tokenizer if tok is not None else None, load.requests,
                                                 lv, o.workers, o.warmup, flush, self.records_path, telemetry=tel,
                                                 replicas=o.replicas)
            if lr.workers_lost:          # a dead worker broke the pool: the next level gets a fresh one
                self.procs.shutdown(cancel_futures=True)
                self.procs = workers.pool(o.workers)
        else:
            lr = await run_level(client, load.requests, lv, o.warmup, flush, self.records_path, o.seed, o.duration,
                                 bar.update if bar else None, telemetry=tel, replicas=o.replicas)
        if bar:
            bar.close()
        return lr


def _run_summary(o: BenchSettings, model: Any, wt: Any, wl: Any, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's summary: what was measured, its levels, the client, and the workload's own part."""
    summary: dict[str, Any] = {"url": o.server, "model": model, "workload": o.workload, "workload_description": wl.description,
                               "corpus_version": wl.corpus_version, "cache_flush": bool(o.flush_cache),
                               "exact_lengths": wl.exact_lengths, "input_len": o.input_len, "output_len": o.output_len,
                               "chat": bool(o.chat), "range_ratio": o.range_ratio, "seed": o.seed,
                               "requests_per_level": o.requests or (DURATION_REQUESTS if o.duration else None),
                               "duration_s": o.duration, "levels": summaries}
    if o.replicas:
        summary["replicas"] = dict(o.replicas)     # the servers behind the URL, each level's `replicas` rows read them
    summary["client"] = client_info(summaries, o.workers, o.transport)
    summary.update(wt.summary(o, wl))
    return summary


def client_info(summaries: list[dict[str, Any]], workers: int = 1, transport: str | None = None) -> dict[str, Any]:
    """The load generator itself: processes, event loop, HTTP transport, and the chunk rate at which it would fill
    its cores — chunks ingested per client CPU second over the run's levels, times workers (an
    estimate from this run's own work, so it reflects this workload's chunk and request sizes)."""
    loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    chunks = sum(int(s.get("chunks") or 0) for s in summaries)
    cpu = sum(float(s.get("client_cpu_s") or 0.0) for s in summaries)
    return {"workers": workers, "loop": loop, "transport": transport or stream_client.DEFAULT_TRANSPORT,
            "chunks_per_s_ceiling": round(chunks / cpu * workers) if chunks and cpu > 0 else None,
            "chunks": chunks, "cpu_s": round(cpu, 3)}


async def _levels(o: BenchSettings, slo: Any, own: list[Level] | None, runner: _LevelRunner) -> dict[str, Any] | None:
    """The run's levels: a search (SLO or warm sessions), the workload's own (a trace's one level), or the fixed
    levels; the search's result."""
    if o.find_max == "slo":
        if slo is None or not any(getattr(slo, k, None) for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")):
            raise InputError("{find_max} slo needs the spec's SLOs (slo.ttft_ms_p99, slo.tpot_ms_p99)")
        return await slo_search(runner.measure, o, slo)
    if o.find_max == "warm":
        return await _warm_search(o, runner)
    for lv in own if own is not None else levels_of(o):
        await runner.measure(lv)
    return None


async def _warm_search(o: BenchSettings, runner: _LevelRunner) -> dict[str, Any]:
    """The warm-session search against the pool the server itself reports (/server_info)."""
    from runbook.bench.sessions import SessionPlan  # lazy: numpy only when sessions run

    servers = dict(o.replicas) or {"the server": o.server}     # behind a gateway: each replica's own pool
    infos = {}
    for name, url in servers.items():
        try:
            infos[name] = await asyncio.to_thread(fetch_json, url.rstrip("/") + "/server_info", runner.api_key)
        except (OSError, ValueError) as e:
            raise InputError(f"--find-max warm reads the pool from {url}/server_info (SGLang): {e}") from None
    held = SessionPlan(1, o, runner.ctx.tokenizer, chat=runner.wl.context).held_context()

    async def measure(lv: Level) -> tuple[dict[str, Any], list[RequestRecord]]:
        s = await runner.measure(lv)
        return s, runner.results[-1].sound

    return await warm.search(measure, o, warm.pool(infos), warm.estimated_context(o, held))


def finite(x: Any) -> Any:
    """NaN and ±inf → None, recursively: `--json` must be strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def _telemetry(o: BenchSettings) -> Any:
    if not o.telemetry:
        return None
    return Telemetry(interval_s=o.telemetry_interval_s, nvml=o.nvml)


def run(o: BenchSettings, slo: Any = None, vocab_size: int | None = None) -> BenchResult:
    return run_sync(run_async(o, slo, vocab_size), fast_loop=True)


def _bar(total: int, label: str):
    from tqdm.auto import tqdm  # lazy: progress bars only when asked for

    return tqdm(total=total, desc=label, disable=not sys.stderr.isatty() and "ipykernel" not in sys.modules, leave=False)


def assess(spec: Deployment, settings: BenchSettings | None = None, archive_root: str | Path | None = None,
           exclude_run: str | None = None) -> BenchResult:
    """The sweep, then the regression check against the newest archived
    benchmark of this deployment under `archive_root` (outputs/ for the CLI, the runner's archive
    for the notebook; none: no comparison). The regression findings and the previous run it used are in the result."""
    res = run(settings or BenchSettings.resolve(spec), spec.slo)
    if res.summary.get("levels") and archive_root:
        prev = previous_data(Path(archive_root), spec.name, registry.get("benchmark").notebook, exclude_run,
                             usable=lambda d: bool(d.get("levels")))
        reg = compare_previous(res.summary, prev, spec.benchmark.regression_threshold_pct)
        res.summary["previous_run"] = {k: prev.get(k) for k in ("corpus_version", "workload", "model")} if prev else None
        res.findings += reg
    return res
