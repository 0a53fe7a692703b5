"""Read a checkpoint directory without reading tensor data.

config.json, hf_quant_config.json, quantize_config.json / quant_config.json, generation_config.json,
model.safetensors.index.json and, for each shard, the safetensors header only: the 8-byte
little-endian length and the JSON that follows. Integrity problems become findings; a directory
that cannot be read as a checkpoint at all raises InputError with the file and the problem.
"""
from __future__ import annotations

import errno
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.fsutil import FileRefused, read_regular
from runbook.core.numeric import is_int, is_number
from runbook.model.location import hf_snapshot, locate, looks_like_repo_id

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
    hf_quant_config: dict[str, Any] | None = None
    quantize_config: dict[str, Any] | None = None     # GPTQ/AWQ side files
    generation_config: dict[str, Any] | None = None
    index: dict[str, Any] | None = None
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
    def total_bytes(self) -> int | None:
        meta = (self.index or {}).get("metadata") or {}
        if not isinstance(meta, dict):
            meta = {}
        if is_number(meta.get("total_size")) and meta["total_size"] > 0:
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


_MAX_JSON_FILE = 16 << 20        # config.json & co. are KiB; a 16 MiB "config" is a mistake (or /dev/zero behind a link)
_MAX_INDEX_FILE = 256 << 20      # an index lists every tensor: a few MiB even for the largest checkpoints
_MAX_TOTAL_SIZE = 1 << 50        # 1 PiB: far above any checkpoint (the largest are a few TB)
_SHOWN = 60


def _shown(v: Any) -> str:
    r = "null" if v is None else repr(v)
    return r if len(r) <= _SHOWN else r[:_SHOWN] + "…"


