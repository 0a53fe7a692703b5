"""trace:FILE: a Mooncake-format trace replayed at its recorded times (open loop): JSON Lines with
"timestamp" (ms), "input_length", "output_length" and optional "hash_ids" (one id per block of
TRACE_BLOCK tokens: requests naming the same ids share that prefix, built from the same corpus
text) and "session_id". `trace:synthetic` is the small trace shipped in the corpus. An SGLang request
dump (.pkl from --dump-requests-folder / --crash-dump-folder) is read too, without running it
(bench/sglang_dump.py): created times, prompt/completion tokens, and ids per block of input_ids."""
from __future__ import annotations

import hashlib
import json
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook.bench import sglang_dump
from runbook.bench.prompt_text import count_tokens, exact_ids
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext, LazyRequests, Workload, WorkloadType
from runbook.bench.workloads.file import read_workload_file
from runbook.core.errors import InputError
from runbook.core.numeric import is_int, is_number
from runbook.corpus import CHARS_PER_TOKEN, code_text
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.endpoint.records import RequestSpec

if TYPE_CHECKING:
    from runbook.bench.sweep import Level

TRACE_BLOCK = 512         # tokens per Mooncake hash id
SYNTHETIC_TRACE = "trace_synthetic.jsonl"
MAX_TRACE_LENGTH = 1 << 20


def _trace_int(d: dict[str, Any], key: str, where: str, lo: int) -> int:
    v = d.get(key)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not is_int(v) or not lo <= v <= MAX_TRACE_LENGTH:
        raise InputError(f"{where}: \"{key}\" must be an integer in [{lo}, {MAX_TRACE_LENGTH:,}] (got {str(v)[:40]!r})")
    return v


def read_trace(text: str, source: str) -> list[dict[str, Any]]:
    """The trace's rows (timestamp s, lengths, hash ids, session), in timestamp order; InputError naming the line."""
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{source}:{i + 1}"
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{where}: not JSON; a Mooncake trace has one JSON object per line") from None
        if not isinstance(d, dict):
            raise InputError(f"{where}: each line must be a JSON object with timestamp, input_length, output_length")
        ts = d.get("timestamp")
        if not is_number(ts) or not math.isfinite(ts) or ts < 0:
            raise InputError(f"{where}: \"timestamp\" must be a non-negative number of milliseconds (got {str(ts)[:40]!r})")
        hs = d.get("hash_ids", [])
        if not isinstance(hs, list) or not all(is_int(h) for h in hs):
            raise InputError(f"{where}: \"hash_ids\" must be a list of integers")
        sid = d.get("session_id")
        rows.append({"t": float(ts) / 1000.0, "input": _trace_int(d, "input_length", where, 1),
                     "output": _trace_int(d, "output_length", where, 0), "hash_ids": hs,
                     "session": sid if isinstance(sid, (str, int)) and not isinstance(sid, bool) else None})
    if not rows:
        raise InputError(f"{source}: no requests in the trace")
    rows.sort(key=lambda r: float(r["t"]))
    return rows


