"""Stage 20 over a topology: the plan per replica and for the whole (deployments/'s replicas spec), the gateway
policy's consequence, and the plan per node rank of one server across nodes (SGLang's placement, per-GPU pools).
The figures each replica or rank shows are checked against the one-server plan computed on its own; SGLang's own
code for the across-nodes case is tests/test_kv_ranks.py."""
from __future__ import annotations

import json

import pytest
from conftest import REPO, spec_data

from runbook import kv
from runbook.core import spec, topospec
from runbook.core.errors import InputError
from runbook.kv import topology as kvtopo

REPLICAS = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4-replicas.yaml"
SOURCE = str(REPO / "deployments" / "t.yaml")   # model.card resolves against deployments/


def _dep(**changes) -> spec.Deployment:
    return spec.from_dict(spec_data(**changes), SOURCE)


def _nodes(n: int) -> list[dict]:
    return [{"name": f"gpu-{i:02d}", "address": f"10.0.0.{i + 1}"} for i in range(n)]


def _replicas(policy: str = "cache_aware", n: int = 2, **gateway) -> spec.Deployment:
    return _dep(**{"topology": {"replicas": [{"name": f"r{i}", "host": f"gpu-{i}.example.com", "port": 30000}
                                             for i in range(n)],
                                "gateway": {"python": "/opt/smg/bin/python", "policy": policy, **gateway}}})


def test_the_replicas_spec_plans_each_replica_as_the_one_server_and_sums_them():
    dep = spec.load(REPLICAS)
    one = kv.assess(spec.load()).result            # the single-host spec: the server each replica is
    p = kv.evaluate(dep, kv.KvOptions())
    t = p.topology
    assert [(r["name"], r["host"], r["port"], r["gpus"]) for r in t["replicas"]] == [
        ("r1", "gpu-01.example.com", 30000, list(range(8))), ("r2", "gpu-02.example.com", 30000, list(range(8)))]
    for r in t["replicas"]:
        assert (r["max_total_num_tokens"], r["max_running_requests"], r["requests_at_context"]) == (
            one.max_total_num_tokens, one.max_running_requests, one.requests_at_context)
        assert r["url"] == f"http://{r['host']}:30000" and r["gpu_count"] == 8
    assert one.max_total_num_tokens == 2_019_948   # what SGLang sizes for the story's host (test_kv_vs_sglang)
    tot = t["total"]
    assert (tot["replicas"], tot["gpus"], tot["kv_tokens"], tot["running_requests"]) == (
        2, 16, 2 * 2_019_948, 2 * one.max_running_requests)
    assert tot["requests_at_context"] == {c: 2 * n for c, n in one.requests_at_context.items()}
    assert tot["weights_bytes"] == 16 * one.weights_bytes_per_gpu
    assert t["gateway"] == {"binary": "smg", "url": "http://gw-01.example.com:8000", "policy": "cache_aware"}
    assert t["session_tokens"] == 2_019_948 and t["policy_affinity"] == "keeps"
    ids = {f.id: f for f in p.findings}
    assert ids["kv.topology.policy"].status == "info"
    assert "2,019,948 tokens" in ids["kv.topology.policy"].title and "not the total of 2 replicas (4,039,896)" in \
        ids["kv.topology.policy"].title
    assert ids["kv.topology.total"].title.startswith("2 replicas, 16 GPUs: 4,039,896 KV tokens in all, 14 concurrent "
                                                     "262,144-token sessions")
    json.dumps(p.data())   # the archive's data and `kv --json` carry it as is
    assert p.data()["topology"] == t and p.data()["ranks"] is None


def test_one_server_has_no_topology_and_no_topology_findings():
    p = kv.evaluate(spec.load(), kv.KvOptions())
    d = p.data()
    assert (d["topology"], d["ranks"], d["ranks_total"]) == (None, None, None)
    assert not [f for f in p.findings if f.id.startswith(("kv.topology", "kv.ranks"))]
    assert "replicas" not in kv.text_table(p) and "node ranks" not in kv.text_table(p)


