"""`runbook bench`: build the workload, sweep the levels, summarise, compare; the same call for CLI and notebook."""
from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from runbook.bench import metrics, server_side, workers, workloads
from runbook.bench.sweep import Level, LevelResult, cache_hit_from_metrics, run_level
from runbook.core import registry
from runbook.core.errors import InputError
from runbook.core.findings import Finding, Status
from runbook.core.spec import Deployment
from runbook.endpoint import client as stream_client
from runbook.endpoint.client import EXACT_SOURCES, Client
from runbook.endpoint.reach import model_name, probe, run_sync
from runbook.model.tokenizer import load_tokenizer


@dataclass
class BenchOptions:
    url: str
    model: str | None = None
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    rates: list[float] = field(default_factory=list)
    requests: int | None = None          # per level; default 4 × concurrency (at least 8)
    duration_s: float | None = None
    workload: str = "code"
    input_len: int = 1024
    output_len: int = 256
    chat: bool = False
    tokenizer: str | None = None
    warmup: int = 2
    out: Path | None = None
    seed: int = 0
    compare_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 600.0
    range_ratio: float = 0.0
    flush: bool = False      # POST /flush_cache before each level (spec: benchmark.flush_cache)
    progress: bool = False
    telemetry: bool = True   # NVML + /metrics about once a second during each level (bench.telemetry)
    telemetry_interval_s: float = 1.0
    nvml: Any = None         # injected NVML module (tests); None: pynvml when a driver is there
    turns: int = 4           # agentic: turns per session
    think_time_s: float = 0.0    # agentic: pause between a session's turns (fixed, or the mean of an exponential)
    think_dist: str = "fixed"    # fixed | exp
    tool_result_len: int = 256   # agentic: synthetic tool-result tokens per turn after the first
    trace_speed: float = 1.0     # trace:FILE: time scale (2 = twice as fast)
    find_max: str | None = None   # "slo": search the highest load meeting the spec's SLOs instead of the fixed levels
    find_max_levels: int = 10        # at most this many levels for the search
    workers: int = 1                 # load-generator processes (bench/workers.py): fixed-concurrency levels only
    transport: str | None = None  # streamed requests' HTTP client: h1 (endpoint/h1.py) | aiohttp; None: client's default


DURATION_REQUESTS = 100000   # the request budget of a level bounded by time (built lazily: only those sent)


def check_options(o: BenchOptions) -> None:
    """Combinations that cannot be measured as asked: InputError with the fix. The workload checks its own
    options; what the sweep may do with it (search, worker processes, A/B) it declares."""
    if o.transport is not None and o.transport not in stream_client.TRANSPORTS:
        raise InputError(f"--transport {o.transport}: one of {', '.join(stream_client.TRANSPORTS)}")
    wt = workloads.resolve(o.workload)
    wt.check(o)
    if o.find_max is not None:
        if o.find_max != "slo":
            raise InputError(f"--find-max: only 'slo' is known (got {o.find_max!r})")
        if wt.own_load:
            raise InputError(f"--find-max slo varies the load; {wt.own_load}, so it cannot be searched")
        if o.rates and o.concurrency:
            raise InputError("--find-max slo searches concurrency or rate, not both: give --concurrency START or --rate START")
        if o.find_max_levels < 2:
            raise InputError("--find-max slo needs at least 2 levels")
    if o.workers != 1:
        if not 1 <= o.workers <= 64:
            raise InputError(f"--workers must be between 1 and 64 (got {o.workers})")
        if wt.one_process or o.rates or o.duration_s or o.compare_url:
            alone = "".join(f"{w.one_process}, " for w in workloads.ordered() if w.one_process)
            raise InputError(f"--workers N splits fixed-concurrency levels of --requests over N processes; {alone}"
                             "--rate, --duration and --compare-url run in one process: drop --workers")
    if o.compare_url and not wt.paired:
        unpaired = " or ".join(w.name for w in workloads.ordered() if not w.paired)
        raise InputError(f"--compare-url runs the A/B comparison on single requests; it does not take the {unpaired} workloads")


@dataclass
class BenchResult:
    summary: dict[str, Any]
    findings: list[Finding]
    levels: list[LevelResult] = field(default_factory=list)
    records_path: Path | None = None

    def data(self) -> dict[str, Any]:
        """The results-JSON payload: the summary (with `levels`, empty when nothing ran)."""
        return dict(self.summary, levels=self.summary.get("levels", []))


def level_summary(lr: LevelResult, slo: Any = None) -> dict[str, Any]:
    s = metrics.summarise(lr.records, slo)
    s.update({"label": lr.level.label, "concurrency": lr.level.concurrency, "rate": lr.level.rate,
              "client_bound": lr.client_bound, "lag_ms": lr.lag_ms, "cpu_share": lr.cpu_share,
              "client_cpu_s": lr.cpu_s, "chunks": sum(len(r.chunk_times) for r in lr.records),
              "cache_flushed": lr.flushed, "server": lr.server.get("gauges", {}), "spec_accept": lr.server.get("spec_accept", {})})
    if lr.telemetry is not None:
        s["telemetry"] = lr.telemetry.get("summary", {})
    if lr.workers_lost:
        s["workers_lost"] = lr.workers_lost
    s["cache_hit_rate"], s["cache_hit_source"] = cache_hit(lr)
    s["server_side"] = server_side.level(lr.server)
    return s


