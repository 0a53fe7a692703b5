"""From a deployment (or a bare model dir) to KV-memory inputs, results and findings.

This is the edge of the KV calculation: it reads the checkpoint (weights from its index, the
`auto` KV dtype from the quant module) and the spec's flags, then calls the pure kvmem functions.
"""
from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from runbook import quant
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.options import Options
from runbook.core.spec import Deployment
from runbook.core.units import GIB
from runbook.kv import memory as kvmem
from runbook.kv import topology as kvtopo
from runbook.model import arch as arch_mod
from runbook.model import checkpoint

# Flags that change SGLang's pools in ways this model does not follow: a warn finding when a spec sets them.
NOT_MODELLED_FLAGS = ("speculative-draft-model-path", "enable-hisparse", "dcp-size", "attn-cp-size", "enable-two-batch-overlap",
                      "max-prefill-tokens", "kv-cache-quant-method", "hybrid-kvcache-ratio", "enable-mamba-extra-buffer-lazy",
                      "mamba-scheduler-strategy", "speculative-dflash-block-size", "disaggregation-mode", "moe-a2a-backend")


_SCENARIO_KEYS = ("speculative", "mem_fraction_static", "kv_bytes_per_token_per_gpu", "draft_kv_bytes_per_token_per_gpu",
                  "state_pool_bytes_per_gpu", "spec_state_bytes_per_gpu", "max_total_num_tokens", "max_running_requests",
                  "requests_at_context")


def scenarios(a: arch_mod.Arch, inp: kvmem.Inputs, result: kvmem.Result) -> list[tuple[str, kvmem.Result]]:
    """The deployment beside what it would be with (or without) speculative decoding, and with SGLang's
    own mem_fraction_static when the spec pins one: what MTP costs, and what the default would give."""
    out = [("as deployed", result)]
    if inp.speculative_algorithm:
        out.append(("without speculative decoding",
                    kvmem.compute(a, inp.but(speculative_algorithm=None, speculative_num_steps=None,
                                             speculative_eagle_topk=None, speculative_num_draft_tokens=None))))
    elif a.mtp_layers:
        out.append(("with MTP (NEXTN, 3 steps, topk 1)", kvmem.compute(a, inp.but(
            speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4))))
    if inp.mem_fraction_static is not None and inp.kv_budget_gib is None and inp.gpu_mem_gib is not None:
        out.append(("SGLang's default mem_fraction_static", kvmem.compute(a, inp.but(mem_fraction_static=None))))
    return out


@dataclass
class Plan:
    arch: arch_mod.Arch
    inputs: kvmem.Inputs
    result: kvmem.Result
    candidates: list[kvmem.Result]
    findings: list[Finding] = field(default_factory=list)
    auto_kv_dtype: str = "bfloat16"
    weights_source: str = ""
    scenarios: list[tuple[str, kvmem.Result]] = field(default_factory=list)
    topology: dict[str, Any] | None = None       # replicas: each one's plan and the total (kv/topology.py)
    ranks: list[dict[str, Any]] | None = None    # one server across nodes: each node rank's share
    ranks_total: dict[str, Any] | None = None
    checkpoint_kv: Any = None                    # quant.declared.KVCache: what the checkpoint holds for the KV cache

    def data(self) -> dict[str, Any]:
        d = self.result.to_json()
        # derived from the backends and GPU since it stopped being an input; kept where `kv --json` always had it
        d["inputs"] = {**self.inputs.to_json(), "nvfp4_scale_layouts": d.pop("nvfp4_scale_layouts")}
        d["weights_source"] = self.weights_source
        d["candidates"] = [{k: c.to_json()[k] for k in ("kv_dtype", "kv_bytes_per_token_per_gpu", "max_total_num_tokens",
                                                         "max_running_requests", "requests_at_context")} for c in self.candidates]
        d["scenarios"] = [{"scenario": label, **{k: r.to_json()[k] for k in _SCENARIO_KEYS}} for label, r in self.scenarios]
        d.update(topology=self.topology, ranks=self.ranks, ranks_total=self.ranks_total)
        return d


