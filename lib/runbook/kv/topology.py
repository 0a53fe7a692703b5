"""Stage 20 over more than one server's worth of GPUs: the plan per replica and for the whole deployment, and
per node rank of one server across nodes.

Replicas (`topology.replicas`) are identical SGLang servers: each sizes its pools exactly as the one server's plan
does, so each replica's figures are that plan's, named per replica so the operator sees each; the deployment's
total sums them. What the total means for one session depends on the gateway's policy (`policy_note`).

Across nodes (`parallelism.nodes`) there is one server: SGLang's arithmetic is per GPU (every rank measures its own
GPU, the free memory is all-reduced MIN over the launch world, the token count MIN over PP ranks), so each node rank
holds tp × pp / nodes GPUs of the same per-GPU pool and the server's pool in tokens is that figure, not multiplied
by the nodes. Pure: works on the plan's inputs and result (kv/plan.py calls it).
"""
from __future__ import annotations

import math
from typing import Any

from runbook.core import topospec
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.kv import memory as kvmem

# What each smg policy does with a session's turns (smg 1.13.0's --policy choices, core/topospec.POLICIES).
# keeps: a session's prefix stays on one replica; spreads: a turn may land on any replica.
KEEPS_PREFIX = {
    "cache_aware": "routes each request to the replica whose radix tree holds the longest match of its prefix",
    "prefix_hash": "hashes the prompt's first tokens onto a ring of replicas",
    "consistent_hashing": "hashes the request's routing key onto a ring of replicas (a request without one falls "
                          "back to random)",
    "manual": "pins each routing key to the replica it was first given (a request without one goes anywhere)",
}
SPREADS = {
    "round_robin": "sends each request to the next replica in turn",
    "random": "sends each request to a random replica",
    "power_of_two": "sends each request to the less loaded of two random replicas",
    "least_load": "sends each request to the least loaded replica",
}
# Gateway flags that pin a conversation to one replica on any policy (smg's --sticky-sessions, alias
# --routing-key-override).
_STICKY_FLAGS = ("sticky-sessions", "routing-key-override")


def _figures(inp: kvmem.Inputs, res: kvmem.Result) -> dict[str, Any]:
    """One server's pool figures as SGLang logs them (per pool; attention DP has attn_dp pools)."""
    return {"max_total_num_tokens": res.max_total_num_tokens, "max_running_requests": res.max_running_requests,
            "requests_at_context": dict(res.requests_at_context), "kv_pool_bytes_per_gpu": res.kv_pool_bytes_per_gpu,
            "pools": inp.attn_dp}


def _times(v: int | None, k: int) -> int | None:
    return None if v is None else v * k


def replicas(spec: Deployment, inp: kvmem.Inputs, res: kvmem.Result) -> dict[str, Any] | None:
    """`kv --json`'s `topology`: each replica's plan, the deployment's total, the gateway and its policy's consequence
    for one session; None without replicas."""
    topo = spec.topology
    if not topo.replicas:
        return None
    gpus = inp.tp * inp.pp
    one = _figures(inp, res)
    rows = [{"name": r.name, "host": r.host, "port": r.port, "url": r.url, "gpus": r.gpus, "gpu_count": gpus, **one}
            for r in topo.replicas]
    pool, n, dp = res.max_total_num_tokens, len(rows), inp.attn_dp
    # identical servers: the sum over replicas is n times one (each with attn_dp pools); unknown stays unknown
    kv_tokens = _times(pool, n * dp)
    total = {"replicas": n, "gpus": gpus * n, "weights_bytes": _times(res.weights_bytes_per_gpu, gpus * n),
             "kv_tokens": kv_tokens, "running_requests": _times(res.max_running_requests, n * dp),
             "requests_at_context": {c: _times(k, n) for c, k in res.requests_at_context.items()}}
    g = topo.gateway
    affinity, note = policy_note(spec, pool, kv_tokens)
    return {"replicas": rows, "total": total,
            "gateway": None if g is None else {"binary": g.binary, "url": g.url, "policy": g.policy},
            "session_tokens": pool, "policy_affinity": affinity, "policy_note": note}


