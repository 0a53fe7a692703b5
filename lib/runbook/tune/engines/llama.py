"""llama.cpp's llama-server as tune launches it (the CPU engine of tests and `make demo`).

The pre-check knows what llama-server's own `--help` and the GGUF header say: every flag is one it
lists (a removed flag carries the help's own message), a cache type is one of its allowed values, and
the KV cache the flags ask for — n_ctx × layers × (K + V width) × the cache type's bytes per element —
fits in this host's memory and holds one request at the workload's longest context (the per-slot
context is n_ctx / parallel slots). Its start-up log (at -lv 4) prints the KV cache it allocated:
`llama_kv_cache: size = … MiB (N cells, L layers, S/S seqs), K (q8_0): … MiB, V (q8_0): … MiB`.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import psutil

from runbook.core import oscalls
from runbook.core.errors import InputError
from runbook.core.spec import Deployment
from runbook.core.units import MIB
from runbook.model import gguf
from runbook.tune.engines import PreCheck, Server, Startup

# ggml's block sizes: bytes per element of each cache type llama-server accepts (ggml.c type_traits)
BYTES_PER_ELEMENT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                     "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
_KV_LINE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
                      r"K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB")
_CTX_LINE = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_seq_max)\s+= (\d+)")
_ERROR_LINE = re.compile(r"(?:^|\s)(?:error|E)[: ].*|failed to .*", re.IGNORECASE)


def binary(spec: Deployment) -> Path:
    return spec.resolve_path(spec.tune.llama_server or "llama-server")


@functools.lru_cache(maxsize=8)
def flag_table(exe: str) -> dict[str, dict[str, Any]]:
    """llama-server's flags from its own --help: name -> {"removed": message | None, "allowed": [values]}."""
    try:
        out = oscalls.call([exe, "--help"], timeout=60).stdout
    except oscalls.CommandFailed as e:
        raise InputError(f"tune.llama_server: {exe}: {e.reason}; build it with `make demo`") from None
    table: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    text: list[str] = []

    def close() -> None:
        body = " ".join(" ".join(text).split())
        removed = body.split("(env:")[0].strip() if "argument has been removed" in body else None
        allowed = re.search(r"allowed values: ([\w, ]+?)(?: \(|$)", body)
        for n in names:
            table[n] = {"removed": removed, "allowed": [v.strip() for v in allowed.group(1).split(",")] if allowed else None}

    for line in out.splitlines():
        if line.startswith("-"):
            close()
            names = re.findall(r"(?:^|[\s,])(-{1,2}[A-Za-z][\w-]*)", line[:40])
            text = [line[40:]]
        elif line.startswith(" ") and names:
            text.append(line)
    close()
    return table