@pytest.mark.parametrize("policy", topospec.POLICIES)
def test_every_gateway_policy_says_what_it_does_with_a_session(policy):
    p = kv.evaluate(_replicas(policy, n=3), kv.KvOptions())
    f = next(f for f in p.findings if f.id == "kv.topology.policy")
    pool = f"{p.result.max_total_num_tokens:,}"
    assert pool in f.title and "\n" not in f.title
    affinity = p.topology["policy_affinity"]
    if policy in kvtopo.KEEPS_PREFIX:
        assert affinity == "keeps" and f.status == "info" and "stays on one replica" in f.title
        assert "not the total of 3 replicas" in f.title
    elif policy in kvtopo.SPREADS:
        assert affinity == "spreads" and f.status == "warn" and "hit rate falls as replicas grow" in f.title
        assert "cache_aware" in f.remedy
    else:
        assert policy == "passthrough" and affinity == "first" and f.status == "warn"
        assert "first healthy replica" in f.title and "other 2 stand by" in f.title
    assert set(topospec.POLICIES) == set(kvtopo.KEEPS_PREFIX) | set(kvtopo.SPREADS) | {"passthrough"}


def test_sticky_sessions_keep_a_prefix_on_any_policy():
    p = kv.evaluate(_replicas("round_robin", flags={"sticky-sessions": True}), kv.KvOptions())
    assert p.topology["policy_affinity"] == "keeps"
    f = next(f for f in p.findings if f.id == "kv.topology.policy")
    assert f.status == "info" and f.title.startswith("round_robin with --sticky-sessions: a session's prefix stays")


def test_replicas_without_a_gateway_are_planned_and_say_no_policy():
    dep = _dep(**{"topology": {"replicas": [{"name": "a", "host": "h1", "port": 30000},
                                            {"name": "b", "host": "h2", "port": 30000}]}})
    p = kv.evaluate(dep, kv.KvOptions())
    assert p.topology["gateway"] is None and p.topology["policy_note"] is None
    assert [f.id for f in p.findings if f.id.startswith("kv.topology")] == ["kv.topology.total"]


def test_attention_dp_pools_count_in_the_total():
    dep = _dep(**{"parallelism.attn_dp": 2, "topology": {"replicas": [
        {"name": "a", "host": "h1", "port": 30000}, {"name": "b", "host": "h2", "port": 30000},
        {"name": "c", "host": "h3", "port": 30000}]}})
    p = kv.evaluate(dep, kv.KvOptions())
    tok, mrr = p.result.max_total_num_tokens, p.result.max_running_requests
    assert p.topology["replicas"][0]["pools"] == 2
    assert (p.topology["total"]["kv_tokens"], p.topology["total"]["running_requests"]) == (3 * 2 * tok, 3 * 2 * mrr)


def test_an_unknown_budget_leaves_the_totals_unknown_not_zero():
    dep = _replicas()
    p = kv.evaluate(dep, kv.KvOptions(weights_gib=500))   # more than the GPU: no KV budget
    assert p.result.max_total_num_tokens is None
    assert p.topology["total"]["kv_tokens"] is None and p.topology["replicas"][0]["max_total_num_tokens"] is None
    assert "—" in next(f for f in p.findings if f.id == "kv.topology.total").title


