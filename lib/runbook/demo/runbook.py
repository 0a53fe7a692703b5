"""`python -m runbook.demo runbook` (`make demo`): the whole runbook against the real SGLang server on CPU, then
tune on SGLang's own knobs, then tune on llama-server where it adds something SGLang on CPU has not (GGUF KV cache
types, its n-gram speculative decoding).

1. SGLang (runbook.demo.sglang) serves the real model (runbook.demo.realmodel: SmolLM2-135M-Instruct) on a port of
   its own, and the same model with an FP8 KV cache without scales beside it; every notebook runs on the real
   model's deployment (deployments/smollm2-sglang-cpu.yaml on that port): the plan, the unit, verify on the server's
   own log and /server_info, the benchmark, and accuracy against it with the FP8 server as its A/B candidate.
   Then the story's one-box flow (demo/onebox.py): the reference recorded, the unit changed to the FP8 candidate,
   the server restarted on the same port and compared with the record by a cron-style run (a real Prometheus
   fires the alert), and the rollback compared again (the alert resolves).
2. The servers are stopped (tune takes the deployment's port), and stage 60 launches SGLang candidates for real
   (demo/tune.py: radix cache off, chunked prefill, an FP8 KV cache without scales, a flag SGLang refuses, and the
   same flags on SGLang 0.5.20 where `make serving-canary` built it: the upgrade canary's A/B).
3. Stage 60 on llama-server candidates (its own CPU deployment).

Each `runbook run` archives under --out; the figures come from small CPU models and say nothing about a deployment."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from runbook.cli import main as cli
from runbook.core import paths, ports
from runbook.core import spec as spec_mod
from runbook.core.errors import RunbookError
from runbook.demo import llama as llama_demo
from runbook.demo import onebox, realmodel, sglang
from runbook.demo.tune import write_sglang_spec, write_spec


def _log(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


def run_params(url: str, log: Path, tokenizer: str, candidate: str) -> list[str]:
    """The `runbook run --param`s of the demo's SGLang run: 30/35 check the live server at the spec's address (drift,
    /server_info), 35 reads this start's log; 40 is given the server; 50 judges the candidate beside it (`candidate`:
    the same model with an FP8 KV cache without scales) against it, the reference (accuracy's url is what is judged,
    its compare_url the reference: recall's A/B, greedy identity, the KL divergence). The benchmark's levels and
    lengths are the spec's: a --param reaches every notebook declaring that name (`concurrency` is bench's levels but
    accuracy's batch size); NOTEBOOK.KEY reaches that notebook alone and wins over the plain name there."""
    return ["--param", f"url={url}", "--param", f"log_file={log}", "--param", f"tokenizer={tokenizer}",
            "--param", f"accuracy.url={candidate}", "--param", f"accuracy.compare_url={url}",
            "--param", "lengths=512,1024", "--param", "toolcall_max_tokens=64"]


# The candidate notebook 50 compares with the reference in the demo: the story's configuration.
CANDIDATE_FLAGS = {"kv-cache-dtype": "fp8_e4m3"}


def run(out: str, llama: bool = True) -> int:
    t0 = time.monotonic()
    cache = paths.cache_dir()
    port = ports.free_port()
    spec = write_sglang_spec(cache / "demo-sglang.yaml", port, source=realmodel.spec_path())
    dep = spec_mod.load(spec)             # the server runs what the notebooks check (30's drift, 35's plan)
    log = Path(out) / "demo-sglang-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cand_dep = sglang.deployment(ports.free_port(), source=spec, flags=CANDIDATE_FLAGS)
    try:
        srv = sglang.start(dep, log_path=log)
        try:
            cand = sglang.start(cand_dep, log_path=Path(out) / "demo-sglang-candidate.log")
        except BaseException:
            srv.stop()
            raise
    except RunbookError as e:
        _log(f"SGLang did not start: {e}")
        return 2
    _log(f"SGLang {srv.url} ready in {srv.startup_s:.0f} s (log {log}), and beside it {cand.url} with "
         f"{CANDIDATE_FLAGS}: {realmodel.MODEL_VERSION}, a real 135 M model on CPU")
    box = Path(out) / "onebox"
    box.mkdir(exist_ok=True)
    try:
        code = cli(["run", "--deployment", str(spec), "--out", out, *run_params(srv.url, log, dep.model.path, cand.url)])
        two_server = onebox.summary(Path(out)).get("metrics") or {}
        _log(f"one box: the reference at {srv.url} recorded into {box}")
        recorded, rec = onebox.record(spec, srv.url, box)
    finally:
        cand.stop()
        srv.stop()
    codes = [code, recorded]
    if recorded in (0, 1):
        codes.append(onebox.run(spec, rec, two_server, CANDIDATE_FLAGS, Path(out)))
    # tune is not part of a plain run (it takes the server down): its own run, SGLang candidates on that port
    _log(f"tune on SGLang: {spec} (a launch takes 25-55 s here)")
    codes.append(cli(["run", "--only", "tune", "--deployment", str(spec), "--out", out]))
    if llama:
        exe, model = llama_demo.build_llama_server(log=_log), llama_demo.tiny_model()
        lspec = write_spec(cache / "tune-demo.yaml", exe, model, ports.free_port())
        _log(f"tune on llama-server: {lspec} (GGUF KV cache types, n-gram speculative decoding)")
        codes.append(cli(["run", "--only", "tune", "--deployment", str(lspec), "--out", out]))
    _log(f"done in {time.monotonic() - t0:.0f} s")
    return max((c if c not in (0, 1) else 0) for c in codes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.demo runbook")
    ap.add_argument("--out", default=str(paths.outputs_dir()))
    ap.add_argument("--no-llama", action="store_true", help="leave out the llama-server tune run")
    a = ap.parse_args(argv)
    try:
        return run(a.out, llama=not a.no_llama)
    except KeyboardInterrupt:
        return 130
