"""`runbook bench`: build the workload, sweep the levels, summarise, compare; the same call for CLI and notebook."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

from runbook.bench import metrics, workloads
from runbook.bench.sweep import Level, LevelResult, run_level
from runbook.core.findings import Finding, Status
from runbook.core.spec import Deployment
from runbook.core.stats import bootstrap_ci
from runbook.endpoint.client import Client
from runbook.endpoint.reach import model_name, probe, run_sync
from runbook.model.tokenizer import load_tokenizer


@dataclass
class BenchOptions:
    url: str
    model: Optional[str] = None
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    rates: list[float] = field(default_factory=list)
    requests: Optional[int] = None          # per level; default 4 × concurrency (at least 8)
    duration_s: Optional[float] = None
    workload: str = "code"
    input_len: int = 1024
    output_len: int = 256
    chat: bool = False
    tokenizer: Optional[str] = None
    warmup: int = 2
    out: Optional[Path] = None
    seed: int = 0
    compare_url: Optional[str] = None
    api_key_env: Optional[str] = None
    timeout_s: float = 600.0
    range_ratio: float = 0.0
    flush: bool = False      # POST /flush_cache before each level (spec: benchmark.flush_cache)
    progress: bool = False


@dataclass
class BenchResult:
    summary: dict[str, Any]
    findings: list[Finding]
    levels: list[LevelResult] = field(default_factory=list)
    records_path: Optional[Path] = None


def level_summary(lr: LevelResult, slo: Any = None) -> dict[str, Any]:
    s = metrics.summarise(lr.records, slo)
    s.update({"label": lr.level.label, "concurrency": lr.level.concurrency, "rate": lr.level.rate,
              "client_bound": lr.client_bound, "lag_ms": lr.lag_ms, "cpu_share": lr.cpu_share,
              "cache_flushed": lr.flushed, "server": lr.server.get("gauges", {}), "spec_accept": lr.server.get("spec_accept", {})})
    return s


def levels_of(o: BenchOptions) -> list[Level]:
    lv = [Level(f"c{c}", concurrency=c) for c in o.concurrency]
    lv += [Level(f"r{r:g}", rate=r) for r in o.rates]
    return lv


async def run_async(o: BenchOptions, slo: Any = None, vocab_size: Optional[int] = None) -> BenchResult:
    why = await probe(o.url)
    if why:
        f = Finding("bench.server", "skip", f"no server reachable at {o.url}", evidence=why,
                    remedy="Start the server (30_service), or give its URL; `make demo` runs a tiny CPU engine to try this notebook.")
        return BenchResult({"url": o.url, "levels": [], "skipped": why}, [f])
    api_key = os.environ.get(o.api_key_env) if o.api_key_env else None
    model = o.model or await model_name(o.url, api_key)
    tok = load_tokenizer(o.tokenizer)
    out = Path(o.out) if o.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl" if out else None
    findings: list[Finding] = []
    summaries, results = [], []
    for lv in levels_of(o):
        n = o.requests or max(8, 4 * (lv.concurrency or int((lv.rate or 1) * 10)))
        wl = workloads.build(o.workload, n, o.input_len, o.output_len, tok, vocab_size, o.chat, o.seed, o.range_ratio)
        client = Client(o.url, model, o.chat, api_key, o.timeout_s, tok)
        bar = _bar(len(wl.requests), lv.label) if o.progress else None
        lr = await run_level(client, wl.requests, lv, o.warmup, o.flush, records_path, o.seed, o.duration_s,
                             bar.update if bar else None)
        if bar:
            bar.close()
        lr.summary = level_summary(lr, slo)
        summaries.append(lr.summary)
        results.append(lr)
    summary: dict[str, Any] = {"url": o.url, "model": model, "workload": o.workload, "workload_description": wl.description,
               "corpus_version": wl.corpus_version, "cache_flush": o.flush,
               "exact_lengths": wl.exact_lengths, "input_len": o.input_len, "output_len": o.output_len, "chat": o.chat,
               "levels": summaries}
    findings += level_findings(summaries, o.workload, slo)
    if o.compare_url:
        ab, ab_findings = await ab_compare(o, model, api_key, tok, vocab_size)
        summary["ab"] = ab
        findings += ab_findings
    if out:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return BenchResult(summary, findings, results, records_path)


def run(o: BenchOptions, slo: Any = None, vocab_size: Optional[int] = None) -> BenchResult:
    return run_sync(run_async(o, slo, vocab_size))


def _bar(total: int, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, disable=not sys.stderr.isatty() and "ipykernel" not in sys.modules, leave=False)


def level_findings(levels: list[dict[str, Any]], workload: str, slo: Any) -> list[Finding]:
    out: list[Finding] = []
    if workload == "random":
        out.append(Finding("bench.workload", "warn", "random-token prompts: speculative decoding cannot be judged on them",
                           detail="Draft models accept almost nothing on random tokens; the story dropped MTP on exactly this evidence.",
                           remedy="Use --workload code or prefix for spec-decoding decisions."))
    for s in levels:
        tag = s["label"]
        if s["failed"]:
            st: Status = "fail" if s["error_rate"] > 0.05 else "warn"
            out.append(Finding(f"bench.errors.{tag}", st, f"{tag}: {s['failed']} of {s['completed'] + s['failed']} requests failed",
                               evidence=", ".join(f"{k}: {v}" for k, v in s["errors"].items()),
                               remedy="Read the raw records (error_kind, error) and the server log."))
        if s["client_bound"]:
            out.append(Finding(f"bench.client_bound.{tag}", "warn", f"{tag}: the client, not the server, limited this level",
                               detail=f"event-loop lag p99 {s['lag_ms']['p99']:.1f} ms, CPU share {s['cpu_share']:.0%}",
                               remedy="Do not publish this level's numbers; run the client on a less loaded machine or lower concurrency."))
        if s["output_tokens_client"] and s["output_tokens"]:
            gap = abs(s["output_token_discrepancy"]) / max(1, s["output_tokens"])
            if gap > 0.02:
                out.append(Finding(f"bench.token_count.{tag}", "warn", f"{tag}: server and client token counts differ by {gap:.1%}",
                                   detail=f"server usage {s['output_tokens']}, client {s['output_tokens_client']} ({'/'.join(s['count_sources'])}); reported figures use the server's",
                                   remedy=("Re-tokenizing each chunk's text over-counts tokens split across chunks; every reported figure uses the server's usage."
                                           if "tokenizer" in s["count_sources"] else
                                           "Give --tokenizer the model's tokenizer, or enable continuous usage stats on the server.")))
    ok = [s for s in levels if s["completed"]]
    if ok:
        best = max(ok, key=lambda s: s["output_tok_s"])
        out.append(Finding("bench.peak", "info", f"peak output {best['output_tok_s']:.1f} tok/s at {best['label']}",
                           detail=f"TPOT p50 {best['tpot_ms']['p50'] or 0:.1f} ms, TTFT p99 {best['ttft_ms']['p99'] or 0:.0f} ms"))
    if slo is not None and any(getattr(slo, k, None) for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")) and ok:
        meeting = [s for s in ok if all(getattr(slo, f"{m}_ms_p99", None) is None or (s[f"{m}_ms"]["p99"] or 0) <= getattr(slo, f"{m}_ms_p99")
                                        for m in ("ttft", "tpot", "e2e"))]
        out.append(Finding("bench.slo", "pass" if meeting else "fail",
                           f"SLOs met up to {meeting[-1]['label']}" if meeting else "no level meets the SLOs",
                           detail=f"ttft p99 ≤ {slo.ttft_ms_p99} ms, tpot p99 ≤ {slo.tpot_ms_p99} ms",
                           remedy="" if meeting else "Lower concurrency, or revisit the deployment's flags."))
    return out


async def ab_compare(o: BenchOptions, model: Optional[str], api_key: Optional[str], tok: Any,
                     vocab_size: Optional[int]) -> tuple[dict[str, Any], list[Finding]]:
    """Same prompts against A (--url) and B (--compare-url) at the first level; paired differences."""
    lv = levels_of(o)[0]
    n = o.requests or max(8, 4 * (lv.concurrency or 1))
    wl = workloads.build(o.workload, n, o.input_len, o.output_len, tok, vocab_size, o.chat, o.seed, o.range_ratio)
    arms = {}
    for name, url in (("a", o.url), ("b", o.compare_url)):
        # ab_compare is only called with compare_url set
        arms[name] = await run_level(Client(cast(str, url), model, o.chat, api_key, o.timeout_s, tok), wl.requests, lv, o.warmup, o.flush)
    return paired(arms["a"].records, arms["b"].records, o.url, o.compare_url or "")


def paired(a_recs: list, b_recs: list, a_url: str, b_url: str) -> tuple[dict[str, Any], list[Finding]]:
    a = {r.id: r for r in a_recs if r.ok}
    b = {r.id: r for r in b_recs if r.ok}
    ids = sorted(set(a) & set(b))
    mismatched = [i for i in ids if a[i].output_tokens != b[i].output_tokens]
    res: dict[str, Any] = {"a": a_url, "b": b_url, "pairs": len(ids), "output_length_mismatches": len(mismatched)}
    findings: list[Finding] = []
    if mismatched:
        findings.append(Finding("bench.ab.lengths", "warn", f"A/B: {len(mismatched)} of {len(ids)} pairs generated different lengths",
                                detail="A paired comparison needs equal output lengths (ignore_eos); those pairs are excluded.",
                                remedy="Check that both servers honour ignore_eos / min_tokens."))
    keep = [i for i in ids if i not in mismatched]
    for name, fn in (("tpot_ms", metrics.tpot_s), ("ttft_ms", metrics.ttft_s), ("e2e_ms", metrics.e2e_s)):
        diffs = [(cast(float, fn(b[i])) - cast(float, fn(a[i]))) * 1000 for i in keep if fn(a[i]) is not None and fn(b[i]) is not None]
        mean, lo, hi = bootstrap_ci(diffs)
        res[name] = {"mean_diff_b_minus_a": mean, "ci95": [lo, hi], "n": len(diffs)}
        if diffs:
            sig = lo > 0 or hi < 0
            findings.append(Finding(f"bench.ab.{name}", "info", f"A/B {name}: B − A = {mean:+.2f} ms (95% CI {lo:+.2f} … {hi:+.2f})",
                                    detail="significant" if sig else "not distinguishable from zero at 95%"))
    return res, findings


def compare_previous(current: dict[str, Any], previous: Optional[dict[str, Any]], threshold_pct: float) -> list[Finding]:
    """Regressions against the previous archived run of the same deployment."""
    if not previous or not previous.get("levels"):
        return [Finding("bench.regression", "info", "no previous benchmark of this deployment to compare with")]
    key = ("workload", "corpus_version", "input_len", "output_len", "chat")
    differ = [k for k in key if previous.get(k) != current.get(k)]
    if differ:
        return [Finding("bench.regression", "skip", "previous run measured different work: not compared",
                        detail="; ".join(f"{k}: {previous.get(k)!r} then, {current.get(k)!r} now" for k in differ),
                        remedy="Compare runs with the same workload and corpus version; the next run compares with this one.")]
    prev = {(p["concurrency"], p["rate"]): p for p in previous["levels"]}
    out = []
    for s in current.get("levels", []):
        p = prev.get((s["concurrency"], s["rate"]))
        if not p or not p["output_tok_s"] or not s["completed"]:
            continue
        drop = (p["output_tok_s"] - s["output_tok_s"]) / p["output_tok_s"] * 100
        if drop > threshold_pct:
            out.append(Finding(f"bench.regression.{s['label']}", "warn", f"{s['label']}: output throughput down {drop:.0f}% since the previous run",
                               detail=f"{p['output_tok_s']:.1f} → {s['output_tok_s']:.1f} tok/s", remedy="Diff the service unit and environment between the runs."))
        pt, ct = (p["tpot_ms"] or {}).get("p50"), (s["tpot_ms"] or {}).get("p50")
        if pt and ct and (ct - pt) / pt * 100 > threshold_pct:
            out.append(Finding(f"bench.regression.tpot.{s['label']}", "warn", f"{s['label']}: TPOT p50 up {(ct - pt) / pt * 100:.0f}%",
                               detail=f"{pt:.1f} → {ct:.1f} ms"))
    return out or [Finding("bench.regression", "pass", f"no regression beyond {threshold_pct:g}% against the previous run")]


def options_from(spec: Deployment, url: Optional[str] = None, **overrides: Any) -> BenchOptions:
    """BenchOptions from the spec's benchmark plan; explicit values (not None/empty) win."""
    b = spec.benchmark
    o = BenchOptions(url=url or spec.serving.local_url, model=None, concurrency=list(b.concurrency),
                     workload=b.workload, input_len=b.input_len, output_len=b.output_len, requests=b.requests_per_level,
                     warmup=b.warmup, api_key_env=spec.serving.api_key_env, flush=b.flush_cache)
    for k, v in overrides.items():
        if v not in (None, "", []):
            setattr(o, k, v)
    if not o.tokenizer and not url:
        # Benchmarking the spec's own server: its model's tokenizer, when the checkpoint is here.
        from runbook.model.location import locate

        loc = locate(spec)
        if loc.path is not None and (loc.path / "tokenizer.json").is_file():
            o.tokenizer = str(loc.path)
    return o


def evaluate(spec: Deployment, options: Optional[BenchOptions] = None, archive_root: Optional[str | Path] = None,
             exclude_run: Optional[str] = None) -> BenchResult:
    """Stage 40's entry point: the sweep, then the regression check against the newest archived
    benchmark of this deployment under `archive_root` (outputs/ for the CLI, the runner's archive
    for the notebook; none: no comparison). The regression findings and the previous run it used are in the result."""
    from runbook.core.archive import previous_data

    o = options or options_from(spec)
    res = run(o, spec.slo)
    if res.summary.get("levels") and archive_root:
        prev = previous_data(Path(archive_root), spec.name, "40_benchmark", exclude_run, usable=lambda d: bool(d.get("levels")))
        reg = compare_previous(res.summary, prev, spec.benchmark.regression_threshold_pct)
        res.summary["previous_run"] = {k: prev.get(k) for k in ("corpus_version", "workload", "model")} if prev else None
        res.findings += reg
    return res
