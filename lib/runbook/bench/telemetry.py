"""Telemetry while a benchmark level runs: NVML per GPU and the server's /metrics, about once a second.

- NVML (nvidia-ml-py, loaded as 00_environment loads it): per GPU utilisation %, memory used (GiB),
  power (W), SM clock (MHz), temperature (°C). Without a driver: skipped, with the reason.
- /metrics (SGLang's Prometheus names; any prefix before the colon is accepted): running and queued
  requests, KV token usage (0–1), prefix-cache hit rate, speculative accept length, retracted requests.
  A server without /metrics (llama-server without --metrics): skipped, with the reason.

Samples go into the level's raw records (`telemetry.jsonl` next to records.jsonl) with the clock the
requests use, so they plot against the requests' times; the per-level summary is
`levels[].telemetry` (`gpu_util_pct.mean`, `gpu_mem_used_gib.max`, `kv_token_usage.max`,
`num_queue_reqs.max`, and more).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from runbook.bench.sweep import parse_prometheus
from runbook.core.units import GIB

# summary key -> the /metrics gauge names it reads (first present wins)
SERVER_GAUGES = {
    "num_running_reqs": ("num_running_reqs",),
    "num_queue_reqs": ("num_queue_reqs",),
    "kv_token_usage": ("token_usage", "kv_cache_usage_perc"),
    "cache_hit_rate": ("cache_hit_rate",),
    "spec_accept_length": ("spec_accept_length",),
    "num_retracted_reqs": ("num_retracted_reqs",),
}
GPU_FIELDS = ("gpu_util_pct", "gpu_mem_used_gib", "power_w", "sm_clock_mhz", "temperature_c")


def _bare(name: str) -> str:
    """`sglang:token_usage{tp_rank=0}` -> `token_usage`."""
    return name.split("{", 1)[0].rsplit(":", 1)[-1]


def pick_gauges(parsed: dict[str, float]) -> dict[str, float]:
    """Our gauges from one /metrics scrape; several label sets (ranks) of one gauge: their max."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    out: dict[str, float] = {}
    by_bare: dict[str, list[float]] = {}
    for k, v in parsed.items():
        by_bare.setdefault(_bare(k), []).append(v)
    for key, names in SERVER_GAUGES.items():
        for n in names:
            if n in by_bare:
                vals = [x for x in by_bare[n] if np.isfinite(x)]
                if vals:
                    out[key] = float(max(vals))
                break
    return out


class Telemetry:
    """start() / stop() around a level; result() gives the samples and their summary."""

    def __init__(self, interval_s: float = 1.0, nvml: Any = None, clock: Callable[[], float] = time.perf_counter,
                 gpus: bool = True, server: bool = True):
        self.interval_s = interval_s
        self._nvml_in = nvml
        self.clock = clock
        self.want_gpus, self.want_server = gpus, server
        self.samples: list[dict[str, Any]] = []
        self.skipped: dict[str, str] = {}
        self.label = ""
        self._task: asyncio.Task | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []

    # -- NVML ---------------------------------------------------------------------------------------
    def _init_nvml(self) -> None:
        if not self.want_gpus:
            self.skipped["gpu"] = "not asked"
            return
        try:
            if self._nvml_in is not None:
                nv = self._nvml_in
            else:
                import pynvml  # lazy: nvidia-ml-py (stage 00's binding) only where a driver may be there

                nv = pynvml
            nv.nvmlInit()
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            self._nvml = nv
            if not self._handles:
                self.skipped["gpu"] = "NVML reports no GPU"
        except Exception as e:  # no module, no driver, no permission: all a skip
            self._nvml = None
            self.skipped["gpu"] = f"no NVML: {type(e).__name__}: {e}"[:200]

    def _gpu_sample(self) -> list[dict[str, Any]]:
        nv = self._nvml
        rows = []
        for i, h in enumerate(self._handles):
            row: dict[str, Any] = {"gpu": i}
            for key, fn in (("gpu_util_pct", lambda h=h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
                            ("gpu_mem_used_gib", lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used / GIB),
                            ("power_w", lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                            ("sm_clock_mhz", lambda h=h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
                            ("temperature_c", lambda h=h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))):
                try:
                    row[key] = fn()
                except Exception:  # a field this GPU does not support
                    row[key] = None
            rows.append(row)
        return rows

    # -- the loop -----------------------------------------------------------------------------------
    async def start(self, session: Any, base_url: str, label: str = "") -> None:
        self.label = label
        self._session, self._base = session, base_url.rstrip("/")
        await asyncio.to_thread(self._init_nvml)
        if not self.want_server:
            self.skipped["server"] = "not asked"
        self._metrics_ok: bool | None = None if self.want_server else False
        await self._sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._sample()
            except asyncio.CancelledError:
                raise
            except Exception:  # telemetry never breaks a level
                pass

    async def _sample(self) -> None:
        t = self.clock()
        s: dict[str, Any] = {"t": t, "level": self.label}
        if self._nvml is not None and self._handles:
            s["gpus"] = await asyncio.to_thread(self._gpu_sample)
        if self._metrics_ok is not False:
            g = await self._scrape()
            if g is None:
                if self._metrics_ok is None:
                    self._metrics_ok = False
                    self.skipped["server"] = f"no /metrics at {self._base} (SGLang: --enable-metrics)"
            else:
                self._metrics_ok = True
                s["server"] = g
        self.samples.append(s)

    async def _scrape(self) -> dict[str, float] | None:
        import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
        try:
            async with self._session.get(self._base + "/metrics", timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval_s * 2))) as r:
                if r.status != 200:
                    return None
                return pick_gauges(parse_prometheus(await r.text()))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
            with contextlib.suppress(Exception):
                await self._sample()      # the level's end
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    # -- results ------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return summarise(self.samples, self.skipped)

    def result(self) -> dict[str, Any]:
        return {"samples": self.samples, "summary": self.summary()}


def _agg(xs: list[float]) -> dict[str, float | None]:
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    if not xs:
        return {"mean": None, "max": None}
    return {"mean": float(np.mean(xs)), "max": float(np.max(xs))}


def summarise(samples: list[dict[str, Any]], skipped: dict[str, str] | None = None) -> dict[str, Any]:
    """Per level: mean and max of each field (GPU fields over every GPU and sample), whether the
    server queued or retracted requests, and what was skipped and why."""
    out: dict[str, Any] = {"samples": len(samples), "skipped": dict(skipped or {})}
    for f in GPU_FIELDS:
        out[f] = _agg([g[f] for s in samples for g in s.get("gpus", []) if g.get(f) is not None])
    for f in SERVER_GAUGES:
        out[f] = _agg([s["server"][f] for s in samples if f in s.get("server", {})])
    q = out["num_queue_reqs"]["max"]
    out["queued"] = None if q is None else q > 0
    r = [s["server"]["num_retracted_reqs"] for s in samples if "num_retracted_reqs" in s.get("server", {})]
    out["retracted"] = None if not r else (max(r) > 0 or (len(r) > 1 and r[-1] > r[0]))
    return out