def test_the_cli_table_shows_each_replica_and_the_total(capsys):
    from runbook import cli

    assert cli.main(["kv", "--deployment", str(REPLICAS)]) == 0
    out = capsys.readouterr().out
    assert "replicas (2) behind smg cache_aware at http://gw-01.example.com:8000:" in out
    assert "  r1 http://gpu-01.example.com:30000 GPUs 0,1,2,3,4,5,6,7: max_total_num_tokens 2,019,948" in out
    assert "  total 2 replicas, 16 GPUs: 4,039,896 KV tokens" in out
    assert cli.main(["kv", "--deployment", str(REPLICAS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["topology"]["total"]["kv_tokens"] == 4_039_896 and doc["ranks"] is None


def test_the_notebook_frames_show_replicas_and_ranks():
    p = kv.evaluate(spec.load(REPLICAS), kv.KvOptions())
    f = kv.topology_frame(p)
    assert list(f.index) == ["r1", "r2", "total"] and f.loc["total", "KV tokens"] == 4_039_896
    assert kv.ranks_frame(p) is None
    q = kv.evaluate(_dep(**{"parallelism.tp": 16, "parallelism.nodes": _nodes(2)}), kv.KvOptions())
    r = kv.ranks_frame(q)
    assert list(r["TP ranks"]) == ["0–7", "8–15"] and kv.topology_frame(q) is None


# ---- one server across nodes ----------------------------------------------------------------------------------

def test_tp_across_two_nodes_is_per_gpu_arithmetic_not_multiplied_by_nodes():
    """TP 16 over two 8-GPU nodes: each rank holds 8 GPUs of the pool a 16-GPU host would have (the same per-GPU
    inputs), and the server's pool in tokens is that figure, not twice it."""
    across = kv.evaluate(_dep(**{"parallelism.tp": 16, "parallelism.nodes": _nodes(2)}), kv.KvOptions())
    one_host = kv.evaluate(_dep(**{"parallelism.tp": 16, "hardware.gpu_count": 16}), kv.KvOptions()).result
    assert across.result.max_total_num_tokens == one_host.max_total_num_tokens
    assert across.result.kv_bytes_per_token_per_gpu == one_host.kv_bytes_per_token_per_gpu
    r0, r1 = across.ranks
    assert (r0["node"], r0["address"], r0["gpus"], r0["tp_ranks"], r0["pp_ranks"]) == ("gpu-00", "10.0.0.1", 8, [0, 7], [0, 0])
    assert (r1["node"], r1["gpus"], r1["gpu_ids"], r1["tp_ranks"]) == ("gpu-01", 8, list(range(8)), [8, 15])
    for r in (r0, r1):
        assert r["max_total_num_tokens"] == one_host.max_total_num_tokens
        assert r["max_running_requests"] == one_host.max_running_requests
        assert r["layers"] == [0, 59] and r["kv_bytes_per_token_per_gpu"] == one_host.kv_bytes_per_token_per_gpu
    t = across.ranks_total
    assert (t["nodes"], t["gpus"], t["gpus_per_node"], t["max_total_num_tokens"]) == (2, 16, 8, one_host.max_total_num_tokens)
    assert t["weights_bytes"] == 16 * one_host.weights_bytes_per_gpu
    f = next(f for f in across.findings if f.id == "kv.ranks")
    assert f"one pool of {one_host.max_total_num_tokens:,} tokens" in f.title
    assert "node ranks: one server across 2 nodes, 16 GPUs (TP 16 × PP 1)" in kv.text_table(across)


def test_pp_across_nodes_gives_each_rank_its_stage():
    p = kv.evaluate(_dep(**{"parallelism.tp": 4, "parallelism.pp": 2, "parallelism.nodes": _nodes(4)}), kv.KvOptions())
    got = [(r["pp_ranks"], r["tp_ranks"], r["gpus"], r["layers"]) for r in p.ranks]
    assert got == [([0, 0], [0, 1], 2, [0, 29]), ([0, 0], [2, 3], 2, [0, 29]),
                   ([1, 1], [0, 1], 2, [30, 59]), ([1, 1], [2, 3], 2, [30, 59])]
    cells = {s["index"]: s["cell_bytes"] for s in p.result.stages}
    assert [r["kv_bytes_per_token_per_gpu"] for r in p.ranks] == [int(cells[0])] * 2 + [int(cells[1])] * 2
    assert len({r["max_total_num_tokens"] for r in p.ranks}) == 1   # SGLang all-reduces MIN over PP ranks


def test_plan_for_rank_is_the_ranks_entry_and_refuses_a_rank_the_spec_lacks():
    dep = _dep(**{"parallelism.tp": 16, "parallelism.nodes": _nodes(2)})
    assert kv.plan_for_rank(dep, 1) == kv.evaluate(dep, kv.KvOptions()).ranks[1]
    with pytest.raises(InputError, match=r"node rank 2: .*t\.yaml has 2 node\(s\) under parallelism.nodes \(ranks 0–1\)"):
        kv.plan_for_rank(dep, 2)
    with pytest.raises(InputError, match=r"node rank -1"):
        kv.plan_for_rank(dep, -1)
    one = kv.plan_for_rank(spec.load(), 0)   # one node: rank 0 is the whole server
    assert (one["node"], one["gpus"], one["tp_ranks"], one["max_total_num_tokens"]) == (None, 8, [0, 7], 2_019_948)


@pytest.mark.parametrize("tp, pp, nnodes", [(16, 1, 2), (8, 2, 2), (4, 2, 4), (2, 4, 2), (8, 4, 2), (6, 2, 4),
                                            (2, 2, 4), (1, 8, 4), (4, 1, 4)])
def test_rank_placement_runs_every_rank_once(tp, pp, nnodes):
    assert topospec.placement_problem(tp, pp, nnodes) is None
    pairs = [(p, t) for n in range(nnodes) for pr, tr in [topospec.rank_ranges(tp, pp, nnodes, n)] for p in pr for t in tr]
    assert sorted(pairs) == [(p, t) for p in range(pp) for t in range(tp)]
    assert {len(pairs) // nnodes} == {len(pr) * len(tr) for pr, tr in
                                      (topospec.rank_ranges(tp, pp, nnodes, n) for n in range(nnodes))}


@pytest.mark.parametrize("tp, pp, nnodes, words", [
    (2, 3, 2, "PP rank 2, TP rank 0 would run on no node"),
    (3, 2, 3, "node rank 2 would run PP rank 2, TP rank 0, which do not exist"),
    (2, 6, 4, "would run on no node"),
])
def test_a_placement_sglang_cannot_launch_is_named(tp, pp, nnodes, words):
    assert words in topospec.placement_problem(tp, pp, nnodes)


def test_json_md_names_exactly_the_topology_and_rank_keys():
    """docs/json.md's topology entry: every key it names is in `kv --json` over replicas or nodes, and every key
    there is named."""
    import re

    text = (REPO / "docs" / "json.md").read_text()
    entry = text[text.index("- `kv --json` over a topology:"):]
    entry = entry[:entry.index("\n- `", 3)]
    named = set(re.findall(r"`([a-z_0-9]+)(?:\[\])?`", entry))
    reps = kv.evaluate(spec.load(REPLICAS), kv.KvOptions()).data()
    nodes = kv.evaluate(_dep(**{"parallelism.tp": 16, "parallelism.nodes": _nodes(2)}), kv.KvOptions()).data()
    t = reps["topology"]
    keys = ({"topology", "ranks", "ranks_total"} | set(t) | set(t["replicas"][0]) | set(t["total"]) | set(t["gateway"])
            | set(nodes["ranks"][0]) | set(nodes["ranks_total"]))
    assert keys <= named, keys - named
    assert named - keys <= {"null", "keeps", "spreads", "first"}, named - keys


@pytest.mark.parametrize("what_if, words", [
    ({"tp": 3}, "TP 3 × PP 1 = 3 GPUs is not a multiple of the 2 nodes: SGLang refuses it"),
    ({"tp": 32}, "TP 32 × PP 1 over 2 nodes needs 16 GPUs per node; hardware.gpu_count is 8"),
    ({"tp": 2, "pp": 3}, "TP 2 × PP 3 over 2 nodes: PP rank 2, TP rank 0 would run on no node"),
])
def test_a_what_if_the_nodes_cannot_place_is_a_fail_not_a_table(what_if, words):
    dep = _dep(**{"parallelism.tp": 16, "parallelism.nodes": _nodes(2)})
    p = kv.evaluate(dep, kv.KvOptions(**what_if))
    assert p.ranks is None and p.ranks_total is None
    f = next(f for f in p.findings if f.id == "kv.ranks")
    assert f.status == "fail" and f.title == words
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        kv.plan_for_rank(dep, 0, **what_if)