def policy_note(spec: Deployment, pool: int | None, total: int | None = None) -> tuple[str | None, str | None]:
    """(affinity, one line): `keeps` when the gateway keeps a session's prefix on one replica, `spreads` when a
    turn may land on any, `first` for passthrough (one replica takes everything), None without a gateway."""
    topo, g = spec.topology, spec.topology.gateway
    if g is None:
        return None, None
    n = len(topo.replicas)
    one = f"{pool:,} tokens" if pool is not None else "one replica's pool"
    sticky = next((f for f in _STICKY_FLAGS if g.flags.get(f) not in (None, False)), None)
    if g.policy == "passthrough":
        return "first", (f"passthrough sends every request to the first healthy replica: the deployment serves "
                         f"from one replica's pool ({one}) and the other {n - 1} stand by" if n > 1 else
                         f"passthrough to the one replica: its pool ({one}) serves everything")
    if g.policy in KEEPS_PREFIX or sticky:
        name = g.policy if g.policy in KEEPS_PREFIX else f"{g.policy} with --{sticky}"
        how = KEEPS_PREFIX.get(g.policy) or f"--{sticky} pins each conversation to one replica"
        whole = f"the total of {n} replicas" + (f" ({total:,})" if total is not None else "")
        return "keeps", (f"{name}: a session's prefix stays on one replica ({how}), so one replica's pool ({one}), "
                         f"not {whole}, bounds one session's context and its prefix cache")
    return "spreads", (f"{g.policy} {SPREADS.get(g.policy, 'does not follow a prefix')}: a session's turns land on "
                       f"any of the {n} replicas, so the prefix-cache hit rate falls as replicas grow (each replica "
                       f"caches its own copy of a prefix it saw); one request still needs one replica's pool ({one})")


def ranks(spec: Deployment, inp: kvmem.Inputs, res: kvmem.Result) -> list[dict[str, Any]] | None:
    """`kv --json`'s `ranks`: one entry per node rank of a server across `parallelism.nodes`; None on one node."""
    nodes = spec.parallelism.nodes
    if len(nodes) < 2:
        return None
    return [rank_entry(inp, res, len(nodes), i, nodes[i].name, nodes[i].address) for i in range(len(nodes))]


def rank_entry(inp: kvmem.Inputs, res: kvmem.Result, nnodes: int, rank: int, node: str | None = None,
               address: str | None = None) -> dict[str, Any]:
    """What node rank `rank` runs and the pool each of its GPUs holds: SGLang's placement (core/topospec.rank_ranges),
    the PP stages of its PP ranks, and the server's per-GPU figures (the same on every rank)."""
    pp_r, tp_r = topospec.rank_ranges(inp.tp, inp.pp, nnodes, rank)
    stages = [s for s in res.stages if s["index"] in pp_r]
    pp_per_node, tp_per_node = len(pp_r), len(tp_r)
    # entrypoints/engine.py: gpu_id = base + (pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node
    gpu_ids = sorted({(p % pp_per_node) * tp_per_node + t % tp_per_node for p in pp_r for t in tp_r})
    return {"rank": rank, "node": node, "address": address, "gpus": len(gpu_ids), "gpu_ids": gpu_ids,
            "tp_ranks": [tp_r.start, tp_r.stop - 1], "pp_ranks": [pp_r.start, pp_r.stop - 1],
            "layers": [stages[0]["start_layer"], stages[-1]["end_layer"] - 1] if stages else None,
            "kv_bytes_per_token_per_gpu": math.ceil(max(s["cell_bytes"] for s in stages)) if stages else None,
            "weights_bytes_per_gpu": res.weights_bytes_per_gpu, **_figures(inp, res)}


def ranks_total(spec: Deployment, inp: kvmem.Inputs, res: kvmem.Result) -> dict[str, Any] | None:
    """`kv --json`'s `ranks_total`: the one server across nodes as a whole; None on one node."""
    nodes = len(spec.parallelism.nodes)
    if nodes < 2:
        return None
    gpus = inp.tp * inp.pp
    return {"nodes": nodes, "gpus": gpus, "gpus_per_node": gpus // nodes,
            "weights_bytes": None if res.weights_bytes_per_gpu is None else res.weights_bytes_per_gpu * gpus,
            "max_total_num_tokens": res.max_total_num_tokens, "max_running_requests": res.max_running_requests,
            "requests_at_context": dict(res.requests_at_context), "pools": inp.attn_dp}


