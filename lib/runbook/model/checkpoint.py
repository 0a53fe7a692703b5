"""Read a checkpoint directory without reading tensor data.

config.json, hf_quant_config.json, quantize_config.json / quant_config.json, generation_config.json,
model.safetensors.index.json and, for each shard, the safetensors header only: the 8-byte
little-endian length and the JSON that follows. Integrity problems become findings; a directory
that cannot be read as a checkpoint at all raises InputError with the file and the problem.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.model.location import hf_snapshot, looks_like_repo_id

INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass
class ShardHeader:
    name: str
    file_size: int
    header_len: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    @property
    def data_end(self) -> int:
        """Bytes the file needs: 8 + header + the last tensor's end offset."""
        return 8 + self.header_len + max((t.end for t in self.tensors.values()), default=0)

    @property
    def data_bytes(self) -> int:
        return sum(t.end - t.start for t in self.tensors.values())


@dataclass
class Checkpoint:
    dir: Path
    config: dict[str, Any]
    hf_quant_config: Optional[dict[str, Any]] = None
    quantize_config: Optional[dict[str, Any]] = None     # GPTQ/AWQ side files
    generation_config: Optional[dict[str, Any]] = None
    index: Optional[dict[str, Any]] = None
    shards: dict[str, ShardHeader] = field(default_factory=dict)
    weight_map: dict[str, str] = field(default_factory=dict)  # tensor -> shard file
    problems: list[Finding] = field(default_factory=list)
    bytes_read: int = 0
    unreadable_shards: list[str] = field(default_factory=list)

    @property
    def has_weights(self) -> bool:
        return bool(self.weight_map)

    @property
    def complete(self) -> bool:
        """True when every shard the index names was read."""
        return not self.unreadable_shards

    @property
    def total_bytes(self) -> Optional[int]:
        meta = (self.index or {}).get("metadata") or {}
        if isinstance(meta.get("total_size"), (int, float)) and meta["total_size"] > 0:
            return int(meta["total_size"])
        if self.shards and self.complete:
            return sum(s.data_bytes for s in self.shards.values())
        return None


    def dtype_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.shards.values():
            for t in s.tensors.values():
                out[t.dtype] = out.get(t.dtype, 0) + 1
        return out


def _read_json(path: Path, required: bool) -> Optional[dict[str, Any]]:
    if not path.is_file():
        if required:
            raise InputError(f"{path}: missing")
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def read_header(path: Path) -> ShardHeader:
    """The safetensors header of one shard; InputError names the file and what is wrong."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"{path.name}: file is {size} bytes, too short for a safetensors header")
            n = int.from_bytes(head, "little")
            if n > size - 8:
                raise InputError(f"{path.name}: header length {n} is larger than the file ({size} bytes): truncated or not safetensors")
            if n > _MAX_HEADER:
                raise InputError(f"{path.name}: header length {n} exceeds safetensors' 100 MB limit")
            raw = f.read(n)
    except OSError as e:
        raise InputError(f"{path.name}: cannot read: {e.strerror}") from None
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError(f"{path.name}: header is not JSON (first bytes {raw[:24]!r})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path.name}: header is JSON but not an object")
    meta = doc.pop("__metadata__", None) or {}
    tensors: dict[str, TensorInfo] = {}
    for name, t in doc.items():
        try:
            start, end = t["data_offsets"]
            tensors[name] = TensorInfo(str(t["dtype"]), tuple(int(x) for x in t["shape"]), int(start), int(end))
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path.name}: tensor {name!r} has no valid dtype/shape/data_offsets") from None
    return ShardHeader(path.name, size, n, tensors, meta if isinstance(meta, dict) else {})


def resolve_dir(model: str | os.PathLike) -> Path:
    """A local directory, or a Hugging Face repo id resolved offline to its cached snapshot."""
    p = Path(os.path.expanduser(str(model)))
    if p.is_dir():
        return p
    if looks_like_repo_id(str(model)):
        snap = hf_snapshot(str(model))
        if snap is not None:
            return snap
        raise InputError(f"{model}: not a local directory, and no Hugging Face snapshot of it is cached "
                         "(download it first: `hf download {model}`; this tool never downloads)".replace("{model}", str(model)))
    raise InputError(f"{model}: no such directory")


def load(model_dir: str | os.PathLike, read_headers: bool = True) -> Checkpoint:
    d = resolve_dir(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        shards = sorted(x.name for x in d.glob("*.safetensors"))[:3]
        raise InputError(f"{d}: not a checkpoint: no config.json" + (f" (found {', '.join(shards)})" if shards else ""))
    ck = Checkpoint(dir=d, config=_read_json(cfg_path, True) or {})
    ck.hf_quant_config = _read_json(d / "hf_quant_config.json", False)
    ck.quantize_config = _read_json(d / "quantize_config.json", False) or _read_json(d / "quant_config.json", False)
    try:
        ck.generation_config = _read_json(d / "generation_config.json", False)
    except InputError as e:  # not needed to decide anything: a warning, not a stop
        ck.problems.append(Finding("ckpt.generation_config", "warn", "generation_config.json unreadable", detail=str(e),
                                   remedy="Re-download the file; SGLang falls back to no default sampling parameters."))
    ck.index = _read_json(d / INDEX, False)
    if ck.index is not None:
        wm = ck.index.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise InputError(f"{d / INDEX}: no 'weight_map' object mapping tensor names to shard files")
        ck.weight_map = {str(k): str(v) for k, v in wm.items()}
    shard_files = sorted(set(ck.weight_map.values())) if ck.index is not None else sorted(x.name for x in d.glob("*.safetensors"))
    if read_headers:
        _read_shards(ck, shard_files)
    return ck


def _read_shards(ck: Checkpoint, shard_files: list[str]) -> None:
    missing = [s for s in shard_files if not (ck.dir / s).is_file()]
    if missing:
        ck.unreadable_shards += missing
        ck.problems.append(Finding("ckpt.missing_shards", "fail", f"{len(missing)} shard(s) named in {INDEX} are missing",
                                   evidence=", ".join(missing[:5]) + (" …" if len(missing) > 5 else ""),
                                   remedy="Finish the download (`hf download <repo>` resumes) or restore the files."))
    for name in shard_files:
        if name in missing:
            continue
        try:
            h = read_header(ck.dir / name)
        except InputError as e:
            ck.unreadable_shards.append(name)
            ck.problems.append(Finding("ckpt.shard_header", "fail", f"unreadable shard {name}", detail=str(e),
                                       remedy="Re-download this shard; SGLang will fail to load it."))
            continue
        ck.shards[name] = h
        ck.bytes_read += 8 + h.header_len
        if h.file_size < h.data_end:
            ck.problems.append(Finding("ckpt.truncated", "fail", f"{name} is truncated",
                                       detail=f"its header needs {h.data_end} bytes, the file has {h.file_size}",
                                       remedy="Re-download this shard."))
    if ck.index is None:
        ck.weight_map = {t: s.name for s in ck.shards.values() for t in s.tensors}
        return
    absent = [t for t, s in ck.weight_map.items() if s in ck.shards and t not in ck.shards[s].tensors]
    if absent:
        ck.problems.append(Finding("ckpt.index_mismatch", "fail", f"{len(absent)} tensor(s) in {INDEX} are absent from their shard",
                                   evidence=", ".join(f"{t} → {ck.weight_map[t]}" for t in absent[:3]),
                                   remedy="The index and shards come from different revisions: re-download both."))
