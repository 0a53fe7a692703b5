"""NVML where there is a GPU: energy over a benchmark window (nvmlDeviceGetTotalEnergyConsumption, mJ since
the driver loaded; Volta and newer) and the GPU memory check between launches (the last candidate's
memory given back before the next one starts)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runbook.core.units import GIB


def _nvml(injected: Any = None) -> tuple[Any, list[Any], str | None]:
    """(module, device handles, why not): the NVML binding stage 00 uses, or the one injected (tests)."""
    try:
        if injected is None:
            import pynvml  # lazy: nvidia-ml-py may be absent or broken on a CPU host; the except reports it

            injected = pynvml
        injected.nvmlInit()
        handles = [injected.nvmlDeviceGetHandleByIndex(i) for i in range(injected.nvmlDeviceGetCount())]
    except Exception as e:  # no driver, no library, no device: the same "no GPU here"
        return None, [], f"no NVML: {type(e).__name__}: {e}"[:200]
    return (injected, handles, None) if handles else (None, [], "NVML reports no GPU")


class EnergyMeter:
    """Joules all GPUs drew between start() and stop(); `skipped` says why not where there is no counter."""

    def __init__(self, nvml: Any = None):
        self.nv, self.handles, self.skipped = _nvml(nvml)
        self._start: list[int] | None = None

    def _read(self) -> list[int] | None:
        try:
            return [int(self.nv.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]
        except Exception as e:
            self.skipped = f"no energy counter: {type(e).__name__}: {e}"[:200]
            return None

    def start(self) -> None:
        self._start = self._read() if self.nv is not None else None

    def stop(self) -> float | None:
        if self.nv is None or self._start is None:
            return None
        end = self._read()
        return None if end is None else sum(b - a for a, b in zip(self._start, end, strict=True)) / 1000.0


def gpu_memory_used(nvml: Any = None) -> list[float] | None:
    """GiB in use per GPU, or None without NVML."""
    nv, handles, _ = _nvml(nvml)
    if nv is None:
        return None
    return [nv.nvmlDeviceGetMemoryInfo(h).used / GIB for h in handles]


def wait_memory_free(baseline: list[float] | None, timeout_s: float = 60.0, slack_gib: float = 1.0, nvml: Any = None,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    """True when every GPU is back within `slack_gib` of its use before the first launch (polls up to timeout_s)."""
    if baseline is None:
        return True, "no GPU here: nothing to check"
    deadline = time.monotonic() + timeout_s
    while True:
        now = gpu_memory_used(nvml) or []
        held = [(i, u - b) for i, (u, b) in enumerate(zip(now, baseline, strict=False)) if u - b > slack_gib]
        if not held:
            return True, "GPU memory back to its level before the first launch"
        if time.monotonic() >= deadline:
            return False, ", ".join(f"GPU {i} still holds {d:.1f} GiB more than before the first launch" for i, d in held)
        sleep(1.0)
