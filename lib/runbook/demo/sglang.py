"""The real SGLang server on CPU, as an engine the project starts: tests (the `sglang` marker) and the demo.

The serving interpreter (`make serving-env` -> .venv-serving) runs SGLang's own `sglang.launch_server` on CPU
torch, started as the demo spec's systemd unit would start it (deployments/tiny-llama-sglang-cpu.yaml: its
flags are what runs SGLang on CPU; docs/testing.md, "The SGLang CPU engine"). The model is a tiny HF-format
Llama built here, deterministically and offline: random weights from transformers' own `LlamaForCausalLM` (run
in the serving interpreter, which has torch), a byte-level BPE tokenizer trained on this project's code (the
one llama-server's demo model uses) and a chat template that renders tools. Cached under .cache/. Its figures
come from a tiny CPU model and say nothing about a deployment.

A server is started in its own session, on a port checked free before launch, with its log kept; a start-up
whose port another process took meanwhile is started again on a free port (core/ports.py: `srv.collisions`); stopping it
sends SIGTERM to the server, SIGKILL to what is left of its session once it has exited (or after the timeout), and
returns when none of it is left (core/oscalls.py `SessionChild`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.core import SGLANG_VERSION, oscalls, paths, ports
from runbook.core import spec as specmod
from runbook.core.errors import RunbookError
from runbook.core.spec import Deployment
from runbook.demo import realmodel
from runbook.demo.llama import train_tokenizer
from runbook.endpoint.reach import fetch_json
from runbook.service import build

MODEL_VERSION = "tiny-llama-hf-v1"
SERVED_NAME = "tiny-llama"
MAKE_TARGET = "make serving-env"
# Another SGLang 0.5.x beside .venv-serving (`make serving-canary`, sharing its packages): tune's upgrade canary on CPU.
CANARY_VENV = ".venv-serving-canary"
CANARY_SGLANG_VERSION = "0.5.20"     # the newest 0.5.x below SGLANG_VERSION that serves on CPU with its packages
CANARY_MAKE_TARGET = "make serving-canary"

# The demo deployment: SGLang's flags for CPU (docs/testing.md, "The SGLang CPU engine"), the tiny model, the
# serving interpreter; paths relative to the spec file.
SPEC_FILE = "tiny-llama-sglang-cpu.yaml"
# For servers started while siblings load (tune's candidates, a fleet's replicas). On CPU SGLang budgets its pool from
# the host's free memory before and after loading the weights; another process allocating in between leaves "no memory
# for the KV cache" when free memory fell by more than the fraction (seen: 0.033 needed at 0.02, 0.053 at 0.05, two
# replicas loading together). 0.1 tolerates twice the worst seen; the token cap keeps each pool small (128 MiB).
BESIDE_SIBLINGS: dict[str, Any] = {"mem-fraction-static": 0.1, "max-total-tokens": 65536}

# 4 layers, 2 KV heads of 64: 2,048 B of BF16 KV per token; about 4.5 M parameters.
MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# Hermes/Qwen-style: tools listed in the system turn, calls as <tool_call>{json}</tool_call> (what SGLang's
# `qwen25` tool-call parser reads), tool results as `tool` turns.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions. Function signatures:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each call return <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if not (tools and loop.first and m.role == 'system') %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% if m.content %}{{ m.content }}
{% endif %}
{%- for tc in m.tool_calls %}<tool_call>{"name": {{ tc.function.name | tojson }}, "arguments": \
{{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}}</tool_call>
{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>tool
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content if m.content is string else m.content | map(attribute='text') | join('') }}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Run in the serving interpreter (argv[1]: a JSON job): transformers writes the checkpoint and tokenizer files.
_BUILD = """
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
job = json.loads(sys.argv[1])
torch.manual_seed(job["seed"])
cfg = LlamaConfig(**job["config"], bos_token_id=job["eos_id"], eos_token_id=job["eos_id"], pad_token_id=job["eos_id"])
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.generation_config.do_sample = False
model.save_pretrained(job["dir"])
tok = PreTrainedTokenizerFast(tokenizer_file=job["tokenizer"], eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                              pad_token="<|endoftext|>", model_max_length=job["config"]["max_position_embeddings"])
tok.chat_template = job["chat_template"]
tok.save_pretrained(job["dir"])
"""


class EngineError(RunbookError):
    """SGLang could not be started, or stopped, as asked."""


class Exited(EngineError):
    """SGLang exited during start-up; `log` is its log."""

    def __init__(self, msg: str, log: Path) -> None:
        super().__init__(msg)
        self.log = log


def exited_log(e: BaseException) -> str | None:
    """The log of a server that exited during start-up (`Exited`), for core/ports.py `relaunching` to read whether
    it lost its port; None for any other failure."""
    return e.log.read_text(errors="replace") if isinstance(e, Exited) and e.log.is_file() else None


def serving_python() -> Path:
    """The interpreter that runs SGLang: $RUNBOOK_SERVING_PYTHON (set by `make test`), else the demo spec's
    (the checkout's .venv-serving)."""
    env = os.environ.get("RUNBOOK_SERVING_PYTHON")
    if env:
        return Path(env)
    src = spec_path()
    return _beside(src, specmod.load(src).serving.python)


def canary_python() -> Path:
    """The upgrade canary's interpreter in this checkout (`make serving-canary`); it may not be built."""
    return Path(os.path.abspath((paths.repo_root() or Path.cwd()) / CANARY_VENV / "bin" / "python"))


def _beside(spec_file: Path, p: str) -> Path:
    """A spec path made absolute against the spec's folder. os.path.abspath, not resolve(): a venv's
    bin/python is a link that must not be followed out of the venv."""
    return Path(os.path.abspath(spec_file.parent.absolute() / p))


def check_engine(python: Path | None = None, timeout: float = 60.0) -> str:
    """SGLang's version in the serving interpreter; an EngineError (one line: the interpreter, the make target)
    when it is missing, broken or another version."""
    py = Path(python or serving_python())
    fix = f"build it with `{MAKE_TARGET}`"
    if not (py.is_file() and os.access(py, os.X_OK)):
        raise EngineError(f"SGLang's serving interpreter {py} is not there; {fix}")
    try:
        cp = subprocess.run([str(py), "-c", "import torch, sglang.version as v; print(v.__version__)"],
                            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EngineError(f"SGLang in {py} did not import within {timeout:.0f} s; {fix}") from None
    except OSError as e:
        raise EngineError(f"SGLang's serving interpreter {py} does not run ({e.strerror}); {fix}") from None
    if cp.returncode:
        last = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
        raise EngineError(f"SGLang does not import in {py} ({last}); {fix}")
    version = cp.stdout.strip()
    if version != SGLANG_VERSION:
        raise EngineError(f"{py} has SGLang {version}, this runbook follows {SGLANG_VERSION}; {fix}")
    return version


def tiny_model(dest: Path | None = None, python: Path | None = None, timeout: float = 300.0) -> Path:
    """The tiny HF-format Llama (config.json, model.safetensors, tokenizer files with the chat template), built
    once and cached: the same bytes for the same versions, from a fixed seed."""
    d = Path(dest or paths.cache_dir() / MODEL_VERSION)
    if (d / "model.safetensors").is_file() and (d / "tokenizer_config.json").is_file():
        return d
    py = Path(python or serving_python())
    check_engine(py)
    d.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{d.name}-", dir=d.parent))   # same filesystem: the rename is atomic
    try:
        tok = train_tokenizer(MODEL_CONFIG["vocab_size"])
        tok_file = work / "trained-tokenizer.json"
        tok.save(str(tok_file))
        job = {"dir": str(work), "tokenizer": str(tok_file), "config": MODEL_CONFIG, "seed": 0,
               "eos_id": tok.token_to_id("<|endoftext|>"), "chat_template": CHAT_TEMPLATE}
        try:
            cp = subprocess.run([str(py), "-c", _BUILD, json.dumps(job)], capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise EngineError(f"building the tiny model with {py} took over {timeout:.0f} s") from None
        if cp.returncode:
            last = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
            raise EngineError(f"building the tiny model with {py} failed: {last}")
        tok_file.unlink()
        work.chmod(0o755)                       # mkdtemp's 0700 would hide the model from other users
        try:
            os.rename(work, d)
        except OSError:
            if not (d / "model.safetensors").is_file():   # not another builder winning the race
                raise
        return d
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_model(model_dir: Path, python: Path) -> Path:
    """The model a demo deployment names, built once when it is missing: the real model (runbook.demo.realmodel) at
    its own place, the tiny random one anywhere else (a checkpoint already there is served as it is)."""
    if realmodel.is_real_model(model_dir):
        return realmodel.build(model_dir.parent, python=python) / realmodel.HF
    return tiny_model(model_dir, python=python)


def log_tail(path: Path, lines: int = 5) -> str:
    """The log's last lines on one line (' | ' between them), for a one-line error."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    got = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(got) or "(empty log)"


def _end_of(path: Path, size: int = 64 << 10) -> str:
    """The last `size` bytes of a log, as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


@dataclass
class SGLangServer:
    child: oscalls.SessionChild
    url: str
    port: int
    argv: list[str]
    model_dir: Path
    log: Path
    spec: Deployment
    launched: float = 0.0                                   # time.monotonic() at launch
    startup_s: float = 0.0                                  # launch -> /health 200
    collisions: list[ports.Collision] = field(default_factory=list)   # start-ups that lost their port first

    @property
    def proc(self) -> subprocess.Popen:
        return self.child.proc

    @property
    def pid(self) -> int:
        return self.child.pid

    def pids(self) -> list[int]:
        """The live processes of its session (its own process group): the server, its scheduler and detokenizer."""
        return oscalls.group_pids(self.pid)

    def server_info(self, timeout: float = 10.0) -> dict[str, Any]:
            return fetch_json(self.url + "/server_info", timeout=timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the server (it stops its scheduler and detokenizer itself); SIGKILL to its group after `timeout`
        and to any straggler once it has exited; returns when none of the group is left. Idempotent."""
        self.child.stop(timeout, signal.SIGTERM)

    def __enter__(self) -> SGLangServer:
        return self

    def __exit__(self, *a: object) -> None:
        self.stop()


def spec_path() -> Path:
    return paths.default_deployment().parent / SPEC_FILE


def deployment(port: int = 30000, python: Path | None = None, model_dir: Path | None = None,
               flags: Mapping[str, Any] | None = None, source: Path | None = None) -> Deployment:
    """The demo spec with absolute paths (the serving interpreter, the cached model), `port`, and `flags`
    changed (None removes one)."""
    src = Path(source or spec_path())
    dep = specmod.load(src)
    py = Path(python) if python else Path(os.environ.get("RUNBOOK_SERVING_PYTHON") or _beside(src, dep.serving.python))
    model = Path(model_dir) if model_dir else _beside(src, dep.model.path)
    new_flags = {k: v for k, v in {**dep.serving.flags, **(flags or {})}.items() if v is not None}
    serving = dep.serving.model_copy(update={"python": str(py), "port": port, "flags": new_flags})
    return dep.model_copy(update={"serving": serving, "model": dep.model.model_copy(update={"path": str(model)})})


def launch_argv(dep: Deployment) -> list[str]:
    """The rendered unit's ExecStart, as systemd parses it back (runbook.service)."""
    return list(build(dep).unit.argv)


def start(dep: Deployment | None = None, *, port: int | None = None, flags: Mapping[str, Any] | None = None,
          log_path: Path | None = None, ready_timeout: float = 240.0, env: Mapping[str, str] | None = None,
          argv: Sequence[str] | None = None, host_free_gib: float | None = None,
          relaunch: int = ports.RELAUNCHES) -> SGLangServer:
    """Start SGLang on CPU as the deployment's unit would (`dep`, else the demo spec on `port` with `flags`
    changed) and wait, at most `ready_timeout`, until /health answers 200. `argv`: another command line
    serving on the deployment's port (e.g. one read back from an installed unit). `host_free_gib`: the free
    memory SGLang reads from the host, pinned (pinned_meminfo) so that its pool follows from known inputs.
    A start-up whose port was taken meanwhile runs again on a free port, at most `relaunch` times (never with
    `argv`, whose port is its own): `srv.spec` and `srv.url` are then the new port's, `srv.collisions` says why."""
    if dep is None:
        dep = deployment(port or ports.free_port(), flags=flags)
    base = dep

    def once(p: int) -> SGLangServer:
        d = base if p == base.serving.port else base.model_copy(
            update={"serving": base.serving.model_copy(update={"port": p})})
        srv = launch(d, log_path=log_path, env=env, argv=argv, host_free_gib=host_free_gib)
        try:
            wait_ready(srv, ready_timeout)
        except BaseException as e:
            srv.stop(5.0 if isinstance(e, Exited) else 30.0)    # one that lost its port hangs in its shutdown: kill it soon
            raise
        return srv

    def keep(c: ports.Collision) -> None:     # the lost attempt's log beside the next one's
        if log_path is not None and c.relaunched_on is not None:
            with contextlib.suppress(OSError):
                os.replace(log_path, log_path.with_name(f"{log_path.stem}.port{c.port}{log_path.suffix}"))

    try:
        srv, collisions = ports.relaunching(once, dep.serving.port, failed_log=exited_log, host=dep.serving.host,
                                            attempts=0 if argv is not None else relaunch, on_collision=keep)
    except ports.PortsTaken as e:
        raise EngineError(f"SGLang was not started: {e}") from None
    srv.collisions = collisions
    return srv


def launch(dep: Deployment | None = None, *, port: int | None = None, flags: Mapping[str, Any] | None = None,
           log_path: Path | None = None, env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None,
           host_free_gib: float | None = None) -> SGLangServer:
    """start() without the wait: the server is starting when this returns (wait_ready, stop)."""
    if dep is None:
        dep = deployment(port or ports.free_port(), flags=flags)
    port = dep.serving.port
    if not oscalls.port_free(dep.serving.host, port):   # TIME_WAIT is free: SGLang binds with SO_REUSEADDR
        who = ports.held_by(port)
        raise EngineError(f"port {port} on {dep.serving.host} is in use" + (f" (held by {who})" if who else "") +
                          "; SGLang was not started (pick another port)")
    py = Path(dep.serving.python)
    check_engine(py)
    ensure_model(Path(dep.model.path), py)
    cmd = list(argv) if argv is not None else launch_argv(dep)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="sglang-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    if host_free_gib is not None:
        cmd = pinned_meminfo(cmd, host_free_gib, log_path.with_suffix(".meminfo"))
    run_env = dict(os.environ, PYTHONUNBUFFERED="1", **dep.serving.env, **(env or {}))
    run_env.pop("PYTHONPATH", None)             # the runbook's lib/ is no business of the server's
    exe = shutil.which(cmd[0], path=run_env.get("PATH")) or cmd[0]    # the shim execs a path; Popen searched PATH
    with open(log_path, "w") as logf:           # the child keeps its own copy of the descriptor
        # SIGTERM rather than SIGKILL when this process dies, however it dies (a test run killed, `serve` stopped):
        # SGLang then still stops its scheduler and detokenizer, and nothing of its session is left behind
        child = oscalls.SessionChild(exe, cmd, logf.fileno(), run_env, death_signal=signal.SIGTERM)
    return SGLangServer(child, dep.serving.local_url, port, cmd, Path(dep.model.path), log_path, dep,
                        launched=time.monotonic())


def pinned_meminfo(cmd: Sequence[str], free_gib: float, path: Path) -> list[str]:
    """`cmd` in a mount namespace of its own where /proc/meminfo says `free_gib` are available. On CPU SGLang sizes
    its pool from the host's available memory (psutil, /proc/meminfo's MemAvailable), which other processes move
    from one reading to the next; pinned, the pool follows from known inputs. Needs root (CAP_SYS_ADMIN), as the
    tests run; `unshare` execs the command, so the server keeps the PID it was started with."""
    if not shutil.which("unshare"):
        raise EngineError("pinning the free memory SGLang sees needs util-linux's unshare, which is not on PATH")
    lines = Path("/proc/meminfo").read_text().splitlines()
    kib = int(free_gib * 2**20)
    if kib * 1024 != int(free_gib * 2**30):
        raise EngineError(f"host_free_gib {free_gib} is not a whole number of KiB (/proc/meminfo counts kB)")
    path.write_text("\n".join(f"MemAvailable:   {kib} kB" if ln.startswith("MemAvailable:") else ln for ln in lines) + "\n")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /proc/meminfo && exec "$@"', str(path), *cmd]


def wait_ready(srv: SGLangServer, timeout: float = 240.0) -> None:
    """Until /health answers 200 (then srv.startup_s is set), at most `timeout`; the server exiting first, or the
    time running out, is an EngineError with the end of its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        how = srv.child.exited()    # not Popen.poll: a reaped leader's group is no longer stop()'s to kill
        if how is not None:
            raise Exited(f"SGLang {how} during start-up ({srv.log}): {log_tail(srv.log)}", srv.log)
        lost = ports.bind_line(_end_of(srv.log))
        if lost is not None:      # SGLang logs Errno 98, then hangs in its shutdown ("Waiting for application shutdown")
            raise Exited(f"SGLang could not bind its port during start-up ({srv.log}): {lost}", srv.log)
        try:
            with urllib.request.urlopen(srv.url + "/health", timeout=5) as r:
                if r.status == 200:
                    srv.startup_s = time.monotonic() - srv.launched
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise EngineError(f"SGLang not ready within {timeout:.0f} s ({srv.log}): {log_tail(srv.log)}")


def main(argv: list[str] | None = None) -> int:
    """`python -m runbook.demo.sglang build|serve`: build the demo's model, or serve it until Ctrl-C; `--deployment`
    picks the demo spec (deployments/smollm2-sglang-cpu.yaml: the real model)."""
    ap = argparse.ArgumentParser(prog="python -m runbook.demo.sglang")
    ap.add_argument("action", choices=["build", "serve"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--deployment", type=Path, help="a demo spec (default: deployments/" + SPEC_FILE + ")")
    a = ap.parse_args(argv)
    flags = {"mem-fraction-static": a.mem_fraction_static} if a.mem_fraction_static else None
    try:
        dep = deployment(a.port or ports.free_port(), flags=flags, source=a.deployment)
        if a.action == "build":
            version = check_engine(Path(dep.serving.python))
            model = ensure_model(Path(dep.model.path), Path(dep.serving.python))
            print(f"model at {model}; SGLang {version} in {dep.serving.python}", file=sys.stderr)
            return 0
        srv = start(dep, relaunch=0 if a.port else ports.RELAUNCHES)    # a port asked for is kept or refused
    except RunbookError as e:
        print(f"sglang: {e}", file=sys.stderr)
        return 2
    print(f"SGLang {srv.url} ready in {srv.startup_s:.0f} s (log {srv.log}); Ctrl-C to stop", file=sys.stderr)
    return oscalls.serve_until_signalled(srv.proc, srv.stop)


if __name__ == "__main__":
    raise SystemExit(main())
