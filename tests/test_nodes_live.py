"""One SGLang server across two nodes, for real on loopback: the spec's `parallelism.nodes` rendered into one unit
per rank (runbook.service.render), each rank started from its rendered ExecStart and Environment= lines (as
systemd would read them back), TP 2 over two processes with one core each (SGLANG_CPU_OMP_THREADS_BIND per rank,
`parallelism.nodes[i].env`), rank 1 on a port of its own (`parallelism.nodes[i].port`: its /health listener would
take rank 0's port on a shared host). Then rank 0 answers, `runbook verify` reads rank 0's log against the plan,
and `runbook bench` measures through rank 0. One session fixture, a handful of short requests."""
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from runbook.core import ports
from runbook.core import spec as specmod

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "deployments" / "tiny-llama-sglang-cpu.yaml"
POOL = 4096          # --max-total-tokens: with TP on CPU SGLang cannot size a rank's memory itself


def nodes_spec_data(port: int, rank1_port: int, init_port: int) -> dict:
    """The tiny SGLang spec (absolute paths) as two nodes on loopback, one core per rank."""
    from runbook.demo import sglang as demo

    data = yaml.safe_load(TINY.read_text())
    dep = demo.deployment(port)
    data["model"]["path"] = dep.model.path
    data["serving"].update(python=dep.serving.python, port=port)
    # the two ranks load at once on one host, so each sees the other's allocations in its free-memory budget
    data["serving"]["flags"].update(demo.BESIDE_SIBLINGS, **{"max-total-tokens": POOL})
    data["systemd"]["unit_name"] = "runbook-nodes-sglang"
    data["parallelism"] = {"tp": 2, "dist_init_port": init_port, "nodes": [
        {"name": "n0", "address": "127.0.0.1", "env": {"SGLANG_CPU_OMP_THREADS_BIND": "0"}},
        {"name": "n1", "address": "127.0.0.1", "port": rank1_port, "env": {"SGLANG_CPU_OMP_THREADS_BIND": "1"}}]}
    return data