def _json_kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def _stat(path: Path) -> os.stat_result | None:
    """stat() following links; None when nothing is there. A loop or an unreadable path is an InputError."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise InputError(f"{path}: a symbolic link to a file that does not exist; re-download it "
                             "(or remove the dangling link)") from None
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: symbolic link loop; replace the link with the real file (re-download it)") from None
        if e.errno == errno.ENOTDIR:
            return None
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None


def _read_json(path: Path, required: bool, cap: int = _MAX_JSON_FILE) -> dict[str, Any] | None:
    """A JSON object from a regular, bounded, UTF-8 file; InputError names the file, what is wrong and the fix."""
    st = _stat(path)
    if st is None:
        if required:
            raise InputError(f"{path}: missing")
        return None
    try:
        raw = read_regular(path, cap, st)
    except FileRefused as e:
        fix = ("remove it and re-download the file" if e.reason == "is a directory"
               else "replace it with the real JSON file (re-download it)")
        raise InputError(f"{path}: {e.reason}; {fix}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         "re-download the file (JSON must be UTF-8)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a model config; re-download the file") from None
    except ValueError as e:   # e.g. an integer with more digits than Python converts
        raise InputError(f"{path}: unreadable JSON value ({' '.join(str(e).split())[:100]}); re-download the file") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


# Fields the runbook computes with, checked once here so later stages never meet a wrong type.
# null is always allowed (it means "not set"). name -> highest sane value
_CONFIG_INTS: dict[str, int] = {
    "num_hidden_layers": 10_000, "num_attention_heads": 1 << 16, "num_key_value_heads": 1 << 16,
    "num_kv_heads": 1 << 16, "multi_query_group_num": 1 << 16, "hidden_size": 1 << 20, "head_dim": 1 << 16,
    "kv_lora_rank": 1 << 20, "qk_rope_head_dim": 1 << 16, "qk_nope_head_dim": 1 << 16, "v_head_dim": 1 << 16,
    "num_nextn_predict_layers": 10_000, "mtp_num_hidden_layers": 10_000, "vocab_size": 1 << 28,
    "max_position_embeddings": 1 << 40, "sliding_window": 1 << 40, "full_attention_interval": 10_000,
    "linear_num_key_heads": 1 << 16, "linear_num_value_heads": 1 << 16, "linear_key_head_dim": 1 << 16,
    "linear_value_head_dim": 1 << 16, "linear_conv_kernel_dim": 1 << 16, "index_topk": 1 << 32,
}
_CONFIG_OBJECTS = ("text_config", "vision_config", "quantization_config", "compression_config", "rope_scaling")
_CONFIG_STRS = ("model_type", "torch_dtype", "dtype")
_CONFIG_STR_LISTS = ("architectures", "layer_types")
_QUANT_STRS = ("quant_algo", "kv_cache_quant_algo", "quant_method", "format")
_QUANT_STR_LISTS = ("exclude_modules", "ignore", "modules_to_not_convert")
_QUANT_INTS: dict[str, tuple[int, int]] = {"group_size": (-1, 1 << 20), "bits": (1, 64), "w_bit": (1, 64),
                                           "q_group_size": (-1, 1 << 20)}


def _bad(path: Path, key: str, want: str, got: Any, fix: str) -> InputError:
    return InputError(f"{path}: '{key}' must be {want} (got {_json_kind(got)} {_shown(got)}); {fix}")


def _check_int(path: Path, key: str, v: Any, lo: int, hi: int, fix: str) -> None:
    if v is None:
        return
    if not is_int(v):
        raise _bad(path, key, f"an integer in [{lo}, {hi:,}]", v, fix)
    if not lo <= v <= hi:
        raise InputError(f"{path}: '{key}' must be an integer in [{lo}, {hi:,}] (got {_shown(v)}); {fix}")


def _check_fields(path: Path, doc: dict[str, Any], prefix: str, ints: dict[str, Any], strs: tuple[str, ...],
                  str_lists: tuple[str, ...], objects: tuple[str, ...], fix: str) -> None:
    for key, bound in ints.items():
        lo, hi = bound if isinstance(bound, tuple) else (0, bound)
        if key in doc:
            _check_int(path, prefix + key, doc[key], lo, hi, fix)
    for key in strs:
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise _bad(path, prefix + key, "a string", doc[key], fix)
    for key in str_lists:
        v = doc.get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise _bad(path, prefix + key, "a list of strings", v, fix)
    for key in objects:
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise _bad(path, prefix + key, "an object", doc[key], fix)


def _check_quant(path: Path, q: dict[str, Any], prefix: str, fix: str) -> None:
    _check_fields(path, q, prefix, _QUANT_INTS, _QUANT_STRS, _QUANT_STR_LISTS, ("config_groups",), fix)
    kvs = q.get("kv_cache_scheme")
    if kvs is not None and not isinstance(kvs, (dict, str)):
        # a string ("FP8") is a real ModelOpt form SGLang starts with; the quant stage says what it does with it
        raise _bad(path, prefix + "kv_cache_scheme", "an object or a string", kvs, fix)
    wbs = q.get("weight_block_size")
    if wbs is not None and not (isinstance(wbs, list) and all(is_int(x) and 0 < x <= 1 << 20
                                                                for x in wbs)):
        raise _bad(path, prefix + "weight_block_size", "a list of positive integers", wbs, fix)


def check_config(path: Path, cfg: dict[str, Any]) -> None:
    """config.json: the fields the runbook computes with have the right JSON type and a sane size."""
    fix = "fix the value in config.json or re-download it from the model's repository"
    _check_fields(path, cfg, "", _CONFIG_INTS, _CONFIG_STRS, _CONFIG_STR_LISTS, _CONFIG_OBJECTS, fix)
    tc = cfg.get("text_config")
    if isinstance(tc, dict):
        _check_fields(path, tc, "text_config.", _CONFIG_INTS, _CONFIG_STRS, _CONFIG_STR_LISTS, _CONFIG_OBJECTS, fix)
    for key in ("quantization_config", "compression_config"):
        qc = cfg.get(key)
        if isinstance(qc, dict):
            _check_quant(path, qc, f"{key}.", fix)


def check_hf_quant_config(path: Path, qc: dict[str, Any]) -> None:
    """hf_quant_config.json (ModelOpt): {"producer": {...}, "quantization": {"quant_algo": ..., ...}}."""
    fix = "fix the value in hf_quant_config.json or re-download it"
    if "producer" in qc and qc["producer"] is not None and not isinstance(qc["producer"], dict):
        raise _bad(path, "producer", "an object ({\"name\": ..., \"version\": ...})", qc["producer"], fix)
    if "quantization" in qc:
        q = qc["quantization"]
        # SGLang starts with a non-object "quantization" (it serves the weights unquantized): the quant stage
        # reports that; only an object is checked field by field here
        if isinstance(q, dict):
            _check_quant(path, q, "quantization.", fix)
    else:
        _check_quant(path, qc, "", fix)


def check_quantize_config(path: Path, qc: dict[str, Any]) -> None:
    """quantize_config.json / quant_config.json (GPTQ, AWQ)."""
    fix = f"fix the value in {path.name} or re-download it"
    _check_quant(path, qc, "", fix)
    for key in ("desc_act", "sym", "zero_point", "true_sequential"):
        if qc.get(key) is not None and not isinstance(qc[key], bool):
            raise _bad(path, key, "true or false", qc[key], fix)


def check_index(path: Path, index: dict[str, Any]) -> dict[str, str]:
    """model.safetensors.index.json -> its weight_map (tensor -> shard file), every entry checked."""
    fix = "re-download model.safetensors.index.json (it comes with the shards)"
    meta = index.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise _bad(path, "metadata", "an object", meta, fix)
    total = (meta or {}).get("total_size")
    if total is not None:
        if isinstance(total, float) and math.isfinite(total) and total.is_integer():
            total = int(total)
        if not is_int(total):
            raise _bad(path, "metadata.total_size", "the checkpoint's size in bytes (an integer)", total, fix)
        if not 0 <= total <= _MAX_TOTAL_SIZE:
            raise InputError(f"{path}: 'metadata.total_size' must be a size in bytes in [0, {_MAX_TOTAL_SIZE:,}] (1 PiB) "
                             f"(got {_shown(total)}); {fix}")
    wm = index.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise InputError(f"{path}: no 'weight_map' object mapping tensor names to shard files"
                         + (f" (got {_json_kind(wm)})" if wm is not None and not isinstance(wm, dict) else "") + f"; {fix}")
    out: dict[str, str] = {}
    for name, shard in wm.items():
        if not isinstance(shard, str) or not shard:
            raise InputError(f"{path}: 'weight_map.{_shown(name)}' must be a shard file name (a string) "
                             f"(got {_json_kind(shard)} {_shown(shard)}); {fix}")
        parts = Path(shard).parts
        if Path(shard).is_absolute() or ".." in parts or "\x00" in shard:
            raise InputError(f"{path}: 'weight_map.{_shown(name)}' names {_shown(shard)}, which is outside the checkpoint "
                             f"directory; shard names are plain file names; {fix}")
        out[str(name)] = shard
    return out


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
    except (RecursionError, ValueError):
        raise InputError(f"{path.name}: header JSON is nested too deeply or holds an unreadable number; re-download this shard") from None
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
    if p.is_symlink():
        _stat(p)    # a loop or a dangling link says so
    if p.exists():
        raise InputError(f"{model}: {'a file, not' if p.is_file() else 'not'} a directory; give the checkpoint's directory "
                         "(the one holding config.json)")
    raise InputError(f"{model}: no such directory")


def for_spec(spec: Any, model_dir: str | os.PathLike | None = None) -> tuple[Checkpoint, str]:
    """The checkpoint a stage inspects, and a note when it is the model card rather than the weights: model_dir
    when given, else where the spec's model.path is found (location.locate). The one locate-then-load."""
    if model_dir:
        return load(model_dir), ""
    loc = locate(spec)
    if loc.path is None:
        fix = ("point model.card at the directory holding config.json (a relative path is relative to the spec file)"
               if spec.model.card else "add model.card") + " or download the checkpoint"
        raise InputError(f"{spec.source}: {loc.note}; {fix}")
    return load(loc.path), (loc.note if loc.kind == "card" else "")