def build_trace(ref: str, n: int, tokenizer: Any = None, chat: bool = False, ignore_eos: bool = True,
                speed: float = 1.0) -> Workload:
    """Requests of a Mooncake trace with their send offsets (÷ speed); at most n of them."""
    if not (speed > 0 and math.isfinite(speed)):
        raise InputError(f"{{trace_speed}} must be a positive number (got {speed})")
    if ref == "synthetic":
        raw = resources.files("runbook.corpus").joinpath("data").joinpath(SYNTHETIC_TRACE).read_bytes()
        text, source = raw.decode(), f"corpus {SYNTHETIC_TRACE}"
    else:
        path = Path(ref)
        if not path.is_file():
            raise InputError(f"{{workload}} trace:{ref}: no such file (a Mooncake JSON Lines trace, an SGLang request dump "
                             ".pkl, or trace:synthetic)")
        raw, text = read_workload_file(path, dump_ok=True)
        source = str(path)
    what, skipped = "trace", 0
    if raw[:1] == sglang_dump.PICKLE_MAGIC:
        all_rows, skipped = sglang_dump.rows(raw, source, TRACE_BLOCK)
        rows, what = all_rows[:n], "SGLang request dump"
    else:
        rows = read_trace(text, source)[:n]
    t0 = rows[0]["t"]
    corpus = code_text()
    exact = tokenizer is not None and not chat
    blocks: dict[int, Any] = {}

    def block(h: int) -> Any:
        if h not in blocks:
            start = (h * 2654435761) % max(1, len(corpus) // 2)
            body = corpus[start:] + corpus[:start]
            blocks[h] = (exact_ids(tokenizer, body, TRACE_BLOCK) if tokenizer is not None
                         else body[: TRACE_BLOCK * CHARS_PER_TOKEN])
        return blocks[h]

    def one(i: int) -> RequestSpec:
        r = rows[i]
        ids = list(r["hash_ids"])
        need = -(-r["input"] // TRACE_BLOCK)
        ids += [-(i + 1) * 1000003 - k for k in range(max(0, need - len(ids)))]   # this request's own blocks
        parts = [block(h) for h in ids[:need]]
        meta: dict[str, Any] = {"scheduled_s": (r["t"] - t0) / speed}
        if r["session"] is not None:
            meta["session"] = r["session"]
        out = max(1, r["output"])
        if tokenizer is not None:
            toks = [t for p in parts for t in p][: r["input"]]
            if exact:
                return RequestSpec(i, toks, out, len(toks), ignore_eos, meta)
            txt = tokenizer.decode(toks)
            return RequestSpec(i, txt, out, count_tokens(tokenizer, txt), ignore_eos, meta)
        txt = "".join(parts)[: r["input"] * CHARS_PER_TOKEN]
        return RequestSpec(i, txt, out, None, ignore_eos, meta)

    schedule = [(r["t"] - t0) / speed for r in rows]
    span = schedule[-1] if schedule else 0.0
    return Workload(f"trace:{ref}", LazyRequests(len(rows), one), exact,
                    f"{what} {source}: {len(rows)} requests over {span:.1f} s (speed ×{speed:g}), open loop"
                    + (f"; {skipped} dump entries without a time or token counts left out" if skipped else ""),
                    f"trace-{hashlib.sha256(raw).hexdigest()[:16]}+{CORPUS_VERSION}", schedule)


class Trace(WorkloadType):
    name = "trace"
    prefix = "trace:"
    usage = "trace:FILE"
    hint = "Mooncake JSONL; trace:synthetic"
    description = ("a Mooncake trace (or an SGLang request dump .pkl) replayed open loop at its recorded times "
                   "÷ --trace-speed; trace:synthetic ships in the corpus")
    options = ("trace_speed", "chat")
    regression_key = (*WorkloadType.regression_key, "trace_speed")   # a trace's pace changes the work as much as its lengths
    order = 60
    own_load = "a trace replays its own"
    one_process = "traces"
    paired = False

    def check(self, o: BenchSettings) -> None:
        if o.rates:
            raise InputError("{workload} trace:FILE replays the trace's own times; {rates} does not apply (use {trace_speed})")

    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        return build_trace(o.workload[len(self.prefix or ""):], n, ctx.tokenizer, bool(o.chat), ctx.ignore_eos, o.trace_speed)

    def start(self, o: BenchSettings, ctx: BuildContext) -> Workload:
        # The whole trace (or --requests of it): its length and times make the one level.
        return self.build(o, o.requests or 1 << 30, ctx)

    def levels(self, o: BenchSettings, run: Workload) -> list[Level] | None:
        from runbook.bench.sweep import Level  # lazy: the sweep's HTTP client only when a trace is run

        # A trace is its own load: one open-loop level at the recorded times (÷ --trace-speed).
        return [Level("trace" if o.trace_speed == 1 else f"trace-x{o.trace_speed:g}", schedule=run.schedule)]

    def summary(self, o: BenchSettings, run: Workload) -> dict[str, Any]:
        return {"trace_speed": o.trace_speed}


WORKLOAD = Trace()
