"""The K and V a real decoder caches, captured on the frozen code corpus and summarized (kvstats), cached by model.

The capture runs transformers on CPU in the serving interpreter (accuracy/kvjob.py, a subprocess; the runbook's own
environment has no torch) and hands its tensors back as an .npz file, read without pickles. The summary is cached
under .cache/kvvalues/, keyed by the model's SHA-256 (config.json and every safetensors file), the corpus version and
the capture's shape, so a second run reads it back in milliseconds.

Every input the capture cannot use is an InputError of one line naming the file and the fix: a missing or truncated
safetensors file, a config.json without the decoder's layer counts, a model dir without tokenizer.json, a serving
interpreter that is missing or has no torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runbook.accuracy import kvstats
from runbook.core import paths
from runbook.core.errors import InputError
from runbook.core.fsutil import atomic_write_json
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.corpus import code_text
from runbook.model import checkpoint
from runbook.model.tokenizer import load_tokenizer

JOB = Path(__file__).with_name("kvjob.py")
JOB_VERSION = "kvvalues-1"       # bump when the capture or the summary changes what it computes
WINDOWS = 4                      # corpus windows: the first half calibrates the scales, the second measures the errors
WINDOW_TOKENS = 1024
LENGTHS = (128, 256, 512, 1024)  # context lengths of the attention-output error
MAX_AUTO_BYTES = 2 << 30         # the deployment's model is captured on CPU unasked only up to 2 GiB of weights
REQUIRED = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")
FIX_ENV = "build the serving environment with `make serving-env` or set RUNBOOK_SERVING_PYTHON"


@dataclass
class Capture:
    model_dir: str
    model_sha256: str
    summary: dict[str, Any]      # kvstats.summarize's keys
    meta: dict[str, Any]         # the job's meta, plus capture_s, stats_s, windows, window_tokens, corpus_version
    cached: bool


def text_config(ck: checkpoint.Checkpoint) -> dict[str, Any]:
    """The decoder's own config: text_config for a multimodal checkpoint, else config.json itself."""
    tc = ck.config.get("text_config")
    return tc if isinstance(tc, dict) else ck.config


def check_model(model_dir: str | os.PathLike) -> checkpoint.Checkpoint:
    """The checkpoint when the capture can run on it; an InputError naming the file and the fix otherwise."""
    ck = checkpoint.load(model_dir)
    cfg_path = ck.dir / "config.json"
    cfg = text_config(ck)
    missing = [k for k in REQUIRED if not isinstance(cfg.get(k), int) or cfg[k] <= 0]
    if missing:
        raise InputError(f"{cfg_path}: no {', '.join(repr(k) for k in missing)} (a decoder's layer and head counts); "
                         "re-download config.json from the model's repository")
    bad = [p for p in ck.problems if p.status == "fail"]
    if bad:
        raise InputError(f"{ck.dir}: {bad[0].title} ({bad[0].detail or bad[0].evidence}); {bad[0].remedy or 'Re-download it.'}")
    if not ck.shards:
        raise InputError(f"{ck.dir}: no *.safetensors weights; the capture needs an HF checkpoint with safetensors files")
    if not (ck.dir / "tokenizer.json").is_file():
        raise InputError(f"{ck.dir}: no tokenizer.json; copy the model's tokenizer.json into the checkpoint dir")
    return ck


def model_name(d: Path) -> str:
    """A checkpoint dir's name for titles: its parent's too when the dir is a generic `hf` or `model` folder."""
    return f"{d.parent.name}/{d.name}" if d.name.lower() in ("hf", "model", "checkpoint") else d.name


def weight_bytes(ck: checkpoint.Checkpoint) -> int:
    return sum(h.file_size for h in ck.shards.values())