def _flag_args(flags: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for k, v in flags.items():
        if v is True:
            args.append(f"--{k}")
        elif v is not None and v is not False:     # 0 is a value (--cache-ram 0), not "off"
            args += [f"--{k}", str(v)]
    return args


def _unknown(flags: dict[str, Any], table: dict[str, dict[str, Any]], exe: str) -> str | None:
    for k, v in flags.items():
        entry = table.get(f"--{k}") or table.get(f"-{k}")
        if entry is None:
            return f"--{k}: not a flag of {Path(exe).name} (its --help lists no such flag)"
        if entry["removed"]:
            return f"--{k}: {entry['removed']}"
        if entry["allowed"] and v not in (None, False, True) and str(v) not in entry["allowed"]:
            return f"--{k} {v}: not one of its allowed values ({', '.join(entry['allowed'])})"
    return None


def kv_prediction(meta: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The KV cache llama-server will allocate for these flags (bytes, tokens, slots, per-slot context)."""
    arch = meta.get("general.architecture", "llama")
    layers = int(meta[f"{arch}.block_count"])
    heads, kv_heads = int(meta[f"{arch}.attention.head_count"]), int(meta.get(f"{arch}.attention.head_count_kv") or 0)
    width = int(meta[f"{arch}.embedding_length"]) // heads * (kv_heads or heads)
    train = int(meta.get(f"{arch}.context_length") or 0)
    ctk, ctv = str(flags.get("cache-type-k", "f16")), str(flags.get("cache-type-v", "f16"))
    slots = int(flags.get("parallel", 4) or 4)
    if int(slots) < 0:
        slots = 4                                           # -np -1: auto, 4 slots in this version
    n_ctx = int(flags.get("ctx-size") or train)
    per_token = layers * width * (BYTES_PER_ELEMENT[ctk] + BYTES_PER_ELEMENT[ctv])
    return {"kv_dtype": f"K {ctk}, V {ctv}", "max_total_num_tokens": n_ctx, "max_running_requests": slots,
            "context_len": n_ctx // slots, "kv_bytes_per_token": round(per_token),
            "kv_mib": round(per_token * n_ctx / MIB, 2), "context_train": train,
            "speculative": flags.get("spec-type") or ("draft" if flags.get("model-draft") else None)}


def _host_memory() -> int:
    return int(psutil.virtual_memory().total)


class Llama(Server):
    name = "llama-server"
    stop_signal = None          # one process: SIGTERM

    def precheck(self, spec: Deployment, longest: int, buckets: list[int]) -> PreCheck:
        exe = binary(spec)
        flags = dict(spec.serving.flags)
        argv, _ = self.launch_env(spec)
        if not exe.is_file():
            return PreCheck("skipped", f"tune.llama_server: {exe} does not exist; build it with `make demo`", argv=argv)
        why = _unknown(flags, flag_table(str(exe)), str(exe))
        if why:
            return PreCheck("skipped", why, argv=argv)
        try:
            pred = kv_prediction(gguf.metadata(spec.resolve_path(spec.model.path)), flags)
        except (InputError, KeyError, ValueError) as e:
            return PreCheck("skipped", f"model.path: {e}", argv=argv)
        need, have = pred["kv_mib"] * MIB, _host_memory()
        if need > have:
            why = (f"the KV cache for --ctx-size {pred['max_total_num_tokens']:,} needs {need / 2**30:,.1f} GiB, this host has "
                   f"{have / 2**30:,.1f} GiB: llama-server would fail to allocate it")
        elif pred["context_len"] < longest:
            why = (f"not even one request at the workload's longest context ({longest:,} tokens) fits: "
                   f"{pred['context_len']:,} tokens per slot ({pred['max_total_num_tokens']:,} / {pred['max_running_requests']} slots)")
        pred["requests_at_longest"] = None if why else pred["max_total_num_tokens"] // max(longest, 1)
        details = [] if pred["context_len"] <= pred["context_train"] or not pred["context_train"] else [
            {"id": "tune.llama.context", "status": "warn",
             "title": f"{pred['context_len']:,} tokens per slot exceed the model's training context {pred['context_train']:,}"}]
        return PreCheck("skipped" if why else "ok", why or "", details, pred, argv)

    def precheck_many(self, specs: list[Deployment], longest: int, buckets: list[int]) -> list[PreCheck]:
        return [self.precheck(s, longest, buckets) for s in specs]     # --help is read once per binary (flag_table)

    def launch_env(self, spec: Deployment) -> tuple[list[str], dict[str, str]]:
        s = spec.serving
        argv = [str(binary(spec)), "-m", str(spec.resolve_path(spec.model.path)), "--host", s.host, "--port", str(s.port),
                "--alias", spec.model.served_name or spec.name, "--log-verbosity", "4", *_flag_args(dict(s.flags))]
        return argv, dict(s.env)

    def ready_path(self, spec: Deployment) -> str:
        return "/health"

    def startup(self, spec: Deployment, log_path: Any, pre: PreCheck) -> Startup:
        try:
            text = Path(log_path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            return Startup(details=[{"id": "tune.llama.log", "status": "skip", "title": f"no start-up log: {e}"}])
        obs: dict[str, Any] = {}
        for m in _CTX_LINE.finditer(text):
            obs[m.group(1)] = int(m.group(2))
        kvm = _KV_LINE.search(text)
        if kvm:
            obs.update({"kv_mib": float(kvm.group(1)), "kv_dtype": f"K {kvm.group(6)}, V {kvm.group(8)}"})
        out = {"kv_dtype": obs.get("kv_dtype"), "max_total_num_tokens": obs.get("n_ctx"),
               "max_running_requests": obs.get("n_seq_max"), "context_len": obs.get("n_ctx_seq"), "kv_mib": obs.get("kv_mib")}
        details = []
        if kvm and pre.predicted.get("kv_mib"):
            ok = abs(out["kv_mib"] - pre.predicted["kv_mib"]) <= max(0.02, 0.01 * pre.predicted["kv_mib"])
            details.append({"id": "tune.llama.kv", "status": "pass" if ok else "warn",
                            "title": f"KV cache {out['kv_mib']} MiB allocated, {pre.predicted['kv_mib']} MiB predicted"})
        errors = [ln.strip() for ln in text.splitlines() if _ERROR_LINE.search(ln) and " W " not in ln]
        return Startup(out, details, errors[-1][:300] if errors and not kvm else None)

    def live(self, spec: Deployment, url: str) -> dict[str, Any]:
        return {}        # the start-up log already says what it allocated; /props repeats the flags


ENGINE = Llama()
