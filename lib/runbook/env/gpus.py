"""GPU checks through NVML (nvidia-ml-py). Without a driver every check is a `skip` finding."""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runbook.core.findings import Finding, Status
from runbook.core.spec import Deployment
from runbook.core.units import GIB

_TOPO = {0: "same board", 10: "single PCIe switch", 20: "multiple PCIe switches", 30: "host bridge (PHB)",
         40: "NUMA node (NODE)", 50: "across sockets (SYS)"}
_HOT_C = 85


@dataclass
class GpuReport:
    findings: list[Finding] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    topology: list[dict[str, Any]] = field(default_factory=list)
    driver: dict[str, Any] = field(default_factory=dict)


def _load_nvml():
    import pynvml  # lazy: the NVML binding may be absent or broken on a CPU host; check() reports that

    return pynvml


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def check(spec: Deployment, nvml: Any = None) -> GpuReport:
    """Query every GPU; compare with the spec's hardware section."""
    nvml = nvml or _load_nvml()
    rep = GpuReport()
    hw = spec.hardware
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        status: Status = "fail" if hw.require_gpus else "skip"
        rep.findings.append(Finding(
            "env.gpu.driver", status, f"no NVIDIA driver: {e}",
            detail="GPU checks skipped: NVML could not be initialised on this machine.",
            evidence=f"NVML error {getattr(e, 'value', '?')}: {e}",
            remedy="Run this on the serving host; there, install the NVIDIA driver (>= 580 for CUDA 13) and check `nvidia-smi`."))
        return rep
    try:
        _inspect(spec, nvml, rep)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return rep