def cache_hit(lr: LevelResult) -> tuple[float | None, str | None]:
    """The level's prefix-cache hit rate: from the server's usage (cached_tokens ÷ prompt_tokens over
    completed requests) where it reports cached tokens, else from SGLang's /metrics counters."""
    pairs = [(r.cached_tokens, r.input_tokens) for r in lr.records if r.ok and r.cached_tokens is not None and r.input_tokens]
    if pairs:
        return sum(c for c, _ in pairs) / sum(n for _, n in pairs), "usage"
    m = cache_hit_from_metrics(lr.server)
    return (m, "metrics") if m is not None else (None, None)


def levels_of(o: BenchOptions) -> list[Level]:
    lv = [Level(f"c{c}", concurrency=c) for c in o.concurrency]
    lv += [Level(f"r{r:g}", rate=r) for r in o.rates]
    return lv


async def run_async(o: BenchOptions, slo: Any = None, vocab_size: int | None = None) -> BenchResult:
    check_options(o)
    tok = load_tokenizer(o.tokenizer)      # every input read before the server is probed: a bad one is an
    wt = workloads.resolve(o.workload)     # error whether or not a server answers
    wl = wt.start(o, tok, vocab_size)
    why = await probe(o.url)
    if why:
        return _unreachable(o.url, why)
    api_key = os.environ.get(o.api_key_env) if o.api_key_env else None
    model = o.model or await model_name(o.url, api_key)
    out = Path(o.out) if o.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl" if out else None
    runner = _LevelRunner(o, slo, vocab_size, model, api_key, tok, wt, wl, out, records_path)
    runner.procs = workers.pool(o.workers) if o.workers > 1 else None     # before any level's clock starts
    try:
        search = await _levels(o, slo, wt.levels(o, wl), runner.measure)
    except BaseException:
        workers.close(runner.procs, at_once=True)    # cancelled (a signal): the workers' shares are not waited for
        raise
    workers.close(runner.procs)
    summaries = runner.summaries
    if search is not None:
        summaries.sort(key=lambda x: (x.get("concurrency") or 0, x.get("rate") or 0))
    summary = _run_summary(o, model, wt, wl, summaries)
    findings: list[Finding] = []
    if search is not None:
        summary["slo_search"] = search
        findings += slo_search_findings(search)
    findings += level_findings(summaries, o.workload, slo)
    if o.compare_url:
        ab, ab_findings = await ab_compare(o, model, api_key, tok, vocab_size)
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
    o: BenchOptions
    slo: Any
    vocab_size: int | None
    model: Any
    api_key: str | None
    tok: Any
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
        lr.summary = level_summary(lr, self.slo)
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
        o, tok = self.o, self.tok
        tel = _telemetry(o)
        n = o.requests or max(8, 4 * (lv.concurrency or int((lv.rate or 1) * 10)))
        if lv.schedule is not None:
            n = len(lv.schedule)
        load = self.wt.level(o, self.wl, lv, n, tok, self.vocab_size)
        client = Client(o.url, self.model, load.chat, self.api_key, o.timeout_s, tok, transport=o.transport)
        if load.driver is not None:
            return await run_level(client, load.requests, lv, o.warmup, o.flush, self.records_path, o.seed, o.duration_s,
                                   telemetry=tel, driver=load.driver)
        bar = _bar(len(load.requests), lv.label) if o.progress and not o.duration_s and not self.procs else None
        if self.procs is not None and lv.concurrency:
            lr = await workers.run_level_workers(self.procs, client, o.tokenizer if tok is not None else None, load.requests,
                                                 lv, o.workers, o.warmup, o.flush, self.records_path, telemetry=tel)
            if lr.workers_lost:          # a dead worker broke the pool: the next level gets a fresh one
                self.procs.shutdown(cancel_futures=True)
                self.procs = workers.pool(o.workers)
        else:
            lr = await run_level(client, load.requests, lv, o.warmup, o.flush, self.records_path, o.seed, o.duration_s,
                                 bar.update if bar else None, telemetry=tel)
        if bar:
            bar.close()
        return lr


