"""Differential test: one server across nodes, by SGLang 0.5.23's own code (tests/oracle/sglang_kv.py).

For a TP (and a TP × PP) that spans nodes, SGLang's launcher places ranks on each --node-rank
(entrypoints/engine.py _calculate_rank_ranges) and sizes every rank's pool per GPU. The oracle runs that code for
each node rank with `--nnodes N --node-rank R --dist-init-addr`, and for the same tp on one node: SGLang's per-GPU
figures must be equal (the pool in tokens is not multiplied by the nodes), and `kv.plan_for_rank(spec, R)` must
give the ranks SGLang places there and the figures SGLang sizes for them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import REPO, spec_data

from runbook import kv
from runbook.core import spec as spec_mod

ORACLE = REPO / "tests" / "oracle"
SERVING_PY = os.environ.get("RUNBOOK_SERVING_PYTHON") or str(REPO / ".venv-serving" / "bin" / "python")
pytestmark = [pytest.mark.serving,
              pytest.mark.skipif(not Path(SERVING_PY).exists(), reason=f"no serving venv at {SERVING_PY} (make serving-env)")]

sys.path.insert(0, str(ORACLE))
import kv_cases  # noqa: E402

# (tp, pp, nodes): TP across 2 nodes, TP 16 across 2 nodes, PP across 2 nodes, TP × PP across 4 (2 nodes per stage)
LAYOUTS = [(8, 1, 2), (16, 1, 2), (8, 2, 2), (4, 2, 4)]
_SIZE_GIB = 233   # the default spec's model.size_gib: the weights both sides share


def _case(tp: int, pp: int, nodes: int, rank: int | None) -> dict:
    base = next(c for c in kv_cases.cases() if c["id"] == "default|as-is")
    argv = list(base["argv"])
    argv[argv.index("--tp-size") + 1] = str(tp)
    if pp > 1:
        argv += ["--pp-size", str(pp)]
    if rank is not None:
        argv += ["--nnodes", str(nodes), "--node-rank", str(rank), "--dist-init-addr", "10.0.0.1:50000"]
    return {**base, "id": f"tp{tp}pp{pp}|" + ("one-node" if rank is None else f"nodes{nodes}|rank{rank}"), "argv": argv,
            "weights_bytes_per_gpu": _SIZE_GIB * 2**30 // (tp * pp)}


CASES = [_case(tp, pp, n, r) for tp, pp, n in LAYOUTS for r in (None, *range(n))]


@lru_cache(maxsize=1)
def oracle() -> dict[str, dict]:
    proc = subprocess.run([SERVING_PY, str(ORACLE / "sglang_kv.py")], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=600, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {r["id"]: r for r in json.loads(proc.stdout)}
    broken = {k: v.get("oracle_error") or v.get("refused") for k, v in out.items() if v.get("oracle_error") or v.get("refused")}
    assert not broken, broken
    return out


def _spec(tp: int, pp: int, nodes: int) -> spec_mod.Deployment:
    data = spec_data(**{"parallelism.tp": tp, "parallelism.pp": pp,
                        "parallelism.nodes": [{"name": f"gpu-{i:02d}", "address": f"10.0.0.{i + 1}"} for i in range(nodes)]})
    return spec_mod.from_dict(data, str(REPO / "deployments" / "across-nodes.yaml"))


_PER_GPU = ("rest_bytes", "kv_budget_bytes", "max_total_num_tokens", "max_running_requests", "max_mamba_cache_size",
            "cell_size", "state_bytes_per_slot", "mem_fraction_static")


def _per_gpu(r: dict) -> dict:
    ranks = r.get("pp_ranks") or [r]
    return {k: [x.get(k, r.get(k)) for x in ranks] for k in _PER_GPU}


@pytest.mark.parametrize("tp, pp, nodes", LAYOUTS, ids=[f"tp{t}pp{p}-{n}nodes" for t, p, n in LAYOUTS])
def test_sglang_sizes_each_node_rank_as_the_same_tp_on_one_node(tp, pp, nodes):
    """SGLang's own figures, every PP rank's: a node rank of a server across nodes has the pool the same tp × pp has
    on one node, to the byte and token."""
    res = oracle()
    one = _per_gpu(res[f"tp{tp}pp{pp}|one-node"])
    for rank in range(nodes):
        got = res[f"tp{tp}pp{pp}|nodes{nodes}|rank{rank}"]
        assert got["node"]["node_rank"] == rank and got["node"]["nnodes"] == nodes
        assert _per_gpu(got) == one, rank


@pytest.mark.parametrize("tp, pp, nodes", LAYOUTS, ids=[f"tp{t}pp{p}-{n}nodes" for t, p, n in LAYOUTS])
def test_plan_for_rank_is_what_sglang_places_and_sizes_on_that_node(tp, pp, nodes):
    dep = _spec(tp, pp, nodes)
    for rank in range(nodes):
        want = oracle()[f"tp{tp}pp{pp}|nodes{nodes}|rank{rank}"]
        got = kv.plan_for_rank(dep, rank)   # weights from the spec's model.size_gib, as the oracle's case
        assert (got["pp_ranks"], got["tp_ranks"]) == (want["node"]["pp_ranks"], want["node"]["tp_ranks"]), rank
        assert got["gpus"] == tp * pp // nodes
        stages = [s for s in (want.get("pp_ranks") or [want]) if got["pp_ranks"][0] <= s.get("pp_rank", 0) <= got["pp_ranks"][1]]
        assert got["layers"] == [stages[0]["start_layer"], stages[-1]["end_layer"] - 1], rank
        assert got["kv_bytes_per_token_per_gpu"] == max(s["cell_size"] for s in stages), rank
        for key in ("max_total_num_tokens", "max_running_requests"):
            assert got[key] == want[key], (rank, key)
        assert got["kv_pool_bytes_per_gpu"] == stages[0]["kv_budget_bytes"], rank
        assert got["weights_bytes_per_gpu"] * tp * pp == _SIZE_GIB * 2**30