def _inspect(spec: Deployment, nvml: Any, rep: GpuReport) -> None:
    hw = spec.hardware
    NotSupported = getattr(nvml, "NVMLError_NotSupported", ())

    def q(fn: Callable, *a: Any) -> Any:
        # A query the GPU does not support is "n/a", not an error (common on workstation boards).
        try:
            return fn(*a)
        except NotSupported:
            return None
        except nvml.NVMLError:
            return None

    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = q(nvml.nvmlSystemGetCudaDriverVersion_v2) or q(nvml.nvmlSystemGetCudaDriverVersion)
    cuda_s = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
    rep.driver = {"driver_version": driver, "cuda_driver_version": cuda_s}
    rep.findings.append(Finding("env.gpu.driver", "pass", f"NVIDIA driver {driver}, CUDA {cuda_s or '?'} supported",
                                evidence=f"nvmlSystemGetDriverVersion={driver}; cuda={cuda}"))

    n = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    need = spec.parallelism.gpus
    if n < hw.gpu_count:
        rep.findings.append(Finding("env.gpu.count", "fail", f"{n} GPUs visible, spec expects {hw.gpu_count}",
                                    detail=f"TP {spec.parallelism.tp} × PP {spec.parallelism.pp} needs {need}.",
                                    remedy="Check CUDA_VISIBLE_DEVICES, `nvidia-smi -L`, and that no GPU fell off the "
                                           "bus (dmesg | grep -i xid)."))
    else:
        rep.findings.append(Finding("env.gpu.count", "pass", f"{n} GPUs visible (spec: {hw.gpu_count})"))

    for i, h in enumerate(handles):
        name = _text(nvml.nvmlDeviceGetName(h))
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        cc = q(nvml.nvmlDeviceGetCudaComputeCapability, h)
        ecc = q(nvml.nvmlDeviceGetEccMode, h)
        pers = q(nvml.nvmlDeviceGetPersistenceMode, h)
        mig = q(nvml.nvmlDeviceGetMigMode, h)
        temp = q(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        sm = q(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        sm_max = q(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM)
        procs = q(nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        row = {
            "index": i, "name": name, "memory_total_gib": round(mem.total / GIB, 2),
            "memory_free_gib": round(mem.free / GIB, 2), "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "ecc": None if ecc is None else bool(ecc[0]), "persistence": None if pers is None else bool(pers),
            "mig": None if mig is None else bool(mig[0]), "temperature_c": temp, "sm_clock_mhz": sm,
            "sm_clock_max_mhz": sm_max, "processes": len(procs),
        }
        rep.gpus.append(row)
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            rep.processes.append({"gpu": i, "pid": p.pid, "used_gib": round(used / GIB, 2) if used else None})

    _per_gpu_findings(spec, rep)
    _topology(nvml, handles, rep, q)


def _per_gpu_findings(spec: Deployment, rep: GpuReport) -> None:
    hw = spec.hardware
    g = rep.gpus

    def idx(rows: list[dict]) -> str:
        return ", ".join(str(r["index"]) for r in rows)

    wrong = [r for r in g if hw.gpu_model.lower() not in r["name"].lower() and r["name"].lower() not in hw.gpu_model.lower()]
    if wrong:
        rep.findings.append(Finding("env.gpu.model", "warn", f"GPU model differs from the spec on GPU {idx(wrong)}",
                                    detail=f"found {wrong[0]['name']!r}, spec says {hw.gpu_model!r}",
                                    remedy="Fix hardware.gpu_model in the spec, or run on the intended host."))
    small = [r for r in g if r["memory_total_gib"] < hw.gpu_memory_gib * 0.95]
    if small:
        rep.findings.append(Finding("env.gpu.memory", "warn", f"GPU {idx(small)} has less memory than the spec's {hw.gpu_memory_gib} GiB",
                                    detail=f"GPU {small[0]['index']}: {small[0]['memory_total_gib']} GiB total",
                                    remedy="Fix hardware.gpu_memory_gib, or expect a smaller KV cache than the KV notebook computed."))
    if hw.compute_capability:
        cc_bad = [r for r in g if r["compute_capability"] and r["compute_capability"] != hw.compute_capability]
        if cc_bad:
            rep.findings.append(Finding("env.gpu.compute_capability", "warn",
                                        f"compute capability {cc_bad[0]['compute_capability']} on GPU {idx(cc_bad)}, spec "
                                        f"says {hw.compute_capability}",
                                        detail="SM100 kernels do not run on SM120 and vice versa; backends and NVFP4 kernels differ.",
                                        remedy="Check the attention and MoE backends chosen in serving.flags for this architecture."))
        elif g:
            rep.findings.append(Finding("env.gpu.compute_capability", "pass", f"compute capability {hw.compute_capability} "
                                        f"(sm_{hw.compute_capability.replace('.', '')}) on every GPU"))
    ecc_off = [r for r in g if r["ecc"] is False]
    if ecc_off:
        rep.findings.append(Finding("env.gpu.ecc", "warn", f"ECC off on GPU {idx(ecc_off)}",
                                    detail="Memory bit flips go undetected and can silently corrupt KV cache or weights.",
                                    remedy="`nvidia-smi -e 1` then reboot (ECC changes apply at the next boot)."))
    elif g:
        rep.findings.append(Finding("env.gpu.ecc", "pass" if any(r["ecc"] for r in g) else "info",
                                    "ECC on" if any(r["ecc"] for r in g) else "ECC not reported by this GPU"))
    pm_off = [r for r in g if r["persistence"] is False]
    if pm_off:
        rep.findings.append(Finding("env.gpu.persistence", "warn", f"persistence mode off on GPU {idx(pm_off)}",
                                    detail="The driver tears down GPU state between processes: slower start, lost clocks settings.",
                                    remedy="Enable the nvidia-persistenced service (or `nvidia-smi -pm 1`)."))
    mig_on = [r for r in g if r["mig"]]
    if mig_on:
        rep.findings.append(Finding("env.gpu.mig", "fail", f"MIG enabled on GPU {idx(mig_on)}",
                                    detail="Tensor parallelism needs whole GPUs.",
                                    remedy="`nvidia-smi -i N -mig 0` and reset the GPU."))
    hot = [r for r in g if r["temperature_c"] and r["temperature_c"] >= _HOT_C]
    if hot:
        rep.findings.append(Finding("env.gpu.temperature", "warn", f"GPU {idx(hot)} at {hot[0]['temperature_c']} °C",
                                    detail="Hot GPUs throttle clocks; benchmarks will under-read.",
                                    remedy="Check airflow and `nvidia-smi -q -d PERFORMANCE` for thermal slowdown."))
    if rep.processes:
        held = sum(p["used_gib"] or 0 for p in rep.processes)
        pids = sorted({p["pid"] for p in rep.processes})
        rep.findings.append(Finding("env.gpu.processes", "warn", f"{len(pids)} process(es) already hold {held:.1f} GiB of GPU memory",
                                    detail="A leftover server or notebook kernel eats the KV budget the next start measures.",
                                    evidence="; ".join(f"pid {p['pid']} on GPU {p['gpu']}: {p['used_gib']} GiB" for p in rep.processes[:8]),
                                    remedy="If these are not the deployment's own running server, stop them (`kill "
                                           f"{' '.join(map(str, pids[:4]))}`) before starting it."))
    elif g:
        rep.findings.append(Finding("env.gpu.processes", "pass", "no process holds GPU memory"))


def _topology(nvml: Any, handles: list, rep: GpuReport, q: Callable) -> None:
    read_idx = getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
    read_idx = read_idx[0] if isinstance(read_idx, tuple) else read_idx  # nvidia-ml-py defines it as a 1-tuple
    ok_status = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    no_p2p = []
    for a, b in itertools.combinations(range(len(handles)), 2):
        level = q(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
        p2p = q(nvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], read_idx)
        rep.topology.append({"gpu_a": a, "gpu_b": b, "link": _TOPO.get(level, level),
                             "p2p_read": None if p2p is None else p2p == ok_status})
        if p2p is not None and p2p != ok_status:
            no_p2p.append(f"{a}-{b}")
    if no_p2p:
        rep.findings.append(Finding("env.gpu.p2p", "warn", f"P2P reads not supported between {len(no_p2p)} GPU pair(s)",
                                    detail="NCCL falls back to shared memory through the host: all-reduce is slower.",
                                    evidence=", ".join(no_p2p[:12]),
                                    remedy="Check ACS/IOMMU in BIOS (`lspci -vvv | grep ACSCtl`); if NCCL hangs instead, "
                                           "NCCL_P2P_DISABLE=1 is the fallback."))
    elif rep.topology:
        rep.findings.append(Finding("env.gpu.p2p", "pass", f"P2P reads supported between all {len(rep.topology)} GPU pairs"))
