"""Levels of load against a server: fixed concurrency or Poisson arrivals, each with warm-up, a
prefix-cache flush, /metrics scraped before and after, and the client's own health measured."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook.bench import metrics, server_side
from runbook.bench import replicas as replica_share
from runbook.bench.settings import BenchSettings
from runbook.endpoint.client import Client, RequestRecord, RequestSpec

if TYPE_CHECKING:
    import aiohttp

LAG_BOUND_MS = 25.0      # event-loop lag p99 above this: the client, not the server, sets the pace
CPU_BOUND_SHARE = 0.85   # one core: the event loop is single-threaded


@dataclass
class Level:
    label: str
    concurrency: int | None = None
    rate: float | None = None
    schedule: Sequence[float] | None = None   # trace replay: send offsets (s) from the level's start, open loop


@dataclass(repr=False)
class LevelResult:
    level: Level
    records: list[RequestRecord]
    summary: dict[str, Any]
    lag_ms: dict[str, Any]
    cpu_share: float
    client_bound: bool
    server: dict[str, Any] = field(default_factory=dict)
    flushed: bool | None = None
    telemetry: dict[str, Any] | None = None
    cpu_s: float = 0.0                  # the client's CPU seconds during the level
    lag_samples: list[float] = field(default_factory=list)
    workers_lost: int = 0               # --workers: worker shares that never reported (a process died)
    replicas: dict[str, Any] = field(default_factory=dict)   # through a gateway: each replica's counters (bench/replicas.py)

    def __repr__(self) -> str:      # short: see RequestRecord.__repr__
        return f"LevelResult({self.level.label!r}, {len(self.records)} records)"

    @property
    def sound(self) -> list[RequestRecord]:
        """The records the level's figures come from: all but those its summary names implausible."""
        return metrics.sound(self.records, self.summary.get("implausible") or [])


def levels_of(o: BenchSettings) -> list[Level]:
    """The run's fixed levels: each --concurrency, then each --rate."""
    return [Level(f"c{c}", concurrency=c) for c in o.concurrency] + [Level(f"r{r:g}", rate=r) for r in o.rates]


async def sleep_until(t: float) -> None:
    """Until perf_counter() reaches `t`, never before: uvloop's timers count whole milliseconds and can
    fire up to one early, so the last part is waited out in yields."""
    while (delay := t - time.perf_counter()) > 0:
        await asyncio.sleep(delay if delay > 0.001 else 0)


class LagMonitor:
    """Samples how late the event loop wakes from a 10 ms sleep, plus this process's CPU share."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        clock = time.perf_counter     # not loop.time(): uvloop's counts whole milliseconds
        while True:
            t0 = clock()
            await asyncio.sleep(self.interval)
            self.samples.append(max(0.0, clock() - t0 - self.interval))

    def __enter__(self) -> LagMonitor:
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._task:
            self._task.cancel()
        wall = time.perf_counter() - self._wall0
        self.cpu_s = time.process_time() - self._cpu0
        self.cpu_share = self.cpu_s / wall if wall > 0 else 0.0


def parse_prometheus(text: str) -> dict[str, float]:
    """name{labels} -> value for every sample (labels kept in the key, sorted)."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: prometheus_client only when /metrics is read

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = float(s.value)
    return out


