"""A recorded reference: what the reference server said of the corpus windows (its top-k per position and the tail
bucket) and its noise floors, in one safetensors file, so that a candidate is compared with it one server at a time
(llama.cpp's `llama-perplexity --kl-divergence-base FILE`). One 8-GPU host holds one copy of a 397B model: the
reference (BF16 KV) is recorded, the unit changed, and the candidate compared with the file on the same port.

The file: tensors `w{i}.ids` (int32), `w{i}.actual` and `w{i}.top_lp` (float32: SGLang's logprobs are float32, so
nothing is rounded), `w{i}.top_ids` (int32) per window, and each floor's per-window sums `floor.{name}.{kld,
same_top1,count}` (float64: what the paired bootstrap resamples); its metadata `runbook.record` (JSON: the format, who
made it, the floors' statistics) and `sha256` over all of it. No pickles: safetensors holds raw arrays and a JSON
header. `read` refuses, in one line, a file it cannot trust (truncated, tampered, newer); `refusal` a record made
with another model, tokenizer, corpus or window shape than the comparison at hand."""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook import __version__
from runbook.accuracy import kld
from runbook.core.errors import InputError
from runbook.core.fsutil import FileRefused, atomic_write_bytes, read_regular
from runbook.corpus import VERSION as CORPUS_VERSION

if TYPE_CHECKING:
    import numpy as np

FORMAT = 1
MAX_BYTES = 4 << 30             # 8 windows × 32k tokens at top-20 is ~42 MB; a file far above is not a record
META, DIGEST = "runbook.record", "sha256"
_REMEDY = "record the reference again (runbook accuracy record)"
# what must match between a record and a comparison, with the setting that fixes a mismatch
SHAPE = (("windows", "kld_windows"), ("window_tokens", "kld_window_tokens"), ("top_k", "kld_top_k"))


@dataclass
class Reference:
    """What the reference said while it served: its scores of the windows and the noise floors."""
    url: str
    scores: list[kld.Scores]
    floors: dict[str, kld.KldResult]     # second_pass (or a restart: floor_url), batch (its windows N at once)

    @property
    def floor_used(self) -> str:
        # the largest; a tie by name, so a record read back names the floor its maker named (file order is not kept)
        return max(sorted(self.floors), key=lambda k: self.floors[k].overall["kld_mean"])


@dataclass
class Record:
    path: Path
    reference: Reference
    made: dict[str, Any]          # who made it: model, corpus, window shape, server, host, date
    sha256: str
    bytes: int