def _run_summary(o: BenchOptions, model: Any, wt: Any, wl: Any, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's summary: what was measured, its levels, the client, and the workload's own part."""
    summary: dict[str, Any] = {"url": o.url, "model": model, "workload": o.workload, "workload_description": wl.description,
                               "corpus_version": wl.corpus_version, "cache_flush": o.flush,
                               "exact_lengths": wl.exact_lengths, "input_len": o.input_len, "output_len": o.output_len,
                               "chat": o.chat, "range_ratio": o.range_ratio, "seed": o.seed, "requests_per_level": o.requests,
                               "duration_s": o.duration_s, "levels": summaries}
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


async def _levels(o: BenchOptions, slo: Any, own: list[Level] | None, measure: Any) -> dict[str, Any] | None:
    """The run's levels: the SLO search, the workload's own (a trace's one level), or the fixed levels; the search's result."""
    if o.find_max == "slo":
        if slo is None or not any(getattr(slo, k, None) for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")):
            raise InputError("--find-max slo needs the spec's SLOs (slo.ttft_ms_p99, slo.tpot_ms_p99)")
        return await slo_search(measure, o, slo)
    for lv in own if own is not None else levels_of(o):
        await measure(lv)
    return None


SLO_SEARCH_MAX_ERROR = 0.01       # a level failing more requests than this does not meet the SLOs
SLO_SEARCH_RATE_STEP = 0.10       # rate searches stop when the bracket is this narrow (relative)
SLO_SEARCH_MAX = {"concurrency": 4096.0, "rate": 100000.0}


def level_meets(s: dict[str, Any], slo: Any) -> bool:
    """The search's rule: the level's SLO check (bench.slo: each metric's p99 within its limit) and at
    most 1% of requests failed."""
    return metrics.level_meets_slo(s, slo) and float(s.get("error_rate") or 0.0) <= SLO_SEARCH_MAX_ERROR


async def slo_search(measure: Any, o: BenchOptions, slo: Any) -> dict[str, Any]:
    """The highest load meeting the SLOs: bracket by doubling from the start (the first --concurrency
    or --rate, else concurrency 1) until a level misses, then bisect between the last level that met
    them and the first that missed — to one request of concurrency, or 10% of rate — with at most
    `find_max_levels` levels in all. Assumes attainment falls as load rises."""
    metric = "rate" if o.rates else "concurrency"
    integer = metric == "concurrency"
    start = float(min(o.rates)) if o.rates else float(min(o.concurrency) if o.concurrency else 1)
    tried: list[dict[str, Any]] = []

    async def at(v: float) -> bool:
        lv = Level(f"c{int(v)}", concurrency=int(v)) if integer else Level(f"r{v:g}", rate=v)
        s = await measure(lv)
        ok = level_meets(s, slo)
        tried.append({metric: int(v) if integer else v, "label": lv.label, "meets_slo": ok,
                      "slo_attainment": s.get("slo_attainment"), "goodput_req_s": s.get("goodput_req_s"),
                      "error_rate": s.get("error_rate"), "ttft_ms_p99": s["ttft_ms"]["p99"], "tpot_ms_p99": s["tpot_ms"]["p99"]})
        return ok

    lo, hi = 0.0, None
    v = start
    while len(tried) < o.find_max_levels:
        if not await at(v):
            hi = v
            break
        lo = v
        if v >= SLO_SEARCH_MAX[metric]:
            break
        v = min(SLO_SEARCH_MAX[metric], v * 2)
    while hi is not None and len(tried) < o.find_max_levels:
        if integer:
            if hi - lo <= 1:
                break
            mid = float((int(lo) + int(hi)) // 2) if lo else float(int(hi) // 2)
            if mid < 1:
                break
        else:
            if lo and hi / lo <= 1 + SLO_SEARCH_RATE_STEP:
                break
            mid = (lo + hi) / 2 if lo else hi / 2
        if await at(mid):
            lo = mid
        else:
            hi = mid
    resolved = hi is not None and ((hi - lo <= 1) if integer else bool(lo) and hi / lo <= 1 + SLO_SEARCH_RATE_STEP)
    limit: float | None = (int(lo) if integer else lo) if lo else None
    return {"metric": metric, "limit": limit, "levels_tried": tried,
            "first_miss": (int(hi) if integer else hi) if hi is not None else None,
            "resolved": bool(resolved), "max_levels": o.find_max_levels,
            "slo": {k: getattr(slo, k, None) for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")},
            "rule": "each SLO metric's p99 within its limit and at most 1% of requests failed"}


def slo_search_findings(r: dict[str, Any]) -> list[Finding]:
    unit = "concurrent requests" if r["metric"] == "concurrency" else "requests/s"
    around = ", ".join(f"{t['label']} {'meets' if t['meets_slo'] else 'misses'}" for t in
                       sorted(r["levels_tried"], key=lambda t: t[r["metric"]]))
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in r["slo"].items() if v)
    if r["limit"] is None:
        return [Finding("bench.slo_search", "fail", f"no load meets the SLOs (first level tried missed: {around.split(',')[0]})",
                        detail=f"{slo}; {r['rule']}", remedy="Revisit the deployment's flags, or the SLOs.")]
    st: Status = "pass" if r["resolved"] else "warn"
    how = (f"first miss at {r['first_miss']:g}" if r["first_miss"] is not None else
           "no level tried missed (the search hit its bound)")
    return [Finding("bench.slo_search", st, f"max load under SLO: {r['limit']:g} {unit} ({how})",
                    detail=f"{slo}; levels tried: {around}" + ("" if r["resolved"] else
                                                             f"; not resolved within {r['max_levels']} levels"))]


def finite(x: Any) -> Any:
    """NaN and ±inf → None, recursively: `--json` must be strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def _telemetry(o: BenchOptions) -> Any:
    if not o.telemetry:
        return None
    from runbook.bench.telemetry import Telemetry

    return Telemetry(interval_s=o.telemetry_interval_s, nvml=o.nvml)


def run(o: BenchOptions, slo: Any = None, vocab_size: int | None = None) -> BenchResult:
    return run_sync(run_async(o, slo, vocab_size), fast_loop=True)


def _bar(total: int, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, disable=not sys.stderr.isatty() and "ipykernel" not in sys.modules, leave=False)


_SOURCE_WHY = ("usage: the server's continuous usage, exact. usage_spread: the server's count arrived late (on the last "
               "chunk or after it) and was spread evenly over the chunks it covers. tokenizer: no usage; the local "
               "tokenizer's count of the text, spread over the chunks. requested: no usage, ignore_eos honoured; max_tokens "
               "spread over the chunks. chunks: no count at all; one token per chunk (TPOT too high, tok/s too low when "
               "chunks carry several tokens).")


def level_findings(levels: list[dict[str, Any]], workload: str, slo: Any) -> list[Finding]:
    out: list[Finding] = list(workloads.resolve(workload).findings(levels))
    for s in levels:
        tag = s["label"]
        if s["failed"]:
            st: Status = "fail" if s["error_rate"] > 0.05 else "warn"
            out.append(Finding(f"bench.errors.{tag}", st, f"{tag}: {s['failed']} of {s['completed'] + s['failed']} requests failed",
                               evidence=", ".join(f"{k}: {v}" for k, v in s["errors"].items()),
                               remedy="Read the raw records (error_kind, error) and the server log."))
        if s.get("workers_lost"):
            out.append(Finding(f"bench.client_bound.{tag}", "fail",
                               f"{tag}: {s['workers_lost']} load-generator workers did not report: a worker process died",
                               detail="A dead worker breaks the whole process pool, so the shares still running are lost too; "
                                      "their requests are recorded as client_error and the level measured the client, not the server.",
                               remedy="Read the kernel log for the OOM killer (dmesg); run with fewer --workers or give the client "
                                      "more memory."))
        elif s["client_bound"]:
            p99 = (s.get("lag_ms") or {}).get("p99")
            out.append(Finding(f"bench.client_bound.{tag}", "warn", f"{tag}: the client, not the server, limited this level",
                               detail=f"event-loop lag p99 {'n/a' if p99 is None else f'{p99:.1f} ms'}, CPU share {s['cpu_share']:.0%}",
                               remedy="Do not publish this level's numbers; run the client on a less loaded machine or lower concurrency."))
        if s.get("server_counted", True) and s["output_tokens_client"] and s["output_tokens"]:
            gap = abs(s["output_token_discrepancy"]) / max(1, s["output_tokens"])
            if gap > 0.02:
                out.append(Finding(f"bench.token_count.{tag}", "warn", f"{tag}: server and client token counts differ by {gap:.1%}",
                                   detail=f"server usage {s['output_tokens']}, client {s['output_tokens_client']} "
                                          f"({'/'.join(s['count_sources'])}); reported figures use the server's",
                                   remedy=("Re-tokenizing each chunk's text over-counts tokens split across chunks; "
                                           "every reported figure uses the server's usage."
                                           if "tokenizer" in s["count_sources"] else
                                           "Give --tokenizer the model's tokenizer, or enable continuous usage stats on the server.")))
        approx = [c for c in s.get("count_sources", []) if c not in EXACT_SOURCES]
        if s["completed"] and approx:
            st2: Status = "warn" if set(approx) - {"usage_spread"} else "info"
            out.append(Finding(f"bench.token_source.{tag}", st2,
                               f"{tag}: per-token ITL and TPOT rest on an approximate token count ({', '.join(approx)})",
                               detail=_SOURCE_WHY, remedy=("The client asks for stream_options.continuous_usage_stats; this server "
                                                           "did not send a count per chunk. Give --tokenizer for a local count.")))
        q = (s.get("client_queue_ms") or {}).get("p99")
        if q is not None and q > 5.0:
            out.append(Finding(f"bench.client_queue.{tag}", "info", f"{tag}: requests waited up to {q:.1f} ms (p99) for a connection",
                               detail="The wait is measured apart (client_queue_ms) and is not part of TTFT."))
    out += server_findings(levels)
    tel = [s for s in levels if s.get("telemetry")]
    for s in tel:
        t = s["telemetry"]
        kv, q, rt = t["kv_token_usage"]["max"], t["num_queue_reqs"]["max"], t.get("retracted")
        if kv is not None or t["gpu_util_pct"]["mean"] is not None:
            parts = [f"KV token usage peak {kv:.0%}" if kv is not None else "",
                     f"GPU utilisation mean {t['gpu_util_pct']['mean']:.0f}%" if t["gpu_util_pct"]["mean"] is not None else "",
                     f"queued up to {q:.0f}" if q else "", "requests retracted" if rt else ""]
            out.append(Finding(f"bench.telemetry.{s['label']}", "warn" if rt else "info",
                               f"{s['label']}: " + ", ".join(p for p in parts if p),
                               detail=f"{t['samples']} samples about once a second during the level",
                               remedy=("Retractions: the KV pool is too small for this load; lower concurrency or raise the pool."
                                       if rt else "")))
    if tel and all(s["telemetry"].get("skipped", {}).keys() >= {"gpu", "server"} for s in tel):
        sk = tel[0]["telemetry"]["skipped"]
        out.append(Finding("bench.telemetry", "skip", "no telemetry during the levels: no NVML and no /metrics",
                           detail="; ".join(f"{k}: {v}" for k, v in sk.items())))
    ok = [s for s in levels if s["completed"]]
    if ok:
        best = max(ok, key=lambda s: s["output_tok_s"])
        out.append(Finding("bench.peak", "info", f"peak output {best['output_tok_s']:.1f} tok/s at {best['label']}",
                           detail=f"TPOT p50 {best['tpot_ms']['p50'] or 0:.1f} ms, TTFT p99 {best['ttft_ms']['p99'] or 0:.0f} ms"))
    if slo is not None and any(getattr(slo, k, None) for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")) and ok:
        meeting = [s for s in ok if metrics.level_meets_slo(s, slo)]
        out.append(Finding("bench.slo", "pass" if meeting else "fail",
                           f"SLOs met up to {meeting[-1]['label']}" if meeting else "no level meets the SLOs",
                           detail=f"ttft p99 ≤ {slo.ttft_ms_p99} ms, tpot p99 ≤ {slo.tpot_ms_p99} ms",
                           remedy="" if meeting else "Lower concurrency, or revisit the deployment's flags."))
    return out


QUEUE_WARN_MS = 1000.0     # a p99 wait in the server's queue beyond this: the level is past what the server admits at once
QUEUE_INFO_MS = 100.0      # beyond this the wait is worth a line even when the sampled queue gauge never caught a queue


def server_findings(levels: list[dict[str, Any]]) -> list[Finding]:
    """Per level, what the server itself measured (bench/server_side.py): its TTFT and TPOT beside ours, how long
    requests waited in its queue, and requests it retracted (KV pool full) or aborted."""
    out: list[Finding] = []
    for s in levels:
        srv, tag = s.get("server_side") or {}, s["label"]
        rows = {r["metric"]: r for r in server_side.beside(s)}
        if rows:
            out.append(Finding(f"bench.server_side.{tag}", "info", f"{tag}: " + "; ".join(
                f"{m} mean ours {r['ours_mean_ms']:.1f} ms, server {r['server_mean_ms']:.1f} ms"
                for m, r in rows.items() if m in ("TTFT", "TPOT")),
                detail="The server's figures are SGLang's own histograms (/metrics, --enable-metrics) over the level; "
                       "our TTFT adds the network, HTTP and the client to the server's."))
        q = srv.get("queue_ms")
        peak = ((s.get("telemetry") or {}).get("num_queue_reqs") or {}).get("max")
        if q and q.get("p99") is not None and (q["p99"] > QUEUE_INFO_MS or peak):
            st: Status = "warn" if q["p99"] > QUEUE_WARN_MS else "info"
            out.append(Finding(f"bench.queue.{tag}", st, f"{tag}: requests waited in the server's queue: p50 {q['p50']:.0f} ms, "
                               f"p99 {q['p99']:.0f} ms" + (f", up to {peak:.0f} waiting" if peak else ""),
                               detail="SGLang's queue_time_seconds (a retracted request queues again) and num_queue_reqs; "
                                      "the wait is part of TTFT on both sides.",
                               remedy="More concurrency than the pool or --max-running-requests admits at once: lower the "
                                      "load, or give the server a larger KV pool." if st == "warn" else ""))
        rt, ab = srv.get("retracted_requests"), srv.get("aborted_requests")
        if rt:
            out.append(Finding(f"bench.retracted.{tag}", "warn", f"{tag}: the server retracted {rt} running requests (KV pool full)",
                               detail="A retracted request is put back in the queue and its prefill recomputed: its TTFT "
                                      "and E2E include the lost work (SGLang's num_retracted_requests_total).",
                               remedy="A larger KV pool (memory fraction, --max-total-tokens), fewer requests at once "
                                      "(--max-running-requests), or shorter outputs; verify reads the same events from the log."))
        if ab:
            out.append(Finding(f"bench.aborted.{tag}", "warn", f"{tag}: the server aborted {ab} requests",
                               detail="SGLang's num_aborted_requests_total over the level (out of KV memory, a client "
                                      "that went away, or a request it refused)",
                               remedy="Read the failed records and the server log (`runbook verify` reads its memory lines)."))
    return out


AB_MIN_BLOCKS = 8


async def ab_compare(o: BenchOptions, model: str | None, api_key: str | None, tok: Any,
                     vocab_size: int | None) -> tuple[dict[str, Any], list[Finding]]:
    """The same prompts against A (--url) and B (--compare-url) at the first level, interleaved: the
    requests are cut into blocks of one level's width (the concurrency), and each block runs on both
    arms back to back in a random order (AB or BA). Blocks, not requests, are the independent units:
    requests that ran together share the server's state. `--duration` bounds the whole comparison."""
    import random
    import time as _time

    lv = levels_of(o)[0]
    width = lv.concurrency or max(1, int(round(lv.rate or 1)))
    n_req = o.requests if o.requests and not o.duration_s else max(8, 4 * width)
    n_blocks = max(AB_MIN_BLOCKS, -(-n_req // width))
    planned = n_blocks * width if not o.duration_s else max(n_blocks * width, 64 * width)
    wl = workloads.build(o.workload, planned, o.input_len, o.output_len, tok, vocab_size, o.chat, o.seed, o.range_ratio)
    clients = {"a": Client(o.url, model, o.chat, api_key, o.timeout_s, tok, transport=o.transport),
               "b": Client(cast(str, o.compare_url), model, o.chat, api_key, o.timeout_s, tok,
                          transport=o.transport)}
    order_rng = random.Random(o.seed)
    recs: dict[str, list] = {"a": [], "b": []}
    block_of: dict[int, int] = {}
    orders: list[str] = []
    deadline = _time.perf_counter() + o.duration_s if o.duration_s else None
    sessions = {k: c.session(limit=width) for k, c in clients.items()}
    try:
        from runbook.bench.sweep import _warmup

        for k, c in clients.items():
            await _warmup(c, sessions[k], wl.requests, o.warmup, width)
        for blk in range(len(wl.requests) // width):
            if deadline is not None and blk >= 2 and _time.perf_counter() >= deadline:
                break
            if deadline is None and blk >= n_blocks:
                break
            reqs = [wl.requests[i] for i in range(blk * width, (blk + 1) * width)]
            for r in reqs:
                block_of[r.id] = blk
            order = ["a", "b"] if order_rng.random() < 0.5 else ["b", "a"]
            orders.append("".join(order).upper())
            for arm in order:
                c, s = clients[arm], sessions[arm]
                recs[arm] += await asyncio.gather(*(c.send(s, r, f"ab-{arm}") for r in reqs))
    finally:
        for s in sessions.values():
            await s.close()
    res, findings = paired(recs["a"], recs["b"], o.url, o.compare_url or "", block_of)
    res.update({"level": lv.label, "block_size": width, "order": "".join(orders)})
    return res, findings


AB_EXACT_BLOCKS = 12          # up to 2^12 sign patterns enumerated; beyond, a seeded sample of them
AB_SIGN_FLIPS = 20_000
AB_MIN_INTERVAL_BLOCKS = 6    # 2^5 = 32 orders cannot make a 95% interval: 1 − 2/32 < 0.95


def _sign_flip_interval(xs: list[float], seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """Mean of the block differences with a 95% randomisation interval for their shift.

    Each block's order (AB or BA) is a fair coin, so under "B = A + δ" each block difference is
    symmetric about δ and only its sign is random. Inverting the sign-flip test gives Hartigan's (1969)
    interval: the means of the nonempty subsets of blocks cut the line into 2^K equally likely cells for
    δ, and [k-th smallest, k-th largest] covers δ with probability exactly 1 − 2k/2^K. k is the largest
    with that ≥ 95%, so a self-comparison covers 0 in at least 95% of runs by design, whatever the
    distribution — a t interval assumes normal block means and covers less with few blocks. Over
    AB_EXACT_BLOCKS blocks, subsets are sampled uniformly (Monte-Carlo randomisation test, still valid:
    the observed order counts as one of the draws; an empty draw ties at every δ and costs a cell)."""
    if not xs:
        return None, None, None
    a = np.asarray(xs, dtype=float)
    m = float(a.mean())
    n = a.size
    if n <= AB_EXACT_BLOCKS:
        masks = (np.arange(1, 2 ** n)[:, None] >> np.arange(n)) & 1
        sub, empty = np.sort(masks @ a / masks.sum(axis=1)), 0
    else:
        rng, parts, empty = np.random.default_rng(seed), [], 0
        rows = max(1, 2_000_000 // n)                  # a long c1 run has thousands of blocks: bound memory
        for start in range(0, AB_SIGN_FLIPS, rows):
            drawn = rng.integers(0, 2, size=(min(rows, AB_SIGN_FLIPS - start), n), dtype=np.uint8)
            size = drawn.sum(axis=1)
            parts.append((drawn[size > 0] @ a) / size[size > 0])
            empty += int((size == 0).sum())
        sub = np.sort(np.concatenate(parts))
    k = math.floor(0.025 * (len(sub) + empty + 1)) - empty
    if k < 1:
        return m, None, None
    return m, float(sub[k - 1]), float(sub[len(sub) - k])


def paired(a_recs: list, b_recs: list, a_url: str, b_url: str,
           block_of: dict[int, int] | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """Paired B − A differences. With `block_of` (request id → block) the interval is over block means
    (a sign-flip randomisation interval with blocks as the units); without, each request is its own
    block (sequential, c1)."""
    findings: list[Finding] = []
    for name, url, rs in (("A", a_url, a_recs), ("B", b_url, b_recs)):
        if rs and not any(r.ok for r in rs):
            findings.append(Finding(f"bench.ab.failed.{name.lower()}", "fail", f"A/B: arm {name} failed every request ({len(rs)})",
                                    detail=f"{url}: " + ", ".join(sorted({r.error_kind for r in rs if r.error_kind})),
                                    remedy="Check that endpoint is up and serves the same model; no comparison is possible."))
    a = {r.id: r for r in a_recs if r.ok}
    b = {r.id: r for r in b_recs if r.ok}
    ids = sorted(set(a) & set(b))
    mismatched = [i for i in ids if a[i].output_tokens != b[i].output_tokens]
    res: dict[str, Any] = {"a": a_url, "b": b_url, "pairs": len(ids), "output_length_mismatches": len(mismatched),
                           "failed": {"a": sum(not r.ok for r in a_recs), "b": sum(not r.ok for r in b_recs)}}
    if mismatched:
        findings.append(Finding("bench.ab.lengths", "warn", f"A/B: {len(mismatched)} of {len(ids)} pairs generated different lengths",
                                detail="A paired comparison needs equal output lengths (ignore_eos); those pairs are excluded.",
                                remedy="Check that both servers honour ignore_eos / min_tokens."))
    keep = [i for i in ids if i not in mismatched]
    blocks = block_of or {i: i for i in keep}
    for name, fn in (("tpot_ms", metrics.tpot_s), ("ttft_ms", metrics.ttft_s), ("e2e_ms", metrics.e2e_s)):
        per_block: dict[int, list[float]] = {}
        diffs = []
        for i in keep:
            fa, fb = fn(a[i]), fn(b[i])
            if fa is None or fb is None:
                continue
            d = (fb - fa) * 1000
            diffs.append(d)
            per_block.setdefault(blocks.get(i, i), []).append(d)
        means = [float(np.mean(v)) for _, v in sorted(per_block.items())]
        _, lo, hi = _sign_flip_interval(means)
        mean = float(np.mean(diffs)) if diffs else None
        res[name] = {"mean_diff_b_minus_a": mean, "ci95": [lo, hi], "n": len(diffs), "blocks": len(means)}
        if diffs and lo is not None and hi is not None:
            sig = lo > 0 or hi < 0
            findings.append(Finding(f"bench.ab.{name}", "info", f"A/B {name}: B − A = {mean:+.2f} ms (95% CI {lo:+.2f} … {hi:+.2f})",
                                    detail=("significant" if sig else "not distinguishable from zero at 95%")
                                    + f" ({len(means)} blocks of interleaved requests)"))
    few = max((res[k]["blocks"] for k in ("tpot_ms", "ttft_ms", "e2e_ms") if res[k]["n"]), default=0)
    if 0 < few < AB_MIN_INTERVAL_BLOCKS:
        findings.append(Finding("bench.ab.blocks", "warn", f"A/B: {few} blocks are too few for a 95% interval",
                                detail=f"{2 ** few} possible block orders cannot exclude 5%; the interval is null",
                                remedy=f"Run at least {AB_MIN_INTERVAL_BLOCKS} blocks: more --requests or a longer --duration."))
    return res, findings


ERROR_RATE_SLACK = 0.01          # error rate up by more than 1 point: a regression
LENGTH_TOLERANCE = 0.05          # mean output (or input) tokens per request differing by more: other work


def compare_previous(current: dict[str, Any], previous: dict[str, Any] | None, threshold_pct: float) -> list[Finding]:
    """Regressions against the previous archived run of the same deployment, like with like only: the
    same workload, corpus version, lengths, chat mode, session shape and trace speed for the run, and per level the same level with
    the same measured mean input and output lengths. Throughput, TPOT p50, TTFT p50/p99 and the error
    rate are compared; a level failing more requests than before is a regression even when its
    remaining requests are fast."""
    if not previous or not previous.get("levels"):
        return [Finding("bench.regression", "info", "no previous benchmark of this deployment to compare with")]
    # each workload declares its key (workloads/*.py); both runs' keys, so another workload's fields show too
    like = workloads.regression_key(previous.get("workload"), current.get("workload"))
    differ = [k for k in like if previous.get(k, _DEFAULTS.get(k)) != current.get(k, _DEFAULTS.get(k))]
    if differ:
        return [Finding("bench.regression", "skip", "previous run measured different work: not compared",
                        detail="; ".join(f"{k}: {previous.get(k)!r} then, {current.get(k)!r} now" for k in differ),
                        remedy="Compare runs with the same workload and corpus version; the next run compares with this one.")]
    prev = {(p.get("concurrency"), p.get("rate")): p for p in previous["levels"]}
    out: list[Finding] = []
    compared, skipped = 0, []
    for s in current.get("levels", []):
        p = prev.get((s.get("concurrency"), s.get("rate")))
        if not p:
            continue
        why = _unlike(p, s)
        if why:
            skipped.append(f"{s['label']}: {why}")
            continue
        compared += 1
        out += _level_regressions(p, s, threshold_pct)
    out += _slo_limit_regression(previous.get("slo_search") or {}, current.get("slo_search") or {}, threshold_pct)
    if skipped:
        out.append(Finding("bench.regression.unlike", "info", f"{len(skipped)} level(s) not compared: other work than the previous run",
                           detail="; ".join(skipped)))
    if not compared:
        return out or [Finding("bench.regression", "skip", "no level of the previous run matches this run's levels: not compared")]
    return out or [Finding("bench.regression", "pass", f"no regression beyond {threshold_pct:g}% against the previous run")]


def _level_regressions(p: dict[str, Any], s: dict[str, Any], threshold_pct: float) -> list[Finding]:
    """One level against the same level of the previous run: its error rate, then (when requests completed)
    output throughput, TPOT p50 and TTFT p50/p99."""
    out: list[Finding] = []
    tag = s["label"]
    pe, ce = float(p.get("error_rate") or 0.0), float(s.get("error_rate") or 0.0)
    if ce > pe + ERROR_RATE_SLACK:
        out.append(Finding(f"bench.regression.errors.{tag}", "fail" if ce > 0.05 else "warn",
                           f"{tag}: {ce:.0%} of requests failed, {pe:.0%} in the previous run",
                           detail=", ".join(f"{k}: {v}" for k, v in (s.get("errors") or {}).items()),
                           remedy="Read the failed records (error_kind, error) and the server log."))
    if not s.get("completed"):
        return out
    if p.get("output_tok_s") and s.get("output_tok_s") is not None:
        drop = (p["output_tok_s"] - s["output_tok_s"]) / p["output_tok_s"] * 100
        if drop > threshold_pct:
            out.append(Finding(f"bench.regression.{tag}", "warn", f"{tag}: output throughput down {drop:.0f}% since the previous run",
                               detail=f"{p['output_tok_s']:.1f} → {s['output_tok_s']:.1f} tok/s",
                               remedy="Diff the service unit and environment between the runs."))
    for key, pct, name in (("tpot_ms", "p50", "TPOT p50"), ("ttft_ms", "p50", "TTFT p50"), ("ttft_ms", "p99", "TTFT p99")):
        pt, ct = (p.get(key) or {}).get(pct), (s.get(key) or {}).get(pct)
        if pt and ct and (ct - pt) / pt * 100 > threshold_pct:
            kind = key.split("_")[0] + ("" if pct == "p50" else "_" + pct)
            out.append(Finding(f"bench.regression.{kind}.{tag}", "warn", f"{tag}: {name} up {(ct - pt) / pt * 100:.0f}%",
                               detail=f"{pt:.1f} → {ct:.1f} ms"))
    return out


def _slo_limit_regression(ps: dict[str, Any], cs: dict[str, Any], threshold_pct: float) -> list[Finding]:
    """The SLO search's limit against the previous run's, when both searched the same metric under the same SLO."""
    if ps.get("metric") and ps.get("metric") == cs.get("metric") and ps.get("slo") == cs.get("slo"):
        pl, cl = ps.get("limit"), cs.get("limit")
        if pl and (cl is None or (pl - cl) / pl * 100 > threshold_pct):
            return [Finding("bench.regression.slo_limit", "warn",
                            f"max load under SLO down: {pl:g} then, {cl if cl is not None else 'none'} now ({cs['metric']})",
                            remedy="Diff the service unit and environment between the runs.")]
    return []


_DEFAULTS: dict[str, Any] = {"range_ratio": 0.0}


def _unlike(p: dict[str, Any], s: dict[str, Any]) -> str:
    """Why two levels measured different work (mean lengths per successful request), or ''."""
    for key, name in (("output_tokens", "output"), ("input_tokens", "input")):
        pn, cn = p.get(key), s.get(key)
        pc, cc = p.get("completed") or 0, s.get("completed") or 0
        if not (isinstance(pn, (int, float)) and isinstance(cn, (int, float)) and pc and cc):
            continue
        pm, cm = pn / pc, cn / cc
        if max(pm, cm) > 0 and abs(pm - cm) / max(pm, cm) > LENGTH_TOLERANCE:
            return f"mean {name} {pm:.0f} then, {cm:.0f} now tokens per request"
    return ""


def options_from(spec: Deployment, url: str | None = None, **overrides: Any) -> BenchOptions:
    """BenchOptions from the spec's benchmark plan; explicit values (not None/empty) win."""
    b = spec.benchmark
    o = BenchOptions(url=url or spec.serving.local_url, model=None, concurrency=list(b.concurrency),
                     workload=b.workload, input_len=b.input_len, output_len=b.output_len, requests=b.requests_per_level,
                     warmup=b.warmup, api_key_env=spec.serving.api_key_env, flush=b.flush_cache)
    for k, v in overrides.items():
        if v not in (None, "", []):
            setattr(o, k, v)
    if overrides.get("rates") and not overrides.get("concurrency"):
        o.concurrency = []          # --rate alone runs rate levels alone, not the spec's concurrency plan too
    if overrides.get("duration_s") and not overrides.get("requests"):
        o.requests = DURATION_REQUESTS   # a level bounded by --duration, not by the spec's request count
    if not o.tokenizer and not url:
        # Benchmarking the spec's own server: its model's tokenizer, when the checkpoint is here.
        from runbook.model.location import locate

        loc = locate(spec)
        if loc.path is not None and (loc.path / "tokenizer.json").is_file():
            o.tokenizer = str(loc.path)
    return o


def measure(spec: Deployment, options: BenchOptions | None = None, archive_root: str | Path | None = None,
            exclude_run: str | None = None) -> BenchResult:
    """The sweep, then the regression check against the newest archived
    benchmark of this deployment under `archive_root` (outputs/ for the CLI, the runner's archive
    for the notebook; none: no comparison). The regression findings and the previous run it used are in the result."""
    from runbook.core.archive import previous_data

    o = options or options_from(spec)
    res = run(o, spec.slo)
    if res.summary.get("levels") and archive_root:
        prev = previous_data(Path(archive_root), spec.name, registry.get("benchmark").notebook, exclude_run,
                             usable=lambda d: bool(d.get("levels")))
        reg = compare_previous(res.summary, prev, spec.benchmark.regression_threshold_pct)
        res.summary["previous_run"] = {k: prev.get(k) for k in ("corpus_version", "workload", "model")} if prev else None
        res.findings += reg
    return res
