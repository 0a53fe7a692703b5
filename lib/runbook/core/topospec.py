"""The spec's `topology` section: more than one SGLang server behind SGLang's gateway.

Absent, a deployment is one server (or one server across `parallelism.nodes`) exactly as before. Present, it
declares replicas (each a whole copy of the model: on its own host, or several on one host on disjoint GPU sets
and ports) and the gateway in front of them (`smg`, the index's Shepherd Model Gateway, or the older
`sglang-router`). The rules that need the rest of the spec (GPU counts, the server's own port, nodes) are in
`check(...)`, which `Deployment` calls, so each bad topology is one line naming its field.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from runbook.core.specbase import (
    MAX_GPUS_PER_NODE,
    MAX_LIST,
    FlagValue,
    Strict,
    check_flag_names,
    check_flag_values,
    http_url,
)

_NAME = r"^[a-z0-9][a-z0-9-]{0,30}$"          # a unit-name suffix and a Kubernetes label value
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# The gateway binaries this runbook renders units for: the console module each one's wheel runs and the
# sub-command before its router flags. `smg` 1.13.0 is what the tests run; `sglang-router` is its older name.
GATEWAYS: dict[str, tuple[tuple[str, ...], str]] = {
    "smg": (("-m", "smg", "launch"), "smg.launch_router"),
    "sglang-router": (("-m", "sglang_router.launch_router"), "sglang_router.launch_router"),
}
# smg 1.13.0's --policy choices (smg/router_args.py).
POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
            "consistent_hashing", "prefix_hash")
Policy = Literal["random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
                 "consistent_hashing", "prefix_hash"]
# Gateway flags the topology section owns, so the spec cannot say the same thing twice.
OWNED_GATEWAY_FLAGS = {
    "worker-urls": "topology.replicas", "policy": "topology.gateway.policy", "host": "topology.gateway.bind",
    "port": "topology.gateway.port", "prometheus-port": "topology.gateway.prometheus_port",
    "api-key": "topology.gateway.api_key_env (never inline a key)",
}


class Replica(Strict):
    name: str = Field(pattern=_NAME, description="this replica's name: its unit is <systemd.unit_name>-<name>")
    host: str = Field(description="the machine it runs on, as the Ansible inventory names it and the gateway reaches it")
    port: int = Field(gt=0, lt=65536, description="its SGLang HTTP port")
    gpus: list[int] | None = Field(None, max_length=MAX_GPUS_PER_NODE,
                                   description="GPU indexes it owns on its host (CUDA_VISIBLE_DEVICES); required "
                                   "where two replicas share a GPU host")

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("give at least one GPU index, or leave gpus out")
            if any(i < 0 for i in v):
                raise ValueError(f"GPU indexes start at 0 (got {v})")
            if len(set(v)) != len(v):
                raise ValueError(f"a GPU index is listed twice (got {v})")
        return v

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)


class Gateway(Strict):
    binary: Literal["smg", "sglang-router"] = Field("smg", description="which gateway: smg (Shepherd Model Gateway) "
                                                    "or the older sglang-router")
    python: str = Field(description="absolute path of the python in the gateway's environment (the wheel's interpreter)")
    host: str = Field("127.0.0.1", description="the machine it runs on, as the inventory names it and clients reach it")
    bind: str = Field("0.0.0.0", description="the address it listens on (--host)")
    port: int = Field(8000, gt=0, lt=65536)
    policy: Policy = Field("cache_aware", description="how it picks a replica (--policy)")
    prometheus_port: int | None = Field(None, gt=0, lt=65536, description="its own metrics port (--prometheus-port)")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key clients "
                                    "send to the gateway (from serving.env_file)")
    flags: dict[str, FlagValue] = Field(default_factory=dict, description="more gateway flags without leading dashes")
    unit_name: str | None = Field(None, pattern=r"^[A-Za-z0-9@_.:-]+$",
                                  description="its systemd unit; default <systemd.unit_name>-gateway")

    @field_validator("flags", mode="before")
    @classmethod
    def _flag_values(cls, v: Any) -> Any:
        return check_flag_values(v)

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, v: dict[str, FlagValue]) -> dict[str, FlagValue]:
        return check_flag_names(v, OWNED_GATEWAY_FLAGS, "topology.gateway.flags", "health-check-interval-secs")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError(f"{v!r} is not an environment variable name (letters, digits, _; not starting with a digit)")
        return v

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)


class Topology(Strict):
    """Several servers of the one model: replicas behind a gateway."""
    replicas: list[Replica] = Field(default_factory=list, max_length=MAX_LIST)
    gateway: Gateway | None = None

    @model_validator(mode="after")
    def _replicas_apart(self) -> Topology:
        seen: dict[str, int] = {}
        where: dict[tuple[str, int], str] = {}
        for i, r in enumerate(self.replicas):
            if r.name in seen:
                raise ValueError(f"replicas[{i}].name: {r.name!r} is also replicas[{seen[r.name]}]'s; give each replica its own name")
            seen[r.name] = i
            if (r.host, r.port) in where:
                raise ValueError(f"replicas[{i}].port: {r.host}:{r.port} is also {where[(r.host, r.port)]}'s; "
                                 "give each replica on a host its own port")
            where[(r.host, r.port)] = f"replicas[{seen[r.name]}]"
        if self.gateway is not None:
            g = self.gateway
            if not self.replicas:
                raise ValueError("gateway: a gateway needs replicas to route to; list them under topology.replicas")
            for port, field in ((g.port, "gateway.port"), (g.prometheus_port, "gateway.prometheus_port")):
                if port is not None and (g.host, port) in where:
                    raise ValueError(f"{field}: {g.host}:{port} is also {where[(g.host, port)]}'s port; pick another")
            if g.prometheus_port is not None and g.prometheus_port == g.port:
                raise ValueError(f"gateway.prometheus_port: {g.port} is also gateway.port; pick another")
        return self

    @property
    def hosts(self) -> list[str]:
        """The replicas' hosts, each once, in order."""
        return list(dict.fromkeys(r.host for r in self.replicas))