def load(model_dir: str | os.PathLike, read_headers: bool = True) -> Checkpoint:
    d = resolve_dir(model_dir)
    cfg_path = d / "config.json"
    if _stat(cfg_path) is None:
        shards = sorted(x.name for x in d.glob("*.safetensors"))[:3]
        raise InputError(f"{d}: not a checkpoint: no config.json" + (f" (found {', '.join(shards)})" if shards else ""))
    ck = Checkpoint(dir=d, config=_read_json(cfg_path, True) or {})
    check_config(cfg_path, ck.config)
    ck.hf_quant_config = _read_json(d / "hf_quant_config.json", False)
    if ck.hf_quant_config is not None:
        check_hf_quant_config(d / "hf_quant_config.json", ck.hf_quant_config)
    for name in ("quantize_config.json", "quant_config.json"):
        ck.quantize_config = _read_json(d / name, False)
        if ck.quantize_config:
            check_quantize_config(d / name, ck.quantize_config)
            break
    try:
        ck.generation_config = _read_json(d / "generation_config.json", False)
    except InputError as e:  # not needed to decide anything: a warning, not a stop
        ck.problems.append(Finding("quant.ckpt.generation_config", "warn", "generation_config.json unreadable", detail=str(e),
                                   remedy="Re-download the file; SGLang falls back to no default sampling parameters."))
    ck.index = _read_json(d / INDEX, False, cap=_MAX_INDEX_FILE)
    if ck.index is not None:
        ck.weight_map = check_index(d / INDEX, ck.index)
    shard_files = sorted(set(ck.weight_map.values())) if ck.index is not None else sorted(x.name for x in d.glob("*.safetensors"))
    if read_headers:
        _read_shards(ck, shard_files)
    return ck


