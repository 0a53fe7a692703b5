"""Several load-generator processes for one fixed-concurrency level (`bench --workers N`).

A real server writes every token on its own, so the client's cost is per read; one process on the h1
transport keeps up with 20k separately-written chunks/s at a third of a core on this project's 2-core
machine, and more streams or chunks want more cores. N worker processes (spawned once per run, kept across
levels) each take every N-th request and an equal share of the concurrency, start together at one instant,
and stamp with perf_counter — CLOCK_MONOTONIC, the same clock in every process — so their records merge
into one level as if one client had sent them. The parent keeps what is per level: flush, warm-up,
/metrics before and after, telemetry, the records file (written when the level ends). Fixed-concurrency
levels of a set number of requests only: rates, traces, agentic sessions and --duration stay in one
process (check_options refuses the combinations).

A worker that dies (killed for memory, a crash) breaks the whole process pool, so the shares still
running do not report either: their requests are recorded as `client_error` with the reason, the
level counts them in `workers_lost` and is client-bound, the run goes on, and the caller starts a
fresh pool for the next level.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook.bench import metrics
from runbook.bench import replicas as replica_share
from runbook.bench.sweep import (
    CPU_BOUND_SHARE,
    LAG_BOUND_MS,
    Level,
    LevelResult,
    flush_cache,
    run_level,
    scrape,
    scrape_all,
    server_deltas,
    warm_up,
)
from runbook.endpoint.client import Client, RequestRecord, RequestSpec
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor as Pool

START_MARGIN_S = 0.3      # the parent sets the common start this far ahead: every worker is waiting by then


def _ready() -> int:
    import runbook.bench.sweep  # noqa: F401  # lazy: the spawned worker imports the client before any level's clock starts
    return os.getpid()


def pool(workers: int) -> Pool:
    """`workers` spawned processes with the client imported (spawn: safe under Jupyter's threads).
    `workers` tasks submitted at once start that many processes; waiting for them keeps start-up
    out of the first level."""
    import multiprocessing as mp  # lazy: multiprocessing's process pool only when --workers asks for one

    ex = concurrent.futures.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    for f in [ex.submit(_ready) for _ in range(workers)]:
        f.result()
    return ex


def close(ex: Pool | None, at_once: bool = False) -> None:
    """Shut the pool down once its work is done; `at_once`: its workers are terminated first, so a run that was
    cancelled does not wait for the shares still being sent. (ProcessPoolExecutor has terminate_workers() only
    from Python 3.14; before that its process table is the only handle on the workers.)"""
    if ex is None:
        return
    if at_once:
        for proc in list((getattr(ex, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError, ValueError):
                proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)


def _one(args: dict[str, Any]) -> dict[str, Any]:
    """In a worker: its share of the level, closed loop, from `start_at`; its records and loop health."""
    c = args["client"]
    client = Client(c["base_url"], c["model"], c["chat"], c["api_key"], c["timeout_s"], load_tokenizer(c["tokenizer"]),
                    extra_body=c["extra_body"], transport=c["transport"])
    lr = run_sync(run_level(client, args["reqs"], Level(args["label"], args["concurrency"]), warmup=0, flush=False,
                            start_at=args["start_at"], scrape_metrics=False), fast_loop=True)
    pid = os.getpid()
    for r in lr.records:
        r.meta["worker"] = pid
    return {"records": lr.records, "lag": lr.lag_samples, "cpu_s": lr.cpu_s, "cpu_share": lr.cpu_share}


def _lost(reqs: Sequence[RequestSpec], label: str, start_at: float, k: int, w: int, exc: BaseException) -> dict[str, Any]:
    """A share whose worker never reported: one failed record per request, from the common start to now."""
    why = f"load-generator worker {k + 1} of {w} died before reporting its share: {type(exc).__name__}: {exc}"[:300]
    now = time.perf_counter()
    recs = [RequestRecord(id=r.id, send_time=start_at, end_time=now, prompt_tokens_client=r.prompt_tokens,
                          max_tokens=r.max_tokens, level=label, error_kind="client_error", error=why) for r in reqs]
    return {"records": recs, "lag": [], "cpu_s": 0.0, "cpu_share": 0.0}


def shares(concurrency: int, workers: int) -> list[int]:
    """Concurrency per worker: as even as integers allow, no worker without a stream."""
    w = max(1, min(workers, concurrency))
    return [concurrency // w + (1 if k < concurrency % w else 0) for k in range(w)]


async def run_level_workers(ex: Pool, client: Client, tokenizer_path: str | None,
                            reqs: Sequence[RequestSpec], level: Level, workers: int, warmup: int = 2, flush: bool = True,
                            records_path: Path | None = None, telemetry: Any = None,
                            replicas: Mapping[str, str] | None = None) -> LevelResult:
    assert level.concurrency, "worker processes run fixed-concurrency levels"
    split = shares(level.concurrency, workers)
    w = len(split)
    async with client.session(limit=level.concurrency) as session:
        flushed = await flush_cache(session, client.base_url) if flush else None
        await warm_up(client, session, reqs, warmup, level.concurrency)
        before = await scrape(session, client.base_url)
        reps_before = await scrape_all(session, replicas) if replicas else {}
        cfg = {"base_url": client.base_url, "model": client.model, "chat": client.chat, "api_key": client.api_key,
               "timeout_s": client.timeout_s, "tokenizer": tokenizer_path, "extra_body": client.extra_body,
               "transport": client.transport}
        n = len(reqs)
        loop = asyncio.get_running_loop()
        if telemetry is not None:
            await telemetry.start(session, client.base_url, level.label)
        try:
            start_at = time.perf_counter() + START_MARGIN_S
            futs = [loop.run_in_executor(ex, _one, {"client": cfg, "reqs": [reqs[i] for i in range(k, n, w)],
                                                    "label": level.label, "concurrency": split[k], "start_at": start_at})
                    for k in range(w)]
            got = await asyncio.gather(*futs, return_exceptions=True)
        finally:
            if telemetry is not None:
                await telemetry.stop()
        after = await scrape(session, client.base_url)
        reps_after = await scrape_all(session, replicas) if replicas else {}
    crashed = sum(isinstance(p, BaseException) for p in got)
    parts = [p if not isinstance(p, BaseException) else _lost(reqs[k::w], level.label, start_at, k, w, p)
             for k, p in enumerate(got)]
    records: list[RequestRecord] = sorted((r for p in parts for r in p["records"]), key=lambda r: r.send_time)
    if records_path:
        with open(records_path, "a", encoding="utf-8") as out:
            for r in records:
                out.write(json.dumps(r.to_dict()) + "\n")
    lag = [x for p in parts for x in p["lag"]]
    lag_ms = metrics.stats(lag)
    share = max(p["cpu_share"] for p in parts)
    bound = (lag_ms["p99"] or 0) > LAG_BOUND_MS or share > CPU_BOUND_SHARE or crashed > 0
    lr = LevelResult(level, records, {}, lag_ms, share, bound, server_deltas(before, after), flushed,
                     cpu_s=sum(p["cpu_s"] for p in parts), lag_samples=lag, workers_lost=crashed)
    if telemetry is not None:
        lr.telemetry = telemetry.result()
    if replicas:
        lr.replicas = replica_share.deltas(reps_before, reps_after)
    return lr
