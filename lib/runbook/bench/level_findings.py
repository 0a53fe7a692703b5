"""What a run's level summaries say: failed requests, a client-bound level, token counts that disagree or rest
on an approximation, the server's own view (queue, retractions, aborts), telemetry, the peak and the SLOs."""
from __future__ import annotations

from typing import Any

from runbook.bench import metrics, server_side, workloads
from runbook.core.findings import Finding, Status
from runbook.endpoint.client import EXACT_SOURCES

_SOURCE_WHY = ("usage: the server's continuous usage, exact. usage_spread: the server's count arrived late (on the last "
               "chunk or after it) and was spread evenly over the chunks it covers. tokenizer: no usage; the local "
               "tokenizer's count of the text, spread over the chunks. requested: no usage, ignore_eos honoured; max_tokens "
               "spread over the chunks. chunks: no count at all; one token per chunk (TPOT too high, tok/s too low when "
               "chunks carry several tokens).")


def _count_remedy(sources: list[str]) -> str:
    """What a gap between the server's final usage and the client's own count means, by where the client's came from."""
    if set(sources) <= set(EXACT_SOURCES):
        # the client's count is the server's own per-chunk usage: the two counts are both the server's
        return ("The client's count is the server's own per-chunk usage (completion_tokens on each streamed chunk); "
                "its final usage chunk says otherwise, so the server's two counts disagree. Not a client setting: "
                "every reported figure uses the final usage.")
    return ("Without per-chunk usage the client counts the streamed text with --tokenizer where given (decoded text "
            "need not re-tokenize to the tokens generated), else the chunks; every reported figure uses the server's "
            "usage. For an exact per-chunk count enable continuous usage stats on the server.")


IMPLAUSIBLE_IDS_SHOWN = 12     # request ids listed per kind; the level's `implausible` lists them all


def implausible_finding(fid: str, tag: str, bad: list[dict[str, Any]]) -> Finding:
    """The records of one level that no server could have produced (metrics.judge): how many of each kind, their ids,
    and the figures of the first of each kind."""
    by: dict[str, list[dict[str, Any]]] = {}
    for b in bad:
        by.setdefault(b.get("kind") or "?", []).append(b)
    order = [k for k in metrics.KINDS if k in by] + sorted(set(by) - set(metrics.KINDS))
    parts = []
    for k in order:
        ids = ", ".join(str(b["id"]) for b in by[k][:IMPLAUSIBLE_IDS_SHOWN]) + (" …" if len(by[k]) > IMPLAUSIBLE_IDS_SHOWN else "")
        parts.append(f"{k} ({len(by[k])}: requests {ids}): request {by[k][0]['id']}: {by[k][0]['why']}")
    return Finding(fid, "warn", f"{tag}: {len(bad)} records no server could have produced, left out of every figure "
                                f"({', '.join(f'{k} {len(by[k])}' for k in order)})",
                   detail="; ".join(parts),
                   remedy="The client read bytes that were not this request's answer (a stale or shared connection, a "
                          "clock step): re-run the level; report it with the raw records (records.jsonl, by id).")


def level_findings(levels: list[dict[str, Any]], workload: str, slo: Any) -> list[Finding]:
    out: list[Finding] = list(workloads.resolve(workload).findings(levels))
    for s in levels:
        tag = s["label"]
        if s["failed"]:
            st: Status = "fail" if s["error_rate"] > 0.05 else "warn"
            out.append(Finding(f"bench.errors.{tag}", st, f"{tag}: {s['failed']} of {s['completed'] + s['failed']} requests failed",
                               evidence=", ".join(f"{k}: {v}" for k, v in s["errors"].items()),
                               remedy="Read the raw records (error_kind, error) and the server log."))
        if s.get("implausible"):
            out.append(implausible_finding(f"bench.implausible.{tag}", tag, s["implausible"]))
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
                                   remedy=_count_remedy(s["count_sources"])))
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
                           detail=slo_text(slo),
                           remedy="" if meeting else "Lower concurrency, or revisit the deployment's flags."))
    return out


def slo_text(slo: Any) -> str:
    """The SLOs the spec sets, in words ("ttft p99 ≤ 2000 ms, e2e p99 ≤ 30000 ms"); an unset one is not a bound."""
    bounds = ((m, getattr(slo, f"{m}_ms_p99", None)) for m in ("ttft", "tpot", "e2e"))
    return ", ".join(f"{m} p99 ≤ {v:g} ms" for m, v in bounds if v)


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