@pytest.fixture(scope="session")
def nodes_server(tmp_path_factory):
    """Ranks 0 and 1 of one TP-2 server, each started from its rendered unit; yields (spec path, spec, rank-0
    server, rank-1 server, the units)."""
    from runbook.demo import sglang as demo
    from runbook.service import unitfile
    from runbook.service.render import render

    d = tmp_path_factory.mktemp("nodes")
    path = d / "nodes.yaml"

    def start(port: int):
        """Both ranks on fresh ports; a rank that failed takes the other down with it, so a relaunch starts clean."""
        path.write_text(yaml.safe_dump(nodes_spec_data(port, ports.free_port(), ports.free_port()), sort_keys=False))
        spec = specmod.load(path)
        units = render(spec)
        servers = []
        try:
            for u in units:
                env = unitfile.environment(unitfile.parse(u.text))       # the unit's Environment= lines, as systemd reads them
                rank_port = int(u.argv[u.argv.index("--port") + 1])
                dep = spec.model_copy(update={"serving": spec.serving.model_copy(update={"port": rank_port, "env": {}})})
                servers.append(demo.launch(dep, argv=u.argv, env=env, log_path=d / f"rank{u.rank}.log"))
            for s in servers:           # rank 1's /health (its stand-in listener) answers once its scheduler is up
                demo.wait_ready(s, 300)
        except BaseException:
            for s in servers:
                s.stop()
            raise
        return spec, units, servers

    # a rank whose port another process took during its start-up: both relaunched on other ports (core/ports.py)
    (spec, units, servers), _ = ports.relaunching(start, ports.free_port(), failed_log=demo.exited_log)
    try:
        yield path, spec, servers[0], servers[1], units
    finally:
        for s in servers:           # rank 0 first: its shutdown stops every TP rank
            s.stop()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _runbook(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runbook", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=dict(os.environ))


def test_each_rank_has_its_own_unit_rank_flags_and_environment(nodes_server):
    _, spec, _, _, units = nodes_server
    assert [(u.unit_name, u.rank) for u in units] == [("runbook-nodes-sglang-n0", 0), ("runbook-nodes-sglang-n1", 1)]
    for u, core in zip(units, ("0", "1"), strict=True):
        flags = {a: u.argv[i + 1] for i, a in enumerate(u.argv[:-1]) if a.startswith("--")}
        assert (flags["--tp-size"], flags["--nnodes"], flags["--node-rank"]) == ("2", "2", str(u.rank))
        assert flags["--dist-init-addr"] == f"127.0.0.1:{spec.parallelism.dist_init_port}"
        assert f'Environment="SGLANG_CPU_OMP_THREADS_BIND={core}"' in u.text or \
            f"Environment=SGLANG_CPU_OMP_THREADS_BIND={core}" in u.text, u.text
    assert units[1].argv[units[1].argv.index("--port") + 1] == str(spec.parallelism.nodes[1].port)


def test_rank0_answers_a_chat_completion_as_one_server_of_two_ranks(nodes_server):
    _, spec, rank0, rank1, _ = nodes_server
    got = _post(rank0.url + "/v1/chat/completions", {"model": "tiny-llama", "max_tokens": 8, "temperature": 0,
                                                     "messages": [{"role": "user", "content": "def add(a, b):"}]})
    assert got["choices"][0]["message"]["content"] is not None and got["usage"]["completion_tokens"] > 0
    info = rank0.server_info()
    assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (2, 2, 0)
    assert info["max_total_num_tokens"] <= POOL
    assert rank0.proc.poll() is None and rank1.proc.poll() is None     # both ranks serve it


def test_verify_reads_rank0_log_against_the_plan(nodes_server):
    path, _, rank0, _, _ = nodes_server
    cp = _runbook("verify", "--deployment", str(path), "--log", str(rank0.log), "--url", rank0.url, "--json")
    doc = json.loads(cp.stdout)
    bad = [(f["id"], f["title"]) for f in doc["findings"] if f["status"] == "fail"]
    assert cp.returncode == 0 and not bad, (cp.returncode, bad, cp.stderr[-2000:])
    assert doc["observed"]["max_total_num_tokens"] == rank0.server_info()["max_total_num_tokens"]


def test_the_plan_for_rank0_is_what_rank0_logged(nodes_server):
    """`runbook kv`'s plan per node rank (kv/topology.py) against rank 0's own start-up log and /server_info."""
    path, _, rank0, _, _ = nodes_server
    kv = json.loads(_runbook("kv", "--deployment", str(path), "--json").stdout)
    ver = json.loads(_runbook("verify", "--deployment", str(path), "--log", str(rank0.log), "--json").stdout)
    r0 = kv["ranks"][0]
    assert (r0["rank"], r0["node"], r0["tp_ranks"]) == (0, "n0", [0, 0]) and kv["ranks_total"]["nodes"] == 2
    kvb = next(r for r in ver["rows"] if r["quantity"] == "kv_bytes_per_token_per_gpu")
    print(f"\nrank 0 plan vs log: pool {r0['max_total_num_tokens']} vs {ver['observed']['max_total_num_tokens']}, "
          f"running {r0['max_running_requests']} vs {ver['observed']['max_running_requests']}, "
          f"KV B/token/GPU {r0['kv_bytes_per_token_per_gpu']} vs {kvb['observed']}")
    assert r0["max_total_num_tokens"] == ver["observed"]["max_total_num_tokens"] == rank0.server_info()["max_total_num_tokens"]
    assert r0["max_running_requests"] == ver["observed"]["max_running_requests"]
    # KV bytes per token are not compared: the log's K and V sizes of a 4,096-token pool of this tiny model round to
    # 0.00 GB, so verify observes none (the plan's figure, 1,024 B: one of the two KV heads per rank, is printed above)


def test_bench_runs_against_rank0(nodes_server, tmp_path):
    path, _, rank0, _, _ = nodes_server
    cp = _runbook("bench", "--deployment", str(path), "--url", rank0.url, "--concurrency", "1,2", "--requests", "4",
                  "--input-len", "64", "--output-len", "8", "--warmup", "0", "--out", str(tmp_path), "--json")
    doc = json.loads(cp.stdout)
    bad = [(f["id"], f["title"]) for f in doc["findings"] if f["status"] == "fail"]
    # exit 1 only for the tiny spec's latency SLO (two ranks of one core each): every request must still be served
    assert cp.returncode == 0 or (cp.returncode == 1 and bad and all(i.startswith("bench.slo") for i, _ in bad)), \
        (cp.returncode, bad, cp.stderr[-2000:])
    levels = doc["levels"]
    print("\n" + "; ".join(f"c{lv['concurrency']}: {lv['output_tok_s']:.1f} tok/s, failed {lv['failed']}" for lv in levels))
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    assert all(lv["failed"] == 0 and lv["output_tok_s"] > 0 for lv in levels), levels
