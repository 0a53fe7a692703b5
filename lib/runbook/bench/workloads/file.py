"""FILE: JSON Lines with "prompt" (text or token ids) or "messages", and optional "max_tokens"; any
--workload value no other workload takes is read as this file."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from runbook.bench import sglang_dump
from runbook.bench.prompt_text import count_tokens
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LazyRequests, Workload, WorkloadType
from runbook.core.errors import InputError
from runbook.core.fsutil import FileRefused, read_regular
from runbook.core.numeric import is_int
from runbook.endpoint.records import RequestSpec

MAX_WORKLOAD_BYTES = 1 << 30   # a JSON Lines prompt file; beyond 1 GiB it is not a workload


def read_workload_file(path: Path, dump_ok: bool = False) -> tuple[bytes, str]:
    """The bytes and UTF-8 text of a workload file; InputError naming the file, the line and byte offset, and the fix.
    `dump_ok`: a pickle (an SGLang request dump) comes back as bytes with no text."""
    try:
        raw = read_regular(path, MAX_WORKLOAD_BYTES, what="a workload file")
    except OSError as e:
        raise InputError(f"{path}: cannot read the workload file: {e.strerror or e}") from None
    except FileRefused as e:
        raise InputError(f"{path}: {e.reason}; give a JSON Lines workload file") from None
    if dump_ok and raw[:1] == sglang_dump.PICKLE_MAGIC:
        return raw, ""
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte offset {e.start}); "
                         "save the workload file as UTF-8 (JSON Lines)") from None


def _max_tokens(mt: object) -> int | None:
    if is_int(mt):
        return mt
    if isinstance(mt, float) and mt.is_integer():
        return int(mt)
    return int(mt.strip()) if isinstance(mt, str) and mt.strip().isdigit() else None


class PromptFile(WorkloadType):
    name = "file"
    fallback = True
    usage = "FILE.jsonl"
    description = 'your prompts: JSON Lines with "prompt" (text or token ids) or "messages", optional "max_tokens"'
    options = ("output_len", "chat")

    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        path = Path(o.workload)
        if not path.is_file():
            from runbook.bench.workloads.registry import named  # lazy: the registry imports every workload module, this one too

            raise InputError(f"{{workload}} {o.workload}: not {'|'.join(named())} and not a file")
        raw, text = read_workload_file(path)
        rows: list[RequestSpec] = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{i + 1}: not JSON ({e.msg})") from None
            except (RecursionError, ValueError):
                raise InputError(f"{path}:{i + 1}: not a usable JSON line (nested too deeply or a number too long)") from None
            if not isinstance(d, dict):
                raise InputError(f"{path}:{i + 1}: each line must be a JSON object with \"prompt\" (or \"messages\"), "
                                 f"got {type(d).__name__}")
            prompt = d.get("messages") if bool(o.chat) and "messages" in d else d.get("prompt")
            if prompt is None:
                raise InputError(f"{path}:{i + 1}: needs \"prompt\" (or \"messages\" with {{chat}})")
            mt = d.get("max_tokens", o.output_len)
            n_out = _max_tokens(mt)
            if n_out is None or not 0 < n_out <= 1 << 24:
                raise InputError(f"{path}:{i + 1}: \"max_tokens\" must be a token count in [1, {1 << 24:,}] (got {str(mt)[:40]!r})")
            rows.append(RequestSpec(len(rows), prompt, n_out,
                                    count_tokens(ctx.tokenizer, prompt) if isinstance(prompt, str) else None, ctx.ignore_eos))
        if not rows:
            raise InputError(f"{path}: no requests")
        base = rows
        lazy = LazyRequests(n, lambda i: RequestSpec(i, base[i % len(base)].prompt, base[i % len(base)].max_tokens,
                                                    base[i % len(base)].prompt_tokens, base[i % len(base)].ignore_eos))
        return Workload(path.name, lazy, ctx.tokenizer is not None, f"prompts from {path}",
                        "file-" + hashlib.sha256(raw).hexdigest()[:16])


WORKLOAD = PromptFile()