def _file_sha(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def model_identity(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint as files: its path and the SHA-256 of config.json, tokenizer.json and the weights index (of the
    single model.safetensors where there is no index); None for a file that is not there."""
    d = Path(model_dir).resolve()
    index = d / "model.safetensors.index.json"
    weights = index if index.is_file() else d / "model.safetensors"
    return {"path": str(d), "config_sha256": _file_sha(d / "config.json"), "tokenizer_sha256": _file_sha(d / "tokenizer.json"),
            "weights": weights.name, "weights_sha256": _file_sha(weights)}


def made_by(model: dict[str, Any], server: dict[str, Any] | None, windows: int, window_tokens: int, top_k: int,
            chunk: int, url: str) -> dict[str, Any]:
    """Who made a record: the model, the corpus and the window shape, the reference server's /server_info (its
    version, KV dtype and every argument that can change tokens; live state left out), the host and the date."""
    info = {k: v for k, v in (server or {}).items() if k != "internal_states"}
    return {"model": model, "corpus_version": CORPUS_VERSION, "windows": windows, "window_tokens": window_tokens,
            "top_k": top_k, "chunk": chunk, "url": url, "server_info": info or None, "host": socket.gethostname(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "runbook": __version__}


def _floor_json(r: kld.KldResult) -> dict[str, Any]:
    return {"windows": r.windows, "window_tokens": r.window_tokens, "top_k": r.top_k, "buckets": [list(b) for b in r.buckets],
            "overall": r.overall, "by_depth": r.by_depth}


def _tensors(ref: Reference) -> dict[str, np.ndarray]:
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    out: dict[str, np.ndarray] = {}
    for i, s in enumerate(ref.scores):
        out |= {f"w{i}.ids": s.ids.astype(np.int32), f"w{i}.actual": s.actual.astype(np.float32),
                f"w{i}.top_ids": s.top_ids.astype(np.int32), f"w{i}.top_lp": s.top_lp.astype(np.float32)}
    for name, r in ref.floors.items():
        out |= {f"floor.{name}.{k}": np.ascontiguousarray(v, dtype=np.float64) for k, v in r.sums.items()}
    return out


def _digest(meta: str, tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 over the metadata JSON and every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256(meta.encode())
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write(path: str | os.PathLike, ref: Reference, made: dict[str, Any]) -> Record:
    """The record, written atomically (a temp file beside it, then a rename: a record already there survives a
    failed write); InputError naming the path when it cannot be written."""
    from safetensors.numpy import save  # lazy: safetensors only when a record is written or read

    p = Path(path)
    if p.is_dir():
        raise InputError(f"--record {p}: is a directory; give a file path, e.g. --record {p / 'reference.safetensors'}")
    tensors = _tensors(ref)
    meta = json.dumps({"format": FORMAT, "made": made, "floors": {k: _floor_json(v) for k, v in ref.floors.items()}},
                      sort_keys=True, default=str)
    digest = _digest(meta, tensors)
    raw = save(tensors, metadata={META: meta, DIGEST: digest})
    try:
        atomic_write_bytes(p, raw)
    except OSError as e:
        raise InputError(f"--record {p}: cannot write there ({e.strerror or e}); give a path in a directory you can write") from None
    return Record(p, ref, made, digest, len(raw))


def _bad(p: Path, why: str) -> InputError:
    return InputError(f"--record {p}: {why}; {_REMEDY}")


def read(path: str | os.PathLike) -> Record:
    """A record as written; InputError in one line for a file that is missing, not a record, truncated, tampered
    with or of a newer format."""
    from safetensors import SafetensorError  # lazy: safetensors only when a record is written or read
    from safetensors.numpy import load  # lazy: safetensors only when a record is written or read

    p = Path(path)
    try:
        raw = read_regular(p, MAX_BYTES, what="a reference record")
    except FileNotFoundError as e:
        raise InputError(f"--record {p}: {e.strerror or e}; give the file `runbook accuracy record` wrote") from None
    except FileRefused as e:
        raise _bad(p, e.reason) from None
    n = int.from_bytes(raw[:8], "little") if len(raw) >= 8 else -1
    try:
        if not 0 < n <= len(raw) - 8:
            raise ValueError("truncated")
        header = json.loads(raw[8:8 + n])
        tensors = load(raw)
    except (SafetensorError, ValueError, RecursionError, OSError):
        raise _bad(p, f"not a readable safetensors file ({len(raw):,} bytes: truncated or not a record)") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get(META), str) or not isinstance(metadata.get(DIGEST), str):
        raise _bad(p, f"a safetensors file without the {META!r} metadata: not a reference record")
    try:
        doc = json.loads(metadata[META])
    except (ValueError, RecursionError):
        raise _bad(p, f"its {META!r} metadata is not JSON") from None
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if isinstance(fmt, int) and fmt > FORMAT:
        raise InputError(f"--record {p}: record format {fmt} is newer than this runbook reads ({FORMAT}); upgrade the "
                         "runbook, or record the reference again with this one")
    if _digest(metadata[META], tensors) != metadata[DIGEST]:
        raise _bad(p, "its content does not match the SHA-256 it was written with: changed after it was written")
    if fmt != FORMAT:
        raise _bad(p, f"record format {fmt!r} is not one this runbook reads ({FORMAT})")
    try:
        return Record(p, Reference(str(doc["made"].get("url", "")), _scores(tensors), _floors(doc["floors"], tensors)),
                      doc["made"], metadata[DIGEST], len(raw))
    except (KeyError, TypeError, ValueError, AttributeError, InputError) as e:
        raise _bad(p, f"its content is not a reference's scores ({e})") from None


def _scores(t: dict[str, np.ndarray]) -> list[kld.Scores]:
    out: list[kld.Scores] = []
    while f"w{len(out)}.ids" in t:
        w = f"w{len(out)}."
        s = kld.Scores(t[w + "ids"].astype("int64"), t[w + "actual"], t[w + "top_ids"].astype("int64"), t[w + "top_lp"])
        kld.check_scores(s, f"window {len(out)}")
        out.append(s)
    if not out:
        raise ValueError("no windows")
    return out


def _floors(doc: dict[str, Any], t: dict[str, np.ndarray]) -> dict[str, kld.KldResult]:
    return {name: kld.KldResult(f["windows"], f["window_tokens"], f["top_k"], [(int(a), int(b)) for a, b in f["buckets"]],
                                f["overall"], f["by_depth"], {k: t[f"floor.{name}.{k}"] for k in ("kld", "same_top1", "count")})
            for name, f in doc.items()}


def refusal(rec: Record, model: dict[str, Any], shape: dict[str, int], explicit: set[str]) -> str | None:
    """Why this record cannot be compared with this run, in one line, or None. model: `model_identity` of this run's
    checkpoint; shape: this run's windows, window_tokens and top_k, which must match where `explicit` names the
    setting (else the record's shape is used)."""
    made = rec.made
    where = f"--record {rec.path}"
    if made.get("corpus_version") != CORPUS_VERSION:
        return (f"{where}: recorded on corpus {made.get('corpus_version')}, this runbook has {CORPUS_VERSION}: the windows "
                f"differ; {_REMEDY}")
    was = made.get("model") or {}
    for key, what in (("tokenizer_sha256", "tokenizer.json"), ("config_sha256", "config.json"), ("weights_sha256", "weights")):
        if was.get(key) and model.get(key) and was[key] != model[key]:
            return (f"{where}: recorded with another {what} (SHA-256 {was[key][:12]}…, this run's {model.get('path')}: "
                    f"{model[key][:12]}…): another model; give that model's record, or {_REMEDY}")
    for key, setting in SHAPE:
        if setting in explicit and shape.get(key) != made.get(key):
            return (f"{where}: recorded with {key} {made.get(key)}, this run asks for {shape.get(key)}: drop "
                    f"--{setting.replace('_', '-')} (the record's shape is used), or record that shape")
    return None


def server_refusal(rec: Record, server: dict[str, Any] | None) -> str | None:
    """Why the server at hand is not one to compare with this record (it serves another model), or None; a server
    without /server_info (None) is not checked here: the ids it echoes are."""
    where = f"--record {rec.path}"
    ref_model = (rec.made.get("server_info") or {}).get("model_path")
    live_model = (server or {}).get("model_path")
    if ref_model and live_model and Path(str(ref_model)).name != Path(str(live_model)).name:
        return (f"{where}: recorded from a server of {ref_model}, the server compared serves {live_model}: another "
                f"model; compare that model's own record")
    return None
