"""One replica stopped mid-run, accounted request by request: which requests failed, when, with what status, and what
the gateway did with the requests in flight at the stop and with the ones sent after it.

`run_with_stop` runs the benchmark's levels and calls `stop()` (e.g. kill a replica's process group) `after_s` seconds
after the run starts (give the level a --duration that outlasts it), in a thread so the client keeps streaming;
`account` sorts every request by when it was sent relative to the stop: `before` (ended before it), `in_flight` (sent
before, ended after), `after` (sent after).

What smg 1.13.0 did with a replica SIGKILLed under it (tests/topology/test_gateway_bench.py): a request already
streaming from it ends with HTTP 200 and an error object mid-stream ("Stream error: error decoding response body …
unexpected EOF during chunk size line"), our `server_error`; requests in flight on the survivor finish; new requests
all succeed (smg retries a request whose response has not started, on by default, and its health check and circuit
breaker take the replica out), the retry showing as a longer TTFT rather than as a failure."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runbook.bench import metrics
from runbook.bench.run import BenchResult, run_async
from runbook.bench.settings import BenchSettings
from runbook.endpoint.reach import run_sync
from runbook.endpoint.records import RequestRecord

PHASES = ("before", "in_flight", "after")


def phase(r: RequestRecord, stopped_at: float) -> str:
    if r.send_time >= stopped_at:
        return "after"
    return "before" if r.end_time is not None and r.end_time < stopped_at else "in_flight"


def account(records: Sequence[RequestRecord], stopped_at: float, implausible: Iterable[RequestRecord] = ()) -> dict[str, Any]:
    """Every request as a row (times in seconds from the stop, negative before it), the failed ones listed apart, and
    per phase: requests, failures by kind, TTFT and end-to-end latency (completed requests but those in `implausible`:
    what no server could have produced, as their levels name it)."""
    bad = {id(r) for r in implausible}      # by identity: request ids repeat from one level to the next
    rows = []
    for r in sorted(records, key=lambda r: r.send_time):
        rows.append({"id": r.id, "session": r.meta.get("session"), "turn": r.meta.get("turn"), "phase": phase(r, stopped_at),
                     "sent_s": r.send_time - stopped_at,
                     "ended_s": None if r.end_time is None else r.end_time - stopped_at,
                     "ok": r.ok, "status": r.status, "error_kind": r.error_kind,
                     "error": (r.error or "")[:200] or None, "chunks": len(r.chunk_times),
                     "ttft_ms": _ms(metrics.ttft_s(r)) if r.ok else None, "e2e_ms": _ms(metrics.e2e_s(r)) if r.ok else None})
    phases = {}
    for ph in PHASES:
        rs = [r for r in records if phase(r, stopped_at) == ph]
        ok = [r for r in rs if r.ok]
        sound = [r for r in ok if id(r) not in bad]
        kinds: dict[str, int] = {}
        for r in rs:
            if r.error_kind:
                kinds[r.error_kind] = kinds.get(r.error_kind, 0) + 1
        phases[ph] = {"requests": len(rs), "failed": len(rs) - len(ok), "errors": kinds,
                      "ttft_ms": metrics.stats(metrics.ttft_s(r) for r in sound),
                      "e2e_ms": metrics.stats(metrics.e2e_s(r) for r in sound)}
    return {"phases": phases, "failed": [row for row in rows if not row["ok"]], "requests": rows}


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000


def run_with_stop(o: BenchSettings, stop: Callable[[], None], after_s: float, slo: Any = None) -> tuple[BenchResult, dict[str, Any]]:
    """The run's levels with `stop()` called `after_s` seconds after the run starts; the result, and `account` of every
    level's requests against the moment stop() was called (`stopped_at_s`: that moment, from the first request)."""
    stopped: list[float] = []

    async def main() -> BenchResult:
        async def stopper() -> None:
            await asyncio.sleep(after_s)
            stopped.append(time.perf_counter())
            await asyncio.to_thread(stop)      # the stop blocks (kill, wait); the client keeps streaming meanwhile

        task = asyncio.get_running_loop().create_task(stopper())
        try:
            return await run_async(o, slo)
        finally:
            if not stopped:
                task.cancel()
            else:
                await task

    res = run_sync(main(), fast_loop=True)
    records = [r for lv in res.levels for r in lv.records]
    if not stopped:
        return res, {"stopped": False, "phases": {}, "failed": [], "requests": []}
    kept = {id(r) for lv in res.levels for r in lv.sound}
    acc = account(records, stopped[0], [r for r in records if id(r) not in kept])
    first = min((r.send_time for r in records), default=stopped[0])
    return res, {"stopped": True, "stopped_at_s": stopped[0] - first, **acc}