def check(topology: Topology, *, gpus_per_server: int, gpu_count: int, nodes: int, cpu: bool) -> None:
    """Rules that need the rest of the spec: each replica's GPUs exist on its host, hold one server, and no two
    replicas on a host share one. Raises ValueError naming the field."""
    if topology.replicas and nodes > 1:
        raise ValueError("topology.replicas: each replica here is one node; a replica spread over parallelism.nodes "
                         "is not supported: declare either replicas or nodes")
    by_host: dict[str, list[tuple[int, Replica]]] = {}
    for i, r in enumerate(topology.replicas):
        by_host.setdefault(r.host, []).append((i, r))
        if r.gpus is None:
            continue
        if len(r.gpus) != gpus_per_server:
            raise ValueError(f"topology.replicas[{i}].gpus: {len(r.gpus)} GPUs listed but one server needs "
                             f"{gpus_per_server} (parallelism tp × pp)")
        high = max(r.gpus)
        if high >= gpu_count:
            raise ValueError(f"topology.replicas[{i}].gpus: GPU {high} does not exist on a host of "
                             f"hardware.gpu_count {gpu_count} (indexes 0–{gpu_count - 1})")
    for host, group in by_host.items():
        if len(group) < 2:
            continue
        if not cpu and any(r.gpus is None for _, r in group):
            i = next(i for i, r in group if r.gpus is None)
            raise ValueError(f"topology.replicas[{i}].gpus: {len(group)} replicas share {host}; give each its own "
                             "GPU indexes (gpus: [...])")
        owner: dict[int, int] = {}
        for i, r in group:
            for g in r.gpus or []:
                if g in owner:
                    raise ValueError(f"topology.replicas[{i}].gpus: GPU {g} on {host} is also replicas[{owner[g]}]'s; "
                                     "give each replica on a host its own GPUs")
                owner[g] = i
        if not cpu and len(group) * gpus_per_server > gpu_count:
            raise ValueError(f"topology.replicas: {len(group)} replicas of {gpus_per_server} GPUs on {host} need "
                             f"{len(group) * gpus_per_server} but hardware.gpu_count is {gpu_count}")


def rank_ranges(tp: int, pp: int, nnodes: int, node_rank: int) -> tuple[range, range]:
    """The PP ranks and TP ranks one node runs of a server across `nnodes` nodes: SGLang 0.5.23's own placement
    (entrypoints/engine.py _calculate_rank_ranges), which launches one scheduler per (pp, tp) pair in these ranges.
    PP ranks are split over nodes first; where there are more nodes than PP ranks, each PP rank's TP group spans
    nnodes // pp nodes."""
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_pp_rank = max(nnodes // pp, 1)
    pp_ranks = range(pp_per_node * (node_rank // nodes_per_pp_rank), pp_per_node * (node_rank // nodes_per_pp_rank + 1))
    tp_per_node = tp // nodes_per_pp_rank
    tp_ranks = range(tp_per_node * (node_rank % nodes_per_pp_rank), tp_per_node * (node_rank % nodes_per_pp_rank + 1))
    return pp_ranks, tp_ranks


def placement_problem(tp: int, pp: int, nnodes: int) -> str | None:
    """Why SGLang's placement (`rank_ranges`) does not run each of the server's tp × pp ranks exactly once over
    `nnodes` nodes, or None. SGLang checks only that tp × pp is a multiple of the nodes; a pp that neither
    divides nor is a multiple of the node count then leaves a PP rank on no node (or one that does not exist on
    another), and the server waits for it forever."""
    seen: dict[tuple[int, int], int] = {}
    for n in range(nnodes):
        pp_r, tp_r = rank_ranges(tp, pp, nnodes, n)
        for p in pp_r:
            for t in tp_r:
                if p >= pp or t >= tp:
                    return f"node rank {n} would run PP rank {p}, TP rank {t}, which do not exist"
                if (p, t) in seen:
                    return f"nodes {seen[(p, t)]} and {n} would both run PP rank {p}, TP rank {t}"
                seen[(p, t)] = n
    missing = [(p, t) for p in range(pp) for t in range(tp) if (p, t) not in seen]
    if missing:
        return f"PP rank {missing[0][0]}, TP rank {missing[0][1]} would run on no node"
    return None
