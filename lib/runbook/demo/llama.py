"""A real inference engine on CPU for tests and `make demo`: llama.cpp's llama-server serving a tiny
random-weight Llama model with a byte-level BPE tokenizer trained offline.

Nothing is downloaded but from the package registries: llama.cpp's sources come from the
llama-cpp-python sdist on PyPI (target llama-server only, OpenSSL and web UI off); the binary is
cached under .cache/ (runbook.core.paths.cache_dir) keyed by that version. The figures such a model produces come from a tiny CPU
model and say nothing about a deployment.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from runbook.core import oscalls, paths, ports
from runbook.corpus import code_prompts, code_text

LLAMA_CPP_PYTHON = "0.3.36"
CACHE = paths.cache_dir()   # the checkout's .cache/ (the Makefile's LLAMA_SERVER), else $RUNBOOK_CACHE or ~/.cache/runbook
MODEL_VERSION = "tiny-llama-v1"


def llama_server_path(version: str = LLAMA_CPP_PYTHON) -> Path:
    return CACHE / f"llama-server-{version}" / "llama-server"


def build_llama_server(version: str = LLAMA_CPP_PYTHON, jobs: int = 2, log=print) -> Path:
    """Build (once) llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist."""
    exe = llama_server_path(version)
    if exe.is_file():
        return exe
    work = Path(tempfile.mkdtemp(prefix="llama-build-"))
    try:
        log(f"downloading llama-cpp-python {version} sources (sdist) ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(work)], check=True)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tf:
            tf.extractall(work, filter="data")
        src = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = work / "build"
        log("building llama-server (about 4-5 minutes on 2 cores) ...")
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DGGML_NATIVE=OFF"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"], check=True, stdout=subprocess.DEVNULL)
        exe.parent.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        shutil.copy2(build / "bin" / "llama-server", tmp)
        os.replace(tmp, exe)
        return exe
    finally:
        shutil.rmtree(work, ignore_errors=True)


def train_tokenizer(vocab_size: int = 4096):
    """A byte-level BPE (GPT-2 pre-tokenization) trained on this project's code, offline."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = code_text().splitlines() + code_prompts()
    tok.train_from_iterator(corpus, trainer)
    return tok


def write_gguf(path: Path, tok, width: int = 768, layers: int = 6, heads: int = 12, ffn: int = 2048, ctx: int = 4096,
               seed: int = 0) -> Path:
    """A Llama-architecture GGUF with random F16 weights and the given tokenizer."""
    import gguf  # lazy: gguf (~0.14 s) only when the model is written; importers of llama_server_path skip it
    import numpy as np  # lazy: with gguf, only when the model is written

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    eos = vocab["<|endoftext|>"]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("runbook tiny random llama (test model)")
    w.add_context_length(ctx)
    w.add_embedding_length(width)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(width // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float16))

    t("token_embd.weight", len(tokens), width)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{name}.weight", width, width)
        t(f"blk.{i}.ffn_gate.weight", ffn, width)
        t(f"blk.{i}.ffn_up.weight", ffn, width)
        t(f"blk.{i}.ffn_down.weight", width, ffn)
    w.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    t("output.weight", len(tokens), width)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_model(dest: Path | None = None) -> Path:
    """Directory with model.gguf and tokenizer.json (cached)."""
    d = dest or CACHE / MODEL_VERSION
    if (d / "model.gguf").is_file() and (d / "tokenizer.json").is_file():
        return d
    d.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    tok.save(str(d / "tokenizer.json"))
    tmp = d / "model.gguf.tmp"
    write_gguf(tmp, tok)
    os.replace(tmp, d / "model.gguf")
    return d


@dataclass
class LlamaServer:
    proc: subprocess.Popen
    url: str
    model_dir: Path
    log: Path
    collisions: list[ports.Collision] = field(default_factory=list)   # start-ups that lost their port first

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *a) -> None:
        self.stop()


class Exited(RuntimeError):
    """llama-server exited during start-up; `log` is its log."""

    def __init__(self, msg: str, log: Path) -> None:
        super().__init__(msg)
        self.log = log


def start_llama_server(exe: Path | None = None, model_dir: Path | None = None, port: int | None = None,
                       parallel: int = 8, ctx: int = 4096, threads: int = 1, cache_prompt: bool = False,
                       log_path: Path | None = None, ready_timeout: float = 60.0,
                       extra_args: Sequence[str] = (), relaunch: int = ports.RELAUNCHES) -> LlamaServer:
    """Start llama-server on loopback and wait until /health answers 200 (`extra_args`: e.g. --jinja for tools).
    Its port taken before it bound it: started again on a free port, at most `relaunch` times (`srv.collisions`)."""
    exe = exe or build_llama_server()
    model_dir = model_dir or tiny_model()
    log = log_path or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])

    def once(port: int) -> LlamaServer:
        cmd = [str(exe), "-m", str(model_dir / "model.gguf"), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-np", str(parallel), "-c", str(ctx * parallel), "--metrics", "--alias", "tiny-llama"]
        if not cache_prompt:
            cmd += ["--no-cache-prompt", "--cache-ram", "0"]
        cmd += list(extra_args)
        with open(log, "w") as logf:   # the child keeps its own copy of the descriptor
            # in a session of its own, SIGKILLed by the kernel if this process dies (a killed test run left it behind)
            proc = oscalls.SessionChild(cmd[0], cmd, logf.fileno(), os.environ).proc
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Exited(f"llama-server exited with {proc.returncode}; see {log}", log)
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return LlamaServer(proc, url, model_dir, log)
            except OSError:
                pass
            time.sleep(0.1)
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"llama-server not ready within {ready_timeout:.0f} s; see {log}")

    def failed_log(e: BaseException) -> str | None:
        return e.log.read_text(errors="replace") if isinstance(e, Exited) and e.log.is_file() else None

    def keep(c: ports.Collision) -> None:     # the lost attempt's log beside the next one's
        if c.relaunched_on is not None:
            with contextlib.suppress(OSError):
                os.replace(log, log.with_name(f"{log.stem}.port{c.port}{log.suffix}"))

    try:
        srv, collisions = ports.relaunching(once, port or ports.free_port(), failed_log=failed_log, attempts=relaunch,
                                            on_collision=keep)
    except ports.PortsTaken as e:
        raise RuntimeError(f"llama-server was not started: {e}") from None
    srv.collisions = collisions
    return srv


def main(argv: list[str] | None = None) -> int:
    """`python -m runbook.demo build|serve`: build llama-server, or serve the tiny model on it (`runbook`, the whole
    runbook on SGLang, is demo/runbook.py's: demo/__main__.py dispatches)."""
    args = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m runbook.demo")
    ap.add_argument("action", choices=["build", "serve"])
    ap.add_argument("--port", type=int)
    a = ap.parse_args(args)
    log = lambda m: print(f"demo: {m}", file=sys.stderr, flush=True)  # noqa: E731
    exe = build_llama_server(log=log)
    model = tiny_model()
    if a.action == "build":
        log(f"llama-server at {exe}; tiny model at {model}")
        return 0
    srv = start_llama_server(exe, model, a.port, extra_args=["--jinja"],   # --jinja: tools for the tool-call probe
                             relaunch=0 if a.port else ports.RELAUNCHES)   # a port asked for is kept or refused
    log(f"llama-server {srv.url} serving a tiny random-weight CPU model (figures say nothing about a deployment); "
        "Ctrl-C to stop")
    return oscalls.serve_until_signalled(srv.proc, srv.stop)


if __name__ == "__main__":
    sys.exit(main())