def _absent(path: Path) -> bool:
    """Nothing there (a dangling link counts as absent); a link loop is present-but-unreadable, reported by read_header."""
    try:
        path.stat()
    except OSError as e:
        return e.errno != errno.ELOOP
    return not path.is_file() and not path.is_dir()


def _read_shards(ck: Checkpoint, shard_files: list[str]) -> None:
    missing = [s for s in shard_files if _absent(ck.dir / s)]
    if missing:
        ck.unreadable_shards += missing
        ck.problems.append(Finding("quant.ckpt.missing_shards", "fail", f"{len(missing)} shard(s) named in {INDEX} are missing",
                                   evidence=", ".join(missing[:5]) + (" …" if len(missing) > 5 else ""),
                                   remedy="Finish the download (`hf download <repo>` resumes) or restore the files."))
    for name in shard_files:
        if name in missing:
            continue
        try:
            h = read_header(ck.dir / name)
        except InputError as e:
            ck.unreadable_shards.append(name)
            ck.problems.append(Finding("quant.ckpt.shard_header", "fail", f"unreadable shard {name}", detail=str(e),
                                       remedy="Re-download this shard; SGLang will fail to load it."))
            continue
        ck.shards[name] = h
        ck.bytes_read += 8 + h.header_len
        if h.file_size < h.data_end:
            ck.problems.append(Finding("quant.ckpt.truncated", "fail", f"{name} is truncated",
                                       detail=f"its header needs {h.data_end} bytes, the file has {h.file_size}",
                                       remedy="Re-download this shard."))
    if ck.index is None:
        ck.weight_map = {t: s.name for s in ck.shards.values() for t in s.tensors}
        return
    absent = [t for t, s in ck.weight_map.items() if s in ck.shards and t not in ck.shards[s].tensors]
    if absent:
        ck.problems.append(Finding("quant.ckpt.index_mismatch", "fail", f"{len(absent)} tensor(s) in {INDEX} are absent from their shard",
                                   evidence=", ".join(f"{t} → {ck.weight_map[t]}" for t in absent[:3]),
                                   remedy="The index and shards come from different revisions: re-download both."))