async def scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float] | None:
    import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
    try:
        async with session.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None
            return parse_prometheus(await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def flush_cache(session: aiohttp.ClientSession, base: str) -> bool:
    """SGLang's POST /flush_cache; False where the server has none (llama-server)."""
    import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
    try:
        async with session.post(base + "/flush_cache", timeout=aiohttp.ClientTimeout(total=30)) as r:
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


def server_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """Counters as deltas (labelled series too; one first seen during the level counts from 0), gauges as
    their value after; spec-decoding acceptance picked out; the server's own latency histograms and request
    counters over the level (bench/server_side.py)."""
    if not before or not after:
        return {}
    out: dict[str, Any] = {"deltas": {}, "after": {}, "histograms": server_side.histogram_deltas(before, after),
                           "counters": server_side.counter_deltas(before, after)}
    for k, v in after.items():
        base = k.split("{")[0]
        if base.endswith(("_total", "_count", "_sum")):
            out["deltas"][k] = v - before.get(k, 0.0)   # a series first seen during the level started at 0
        elif not base.endswith(("_bucket", "_created")):
            out["after"][k] = v
    acc = {k: v for k, v in out["after"].items() if "accept" in k}
    acc.update({k: v for k, v in out["deltas"].items() if "accept" in k or "spec_verify" in k})
    out["spec_accept"] = acc
    interesting = ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate", "requests_processing", "kv_cache_usage")
    out["gauges"] = {k: v for k, v in out["after"].items() if any(x in k for x in interesting)}
    return out


def cache_hit_from_metrics(server: dict[str, Any]) -> float | None:
    """The level's prefix-cache hit rate from SGLang's counters: Δ sglang:cached_tokens_total (every
    cache_source) ÷ Δ sglang:prompt_tokens_total (observability/metrics_collector.py); None without them."""
    d = server.get("deltas") or {}
    cached = [v for k, v in d.items() if k.split("{")[0] == "sglang:cached_tokens_total"]
    prompt = sum(v for k, v in d.items() if k.split("{")[0] == "sglang:prompt_tokens_total")
    if prompt <= 0:
        return None
    return sum(cached) / prompt


async def warm_up(client: Client, session: aiohttp.ClientSession, reqs: Sequence[RequestSpec], n: int, conc: int) -> None:
    """`n` short requests (16 tokens) from `reqs`, `conc` at a time, measured nowhere: the server's first-use costs."""
    if n <= 0 or not len(reqs):
        return
    sem = asyncio.Semaphore(max(1, conc))

    async def one(r: RequestSpec) -> None:
        async with sem:
            await client.send(session, RequestSpec(-1, r.prompt, min(16, r.max_tokens), r.prompt_tokens, r.ignore_eos, r.meta), "warmup")

    await asyncio.gather(*(one(reqs[i % len(reqs)]) for i in range(n)))


PREPARE_AHEAD = 4096   # bodies encoded before the level starts (the rest, for long --duration levels, as they go)


async def run_level(client: Client, reqs: Sequence[RequestSpec], level: Level, warmup: int = 2, flush: bool = True,
                    records_path: Path | None = None, seed: int = 0, duration_s: float | None = None,
                    progress: Callable[[int], None] | None = None, telemetry: Any = None,
                    driver: Callable[..., Awaitable[None]] | None = None, start_at: float | None = None,
                    scrape_metrics: bool = True, replicas: Mapping[str, str] | None = None) -> LevelResult:
    """One level. Fixed concurrency: that many workers, each sending its next request when the last
    finished. A rate: Poisson arrivals, open loop — no cap on requests in flight, so a slow server
    shows as growing latency, never as client-side waiting counted into TTFT (any pool wait is
    `queue_s`, reported apart). `--duration`: no request is started after the deadline; those in
    flight then finish and are measured. `telemetry`: a bench.telemetry.Telemetry sampled during the level.
    A schedule (trace replay): each request is sent at its recorded offset, open loop; how late its
    headers went on the wire is `meta.schedule_error_ms`. `driver(send, deadline)`: the level's own load
    (agentic sessions, whose requests depend on earlier answers); `send(spec)` measures and records one
    request, and `reqs` serve only the warm-up. `start_at`: a perf_counter time to start the load at
    (worker processes start together; the clock is CLOCK_MONOTONIC, shared by processes);
    `scrape_metrics=False`: no /metrics before and after (a worker's parent scrapes). `replicas` (name -> URL): the
    servers behind a gateway at `client.base_url`, each one's /metrics scraped right after the endpoint's, before
    and after the level (bench/replicas.py)."""
    open_loop = (level.rate is not None and not level.concurrency) or level.schedule is not None
    conc = level.concurrency or 1
    async with client.session(limit=0 if open_loop else conc) as session:
        flushed, before = await _before_level(client, session, reqs, warmup, conc, flush, scrape_metrics)
        reps_before = await scrape_all(session, replicas) if replicas else {}
        records: list[RequestRecord] = []
        # not a `with`: closed in the finally below, before telemetry stops, and written by every request between
        out = open(records_path, "a", encoding="utf-8") if records_path else None  # noqa: SIM115
        ahead = _ahead(len(reqs), level, duration_s, driver, open_loop, conc)
        bodies = [client.encode(reqs[i]) for i in range(ahead)]       # before the clock starts
        send_one = _recorder(client, session, level, records, out, progress)

        async def do(i: int, due: float | None = None) -> None:
            await send_one(reqs[i], bodies[i] if i < ahead else None, due)

        if telemetry is not None:
            await telemetry.start(session, client.base_url, level.label)
        try:
            if start_at is not None:
                await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
            with LagMonitor() as lag:
                t0 = time.perf_counter()
                deadline = t0 + duration_s if duration_s else None
                if driver is not None:
                    await driver(send_one, deadline)
                elif level.schedule is not None:
                    await _send_schedule(level.schedule[:len(reqs)], t0, deadline, do)
                elif open_loop:
                    assert level.rate is not None
                    await _send_poisson(level.rate, len(reqs), seed, t0, deadline, do)
                else:
                    await _send_closed(len(reqs), conc, deadline, do)
        finally:
            if out:
                out.close()
            if telemetry is not None:
                await telemetry.stop()
        after = await scrape(session, client.base_url) if scrape_metrics else None
        reps_after = await scrape_all(session, replicas) if replicas else {}
    lr = _result(level, records, lag, before, after, flushed, telemetry)
    if replicas:
        lr.replicas = replica_share.deltas(reps_before, reps_after)
    return lr


async def scrape_all(session: aiohttp.ClientSession, servers: Mapping[str, str]) -> dict[str, dict[str, float] | None]:
    """Every server's /metrics at once (None for one that did not answer)."""
    got = await asyncio.gather(*(scrape(session, url.rstrip("/")) for url in servers.values()))
    return dict(zip(servers, got, strict=True))


async def _before_level(client: Client, session: aiohttp.ClientSession, reqs: Sequence[RequestSpec], warmup: int, conc: int,
                        flush: bool, scrape_metrics: bool) -> tuple[bool | None, dict[str, float] | None]:
    """Flush the prefix cache, warm up, then scrape /metrics: whether it flushed, and the counters before."""
    flushed = await flush_cache(session, client.base_url) if flush else None
    await warm_up(client, session, reqs, warmup, conc)
    before = await scrape(session, client.base_url) if scrape_metrics else None
    return flushed, before


def _ahead(n: int, level: Level, duration_s: float | None, driver: Any, open_loop: bool, conc: int) -> int:
    """How many request bodies to encode before the clock starts: every one, or for a --duration level what it
    will likely send (a long one is planned long; the rest are encoded as they go); none for a driver's level."""
    if driver is not None:
        return 0
    if duration_s is None:
        return n
    if level.schedule is not None:       # a trace knows exactly which requests start in time
        likely = sum(1 for off in level.schedule[:n] if off <= duration_s)
    else:
        likely = int((level.rate or 0) * duration_s * 1.5) + 16 if open_loop else conc * 64
    return min(n, PREPARE_AHEAD, likely)


def _recorder(client: Client, session: aiohttp.ClientSession, level: Level, records: list[RequestRecord], out: Any,
              progress: Callable[[int], None] | None) -> Callable[..., Awaitable[RequestRecord]]:
    """`send_one(spec, body, due)`: sends one request and records it (in `records`, and in `out` as it finishes)."""

    async def send_one(r: RequestSpec, body: bytes | None = None, due: float | None = None) -> RequestRecord:
        rec = await client.send(session, r, level.label, body)
        rec.meta.update({k: v for k, v in r.meta.items() if k in ("session", "turn", "scheduled_s")})
        if due is not None:
            rec.meta["schedule_error_ms"] = (rec.send_time - due) * 1000
        records.append(rec)
        if out:  # appended as it finishes: a crash later loses nothing already measured
            out.write(json.dumps(rec.to_dict()) + "\n")
            out.flush()
        if progress:
            progress(1)
        return rec

    return send_one


async def _send_schedule(schedule: Sequence[float], t0: float, deadline: float | None,
                         do: Callable[..., Coroutine[Any, Any, None]]) -> None:
    """A trace: each request at its offset from `t0`, open loop, none due after the deadline."""
    tasks: list[asyncio.Task[None]] = []
    for i, off in enumerate(schedule):
        due = t0 + off
        if deadline is not None and due > deadline:
            break
        await sleep_until(due)
        tasks.append(asyncio.create_task(do(i, due)))
    await asyncio.gather(*tasks)


async def _send_poisson(rate: float, n: int, seed: int, t0: float, deadline: float | None,
                        do: Callable[..., Coroutine[Any, Any, None]]) -> None:
    """Poisson arrivals at `rate` from `t0`, open loop, none after the deadline."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    rng = np.random.default_rng(seed)
    tasks: list[asyncio.Task[None]] = []
    at = 0.0
    for i in range(n):
        at += float(rng.exponential(1.0 / rate))
        if deadline is not None and t0 + at > deadline:
            break
        await sleep_until(t0 + at)
        tasks.append(asyncio.create_task(do(i)))
    await asyncio.gather(*tasks)


async def _send_closed(n: int, conc: int, deadline: float | None, do: Callable[..., Coroutine[Any, Any, None]]) -> None:
    """Fixed concurrency: `conc` workers, each sending the next request when its last finished, none started
    after the deadline."""
    nxt = iter(range(n))

    async def worker() -> None:
        for i in nxt:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            await do(i)

    await asyncio.gather(*(worker() for _ in range(conc)))


def _result(level: Level, records: list[RequestRecord], lag: LagMonitor, before: dict[str, float] | None,
            after: dict[str, float] | None, flushed: bool | None, telemetry: Any) -> LevelResult:
    """The level's result: the client's health (loop lag, CPU share, client-bound), the server's deltas, telemetry."""
    lag_ms = metrics.stats(lag.samples)
    bound = (lag_ms["p99"] or 0) > LAG_BOUND_MS or lag.cpu_share > CPU_BOUND_SHARE
    lr = LevelResult(level, records, {}, lag_ms, lag.cpu_share, bound, server_deltas(before, after), flushed, cpu_s=lag.cpu_s,
                     lag_samples=lag.samples)
    if telemetry is not None:
        lr.telemetry = telemetry.result()
    return lr