def whole(spec: Deployment | None, inp: kvmem.Inputs, res: kvmem.Result) -> tuple[
        dict[str, Any] | None, list[dict[str, Any]] | None, dict[str, Any] | None, list[Finding]]:
    """(`topology`, `ranks`, `ranks_total`, their findings) for the plan; all empty without a spec."""
    if spec is None:
        return None, None, None, []
    topo = replicas(spec, inp, res)
    problem = placement(spec, inp)
    if problem:   # a what-if (--tp, --pp) the spec's nodes cannot hold; the spec itself is checked when it loads
        return topo, None, None, findings(topo, None, None) + [Finding("kv.ranks", "fail", problem)]
    rank_list, total_ranks = ranks(spec, inp, res), ranks_total(spec, inp, res)
    return topo, rank_list, total_ranks, findings(topo, rank_list, total_ranks)


def placement(spec: Deployment, inp: kvmem.Inputs) -> str | None:
    """Why SGLang cannot place the plan's tp × pp over the spec's nodes, or None (one node, or it can)."""
    nnodes, gpus = len(spec.parallelism.nodes), inp.tp * inp.pp
    if nnodes < 2:
        return None
    if gpus % nnodes:
        return f"TP {inp.tp} × PP {inp.pp} = {gpus} GPUs is not a multiple of the {nnodes} nodes: SGLang refuses it"
    if gpus // nnodes > spec.hardware.gpu_count:
        return (f"TP {inp.tp} × PP {inp.pp} over {nnodes} nodes needs {gpus // nnodes} GPUs per node; "
                f"hardware.gpu_count is {spec.hardware.gpu_count}")
    why = topospec.placement_problem(inp.tp, inp.pp, nnodes)
    return f"TP {inp.tp} × PP {inp.pp} over {nnodes} nodes: {why}" if why else None


def findings(topology: dict[str, Any] | None, rank_list: list[dict[str, Any]] | None,
             total_ranks: dict[str, Any] | None) -> list[Finding]:
    """`kv.topology.total`, `kv.topology.policy` and `kv.ranks`: the whole deployment in one line each."""
    out: list[Finding] = []
    if topology is not None:
        t, n = topology["total"], topology["total"]["replicas"]
        longest = max(t["requests_at_context"], key=int, default=None)
        at = (f", {t['requests_at_context'][longest]:,} concurrent {int(longest):,}-token sessions"
              if longest is not None and t["requests_at_context"][longest] is not None else "")
        out.append(Finding("kv.topology.total", "info",
                           f"{n} replicas, {t['gpus']} GPUs: {_n(t['kv_tokens'])} KV tokens in all{at}",
                           detail=f"each replica is the plan above ({_n(topology['session_tokens'])} tokens, "
                                  f"{_n(t['running_requests'] and t['running_requests'] // n)} running requests); "
                                  "the total is their sum"))
        if topology["policy_note"]:
            warn = topology["policy_affinity"] in ("spreads", "first") and n > 1
            out.append(Finding("kv.topology.policy", "warn" if warn else "info", topology["policy_note"],
                               remedy=("For long multi-turn sessions use policy cache_aware (or prefix_hash) so each "
                                       "session's prefix is reused on one replica." if warn else "")))
    if rank_list and total_ranks:
        out.append(Finding("kv.ranks", "info",
                           f"one server across {total_ranks['nodes']} nodes: {total_ranks['gpus']} GPUs, "
                           f"{total_ranks['gpus_per_node']} per node, one pool of {_n(total_ranks['max_total_num_tokens'])} "
                           "tokens",
                           detail="each node rank holds its share of the TP/PP ranks with the same per-GPU pool: the "
                                  "pool in tokens is the per-GPU figure, not multiplied by the nodes"))
    return out


def _n(v: int | None) -> str:
    return "—" if v is None else f"{v:,}"