def model_sha256(ck: checkpoint.Checkpoint) -> str:
    """SHA-256 over config.json and every safetensors file, in name order (what the capture reads)."""
    h = hashlib.sha256()
    for name in ["config.json", *sorted(ck.shards)]:
        h.update(name.encode() + b"\0")
        with open(ck.dir / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def windows(model_dir: Path, n: int, tokens: int) -> list[list[int]]:
    """n windows of `tokens` token ids of the frozen code corpus, evenly spread over it."""
    tok = load_tokenizer(model_dir, option="model dir")
    ids = tok.encode(code_text()).ids
    if len(ids) < tokens:
        raise InputError(f"corpus {CORPUS_VERSION}: {len(ids)} tokens, fewer than a window of {tokens}; use shorter windows")
    step = (len(ids) - tokens) // max(1, n - 1)
    return [ids[i * step:i * step + tokens] for i in range(n)]


def _cache_key(sha: str, n: int, tokens: int, lengths: tuple[int, ...]) -> str:
    raw = json.dumps([JOB_VERSION, sha, CORPUS_VERSION, n, tokens, list(lengths)])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _run_job(python: str, job: dict[str, Any], timeout: float) -> None:
    py = Path(python)
    if not (py.is_file() and os.access(py, os.X_OK)):
        raise InputError(f"serving interpreter {py}: not there; {FIX_ENV}")
    job_file = Path(job["out"]).with_suffix(".json")
    job_file.write_text(json.dumps(job))
    try:
        cp = subprocess.run([str(py), str(JOB), str(job_file)], capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InputError(f"capturing K/V with {py} took over {timeout:.0f} s; use fewer or shorter windows") from None
    except OSError as e:
        raise InputError(f"serving interpreter {py}: does not run ({e.strerror}); {FIX_ENV}") from None
    if cp.returncode:
        last = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
        raise InputError(last if cp.returncode == 3 else f"capturing K/V with {py} failed: {last[:300]}")


def capture(model_dir: str | os.PathLike, python: str, n: int = WINDOWS, tokens: int = WINDOW_TOKENS,
            lengths: tuple[int, ...] = LENGTHS, timeout: float = 1800.0, source: str | None = None) -> Capture:
    """The summary of the model's cached K and V on the corpus, from the cache when the same model, corpus and shape
    were captured before."""
    ck = check_model(model_dir)
    cfg = text_config(ck)
    tokens = min(tokens, int(cfg.get("max_position_embeddings") or tokens))
    lengths = tuple(L for L in lengths if tokens >= L) or (tokens,)
    sha = model_sha256(ck)
    cache = paths.cache_dir() / "kvvalues" / f"{_cache_key(sha, n, tokens, lengths)}.json"
    if cache.is_file():
        try:
            doc = json.loads(cache.read_text())
            return Capture(str(ck.dir), sha, doc["summary"], doc["meta"], True)
        except (OSError, ValueError, KeyError):
            pass                 # a damaged cache entry is recomputed and rewritten
    wins = windows(ck.dir, n, tokens)
    positions = kvstats.query_positions(lengths)
    with tempfile.TemporaryDirectory(prefix="kvvalues-") as tmp:
        out = Path(tmp) / "capture.npz"
        t0 = time.perf_counter()
        _run_job(python, {"model_dir": str(ck.dir), "windows": wins, "query_positions": positions, "out": str(out)}, timeout)
        capture_s = time.perf_counter() - t0
        with np.load(out, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {k: z[k] for k in z.files if k != "meta"}
    t1 = time.perf_counter()
    summary = kvstats.summarize(arrays, meta, positions, lengths, source or f"decoder (real K/V: {model_name(ck.dir)})")
    meta.update({"capture_s": round(capture_s, 2), "stats_s": round(time.perf_counter() - t1, 2), "windows": n,
                 "window_tokens": tokens, "lengths": list(lengths), "corpus_version": CORPUS_VERSION,
                 "job_version": JOB_VERSION, "weight_bytes": weight_bytes(ck)})
    atomic_write_json(cache, {"summary": summary, "meta": meta, "model_sha256": sha})
    return Capture(str(ck.dir), sha, summary, meta, False)

