"""Environment checks: GPUs (gpus.py), the serving interpreter's packages, the host, NCCL/CUDA env."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.core.findings import Finding, Status
from runbook.core.spec import Deployment
from runbook.core.units import GIB
from runbook.env import gpus
from runbook.model.location import locate

# Packages the serving environment must have (fail) or should have (warn), by distribution name.
REQUIRED = ("sglang", "torch")
RECOMMENDED = ("flashinfer-python", "sglang-kernel", "transformers", "triton")
_ALIASES = {"sglang-kernel": ("sglang-kernel", "sgl-kernel")}

# Runs inside the serving interpreter: metadata only, so no CUDA init and no heavy import.
_PROBE = r"""
import json, sys
from importlib import metadata
names = json.loads(sys.argv[1])
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
for n in names:
    try:
        out["packages"][n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        out["packages"][n] = None
print(json.dumps(out))
"""


@dataclass
class EnvReport(gpus.GpuReport):
    """The GPU report plus the serving environment and the host."""

    serving: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "processes": self.processes, "topology": self.topology, "driver": self.driver,
                "serving": self.serving, "host": self.host}


def torch_cuda(version: str | None) -> str | None:
    """'2.14.1+cu130' -> '13.0'; '2.9.1+cu128' -> '12.8'; CPU or unknown builds -> None."""
    if not version or "+cu" not in version:
        return None
    digits = version.split("+cu", 1)[1]
    return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) >= 2 else None


def serving_env(spec: Deployment, run: Callable = subprocess.run, timeout: float = 60) -> tuple[list[Finding], dict[str, Any]]:
    """Ask the serving interpreter which packages it has."""
    py = spec.serving.python
    names = list(REQUIRED) + [a for n in RECOMMENDED for a in _ALIASES.get(n, (n,))]
    if not (os.path.isfile(py) and os.access(py, os.X_OK)):
        return [Finding("env.serving.python", "fail", f"serving interpreter not found: {py}",
                        detail="SGLang runs from this interpreter; without it nothing can be validated or served.",
                        remedy=f"Create the serving environment (e.g. `python3 -m venv {Path(py).parent.parent}` "
                               "and `pip install sglang`), "
                               "or point serving.python at it.")], {}
    try:
        cp = run([py, "-c", _PROBE, json.dumps(names)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [Finding("env.serving.python", "fail", f"serving interpreter did not answer within {timeout:.0f} s", evidence=py,
                        remedy="Run it by hand to see why it hangs.")], {}
    if cp.returncode != 0:
        tail = (cp.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return [Finding("env.serving.python", "fail", f"serving interpreter failed (exit {cp.returncode})", evidence=tail[0],
                        remedy=f"Run `{py} -c 'import sys'` to diagnose.")], {}
    info = json.loads(cp.stdout.strip().splitlines()[-1])
    pk = info["packages"]
    for alias_group in _ALIASES.values():
        found = next((pk[a] for a in alias_group if pk.get(a)), None)
        for a in alias_group:
            pk.pop(a, None)
        pk[alias_group[0]] = found
    out: list[Finding] = [Finding("env.serving.python", "pass", f"serving interpreter: Python {info['python']}",
                                  evidence=info["executable"])]
    for n in REQUIRED:
        if pk.get(n):
            out.append(Finding(f"env.serving.{n}", "pass", f"{n} {pk[n]}"))
        else:
            out.append(Finding(f"env.serving.{n}", "fail", f"{n} is not installed in the serving environment",
                               remedy=f"`{py} -m pip install {n}` (sglang pins its own torch)."))
    for n in RECOMMENDED:
        if pk.get(n):
            out.append(Finding(f"env.serving.{n}", "pass", f"{n} {pk[n]}"))
        else:
            out.append(Finding(f"env.serving.{n}", "warn", f"{n} is not installed in the serving environment",
                               detail="Some attention/MoE backends and NVFP4 kernels need it on the GPU host.",
                               remedy=f"`{py} -m pip install {n}` matching the sglang release."))
    tc = torch_cuda(pk.get("torch"))
    info["torch_cuda"] = tc
    if pk.get("torch") and tc is None:
        out.append(Finding("env.serving.torch_cuda", "warn", f"torch {pk['torch']} is not a CUDA build",
                           detail="Fine for validating flags; it cannot serve on GPUs.",
                           remedy="On the serving host install the CUDA build sglang pins (torch ...+cu130)."))
    return out, info


def check_driver_vs_torch(driver: dict[str, Any], serving: dict[str, Any]) -> list[Finding]:
    """The driver must support the CUDA version torch was built with (13.x needs driver >= 580)."""
    have, need = driver.get("cuda_driver_version"), serving.get("torch_cuda")
    if not have or not need:
        return []
    ok = tuple(map(int, have.split("."))) >= tuple(map(int, need.split(".")))
    if ok:
        return [Finding("env.serving.cuda_compat", "pass", f"driver supports CUDA {have}; torch built for {need}")]
    return [Finding("env.serving.cuda_compat", "fail", f"driver supports CUDA {have} but torch was built for CUDA {need}",
                    remedy="Upgrade the NVIDIA driver (CUDA 13.x needs >= 580) or install a torch build for the driver's CUDA.")]


def host(spec: Deployment) -> tuple[list[Finding], dict[str, Any]]:
    import psutil  # lazy: ~15 ms that `runbook --help` would pay; only host checks read it

    out: list[Finding] = []
    info: dict[str, Any] = {"cpus": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1)}
    out.append(Finding("env.host.cpu_ram", "info", f"{info['cpus']} CPUs, {info['ram_gib']} GiB RAM"))
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_blocks * st.f_frsize
        info["shm_gib"] = round(shm / GIB, 2)
        if shm < GIB:
            out.append(Finding("env.host.shm", "fail", f"/dev/shm is only {shm / 2**20:.0f} MiB",
                               detail="NCCL's SHM transport and torch multiprocessing need more; 64 MiB (a container "
                                      "default) crashes TP workers.",
                               remedy="Enlarge it (`mount -o remount,size=32G /dev/shm`, or --shm-size for containers)."))
        else:
            out.append(Finding("env.host.shm", "pass", f"/dev/shm is {shm / GIB:.1f} GiB"))
    except OSError as e:
        out.append(Finding("env.host.shm", "warn", "/dev/shm is missing", evidence=str(e), remedy="Mount a tmpfs at /dev/shm."))
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    fmt = lambda v: "unlimited" if v == resource.RLIM_INFINITY else f"{v / 2**20:.0f} MiB"  # noqa: E731
    info["memlock"] = fmt(soft)
    # Informational: the service gets its own limit from the unit (LimitMEMLOCK=infinity).
    out.append(Finding("env.host.memlock", "info",
                       f"RLIMIT_MEMLOCK here: {fmt(soft)} (hard {fmt(hard)})",
                       detail="Pinned memory and NCCL registration need it; systemd services do not read limits.conf.",
                       remedy="The rendered unit sets LimitMEMLOCK=infinity; for manual runs `ulimit -l unlimited`."))
    out.extend(_disk(spec, info))
    from runbook.env import ports  # lazy: it imports psutil, which only host checks need

    out.extend(ports.check(spec))
    return out, info


def _disk(spec: Deployment, info: dict[str, Any]) -> list[Finding]:
    loc = locate(spec)
    info["model_location"] = loc.note
    size: int | None = None
    if loc.has_weights:
        assert loc.path is not None  # has_weights implies a path
        size = sum(p.stat().st_size for p in loc.path.glob("*.safetensors"))
    probe = loc.path if loc.path is not None and loc.kind != "card" else _hf_home()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    info["disk_free_gib"] = round(free / GIB, 1)
    if size is not None:
        return [Finding("env.host.disk", "pass",
                        f"checkpoint on disk: {size / GIB:.1f} GiB at {loc.path}; {free / GIB:.0f} GiB free there")]
    return [Finding("env.host.disk", "info", f"{free / GIB:.0f} GiB free at {probe}",
                    detail=loc.note + ". The NVFP4 checkpoint of a ~400B model is ~230 GB; BF16 ~800 GB.")]


def _hf_home() -> Path:
    return Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


# (variable, predicate on value, status, title, remedy)
_RISKY: list[tuple[str, Callable[[str], bool], Status, str, str]] = [
    ("CUDA_LAUNCH_BLOCKING", lambda v: v == "1", "fail", "CUDA_LAUNCH_BLOCKING=1 serialises every kernel launch",
     "Remove it: it is a debugging switch that cuts throughput several-fold."),
    ("NCCL_P2P_DISABLE", lambda v: v == "1", "warn", "NCCL_P2P_DISABLE=1 routes all-reduce through host memory",
     "Keep it only as the workaround for P2P hangs (ACS/IOMMU); fix ACS in BIOS and remove it to regain bandwidth."),
    ("NCCL_SHM_DISABLE", lambda v: v == "1", "warn", "NCCL_SHM_DISABLE=1 removes NCCL's intra-node fallback transport",
     "Remove it unless a specific bug requires it."),
    ("NCCL_DEBUG", lambda v: v.upper() in ("INFO", "TRACE"), "warn", "NCCL_DEBUG at INFO/TRACE floods the journal",
     "Use WARN in production; INFO only while diagnosing."),
    ("CUDA_DEVICE_MAX_CONNECTIONS", lambda v: True, "info", "CUDA_DEVICE_MAX_CONNECTIONS is overwritten by SGLang (to 8)",
     "Drop it from the spec: the running server never sees this value."),
    ("NCCL_CUMEM_ENABLE", lambda v: True, "info", "NCCL_CUMEM_ENABLE: SGLang sets 0 itself unless symmetric memory is on",
     "Usually unnecessary; it was a workaround for an NCCL bug fixed in 2.22.3."),
    ("NCCL_P2P_LEVEL", lambda v: v.upper() not in ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS") and not v.isdigit(), "fail",
     "NCCL_P2P_LEVEL has a value NCCL does not know", "Use one of LOC, NVL, PIX, PXB, PHB, SYS."),
]


def nccl_cuda_env(spec: Deployment) -> list[Finding]:
    env = spec.serving.env
    out: list[Finding] = []
    for name, bad, status, title, remedy in _RISKY:
        if name in env and bad(env[name]):
            out.append(Finding(f"env.{name}", status, title, evidence=f"{name}={env[name]}", remedy=remedy))
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = len([x for x in vis.split(",") if x.strip()])
        if n < spec.parallelism.gpus:
            out.append(Finding("env.CUDA_VISIBLE_DEVICES", "fail",
                               f"CUDA_VISIBLE_DEVICES lists {n} GPUs, parallelism needs {spec.parallelism.gpus}",
                               evidence=f"CUDA_VISIBLE_DEVICES={vis}", remedy="List every GPU the server uses."))
    home = env.get("CUDA_HOME")
    if home and not Path(home).is_dir():
        out.append(Finding("env.CUDA_HOME", "warn", f"CUDA_HOME {home} does not exist on this machine",
                           detail="JIT-compiled kernels (flashinfer, triton) look for nvcc and headers there.",
                           remedy="Install the CUDA toolkit at that path on the serving host, or fix serving.env.CUDA_HOME."))
    named = sorted(k for k in env if k.startswith(("NCCL_", "CUDA_")))
    if not out:
        out.append(Finding("env.nccl_cuda", "pass", f"no risky NCCL_*/CUDA_* values ({len(named)} set)", evidence=", ".join(named)))
    return out


def assess(spec: Deployment, nvml: Any = None, run: Callable = subprocess.run) -> EnvReport:
    """Every environment check for a deployment, as one report."""
    g = gpus.check(spec, nvml)
    rep = EnvReport(list(g.findings), g.gpus, g.processes, g.topology, g.driver)
    f, rep.serving = serving_env(spec, run=run)
    rep.findings += f
    rep.findings += check_driver_vs_torch(rep.driver, rep.serving)
    f, rep.host = host(spec)
    rep.findings += f
    rep.findings += nccl_cuda_env(spec)
    return rep