def assess(spec: Deployment | None = None, model_dir: str | None = None, options: Options | None = None, *,
         loaded: tuple[checkpoint.Checkpoint, str] | None = None, weights_gib: float | None = None, **what_if: Any) -> Plan:
    """Stage 20's entry point. Inputs from the spec (each `kvmem.Inputs` field says where), then the options (CLI
    flags, notebook parameters) and `what_if` (widgets, callers), then the checkpoint's. `loaded`: the (Checkpoint,
    note) a caller already read; `weights_gib`: the weights per GPU, given."""
    if loaded is not None:
        ck, note = loaded
    elif model_dir or spec is not None:
        ck, note = checkpoint.for_spec(spec, model_dir)
    else:
        raise InputError("give MODEL_DIR or --deployment")
    a = arch_mod.from_config(ck.config, str(ck.dir / "config.json"))
    flags = dict(spec.serving.flags) if spec is not None else {}
    qrep = quant.inspect_checkpoint(ck, flags, compute_capability=spec.hardware.compute_capability if spec is not None else None)
    # the spec's values, then the options and what-ifs (None: unset), validated once as a whole
    inp = kvmem.Inputs.resolve(spec, options, **what_if)
    given = (options.model_dump(exclude_none=True) if options is not None else {}) | {k: v for k, v in what_if.items() if v is not None}
    kv_flag = str(given.get("kv_dtype") or flags.get("kv-cache-dtype") or "auto")
    findings: list[Finding] = []
    if str(flags.get("device", "")).lower() == "cpu":
        inp, cpu_finding = _cpu_memory(inp, given="gpu_mem_gib" in given)
        findings.append(cpu_finding)
    inp, source = _weights(inp, ck, spec, weights_gib, note)
    auto, auto_why = _auto_kv_dtype(a, qrep.kv_cache.auto_resolves_to, inp.compute_capability)
    inp = inp.but(kv_dtype=auto if kv_flag == "auto" else kvmem.normalise_dtype(kv_flag),
                  quantization=qrep.weights.sglang_quantization)
    algorithm = inp.speculative_algorithm
    if algorithm and algorithm.upper() not in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"):
        findings.append(Finding("kv.not_modelled", "warn",
                                f"--speculative-algorithm {algorithm}: its draft memory is not modelled",
                                detail="the 48-request default is applied; the draft's own pool is not",
                                remedy="Compare with the server's logged max_total_num_tokens / max_running_requests."))
    for flag in NOT_MODELLED_FLAGS:
        if flags.get(flag) not in (None, False):
            findings.append(Finding("kv.not_modelled", "warn", f"--{flag} changes SGLang's pools in a way not modelled here",
                                    detail="the figures below are for the deployment without it",
                                    remedy="Compare with the server's logged max_total_num_tokens / max_running_requests "
                                           "(runbook verify)."))
    result = kvmem.compute(a, inp)
    cands = []
    for d in dict.fromkeys(("bfloat16", "fp8_e4m3", inp.kv_dtype)):
        cands.append(result if d == inp.kv_dtype else kvmem.compute(a, inp.but(kv_dtype=d)))
    scen = scenarios(a, inp, result)
    findings.append(Finding("kv.dtype", "info",
                            f"KV dtype {inp.kv_dtype}" + (f" (auto → {auto})" if kv_flag == "auto" else f" (--kv-cache-dtype {kv_flag})"),
                            detail=(auto_why + "; " if auto_why and kv_flag == "auto" else "") + f"weights per GPU: {source}"))
    findings += result.findings
    topo, rank_list, total_ranks, topo_findings = kvtopo.whole(spec, inp, result)
    return Plan(a, inp, result, cands, findings + topo_findings, auto, source, scen, topo, rank_list, total_ranks,
                checkpoint_kv=qrep.kv_cache)


def plan_for_rank(spec: Deployment, rank: int, **overrides: Any) -> dict[str, Any]:
    """What node rank `rank` of the spec's server runs and the pool each of its GPUs holds (`kv --json`'s
    `ranks[rank]`; rank 0 of a one-node spec is the whole server): the figures its start-up log should show."""
    nodes = spec.parallelism.nodes
    nnodes = max(1, len(nodes))
    if not 0 <= rank < nnodes:
        raise InputError(f"node rank {rank}: {spec.source or 'the spec'} has {nnodes} node(s) under parallelism.nodes "
                         f"(ranks 0–{nnodes - 1})")
    p = assess(spec, **overrides)
    problem = kvtopo.placement(spec, p.inputs)
    if problem:
        raise InputError(problem)
    node = nodes[rank] if nodes else None
    return kvtopo.rank_entry(p.inputs, p.result, nnodes, rank, node.name if node else None, node.address if node else None)


def _cpu_memory(inp: kvmem.Inputs, given: bool) -> tuple[kvmem.Inputs, Finding]:
    """--device cpu: the memory the pool comes from is the host's free memory, not hardware.gpu_memory_gib."""
    if not given:
        inp = inp.but(gpu_mem_gib=host_free_gib())
    assert inp.gpu_mem_gib is not None
    return inp, Finding("kv.cpu_memory", "info", f"--device cpu: the pool is sized from the host's free memory, "
                        f"{inp.gpu_mem_gib:.2f} GiB " + ("(given)" if given else "now"),
                        detail="SGLang reads the host's available memory (per NUMA node, capped by a cgroup v2 memory.max) "
                               "when it starts, not hardware.gpu_memory_gib: a server started later sizes its pool from "
                               "what is free then")


def host_free_gib() -> float:
    """The memory SGLang's CPU path sizes from, read now (utils/common.py get_free_cpu_memory and
    get_available_gpu_memory for device "cpu"): the host's available memory, capped by a cgroup v2 memory.max
    less memory.current, divided by the NUMA nodes that have CPUs; GiB."""
    free = psutil.virtual_memory().available
    try:
        cap, cur = (Path("/sys/fs/cgroup", f).read_text().strip() for f in ("memory.max", "memory.current"))
        if cap != "max":
            free = min(free, max(0, int(cap) - int(cur)))
    except (OSError, ValueError):
        pass
    nodes = [n for n in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist") if Path(n).read_text().strip()]
    return free / max(1, len(nodes)) / GIB


def _auto_kv_dtype(a: arch_mod.Arch, from_checkpoint: str, cc: str | None) -> tuple[str, str]:
    return arch_mod.auto_kv_override(a, cc) or (from_checkpoint, "")


def _weights(inp: kvmem.Inputs, ck: checkpoint.Checkpoint, spec: Deployment | None, weights_gib: float | None, note: str):
    gpus = inp.tp * inp.pp
    if weights_gib is not None:
        return inp.but(weights_bytes_per_gpu=int(weights_gib * GIB)), f"{weights_gib:g} GiB per GPU (given)"
    if ck.total_bytes:
        return (inp.but(weights_bytes_per_gpu=ck.total_bytes // gpus),
                f"{ck.total_bytes / GIB:.1f} GiB checkpoint / {gpus} GPUs (from {ck.dir.name}'s index or headers)")
    if spec is not None and spec.model.size_gib:
        return (inp.but(weights_bytes_per_gpu=int(spec.model.size_gib * GIB / gpus)),
                f"{spec.model.size_gib:g} GiB / {gpus} GPUs from the spec's model.size_gib (the checkpoint is not on this machine)")
    return inp, "unknown" + (f" ({note})" if note else "")
