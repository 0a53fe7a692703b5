"""Greedy identity: the same prompts against two configurations of a server (speculative decoding on/off, FP8 vs
BF16 KV, radix cache on/off, another SGLang version) must give the same greedy output; and one server at
concurrency 1 vs N must too (batch invariance: accuracy under load).

Every finding names the difference that was actually tested, derived from the two servers' /server_info
(their resolved arguments and version), never assumed: a remedy about speculative decoding for servers that
differ in their KV dtype sends the reader after the wrong cause."""
from __future__ import annotations

import asyncio
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runbook.accuracy.settings import AccuracySettings
from runbook.core.findings import Finding, Status
from runbook.core.secrets import MASK, is_secret_key
from runbook.endpoint.client import Client, RequestSpec
from runbook.endpoint.reach import BadResponse, fetch_json
from runbook.service import redact_server_info


def first_difference(a: str, b: str, tokenizer: Any = None) -> int | None:
    """Index of the first differing token (characters without a tokenizer); None when identical."""
    if a == b:
        return None
    xs = tokenizer.encode(a, add_special_tokens=False).ids if tokenizer is not None else list(a)
    ys = tokenizer.encode(b, add_special_tokens=False).ids if tokenizer is not None else list(b)
    for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
        if x != y:
            return i
    return min(len(xs), len(ys))


async def greedy_outputs(s: AccuracySettings, url: str, texts: Sequence[str], batched: bool = False) -> list[Any]:
    """Greedy completions of `texts` (s.max_tokens each): one at a time (batching cannot be what differs), else
    (`batched`) up to s.batch_size in flight together, so that the server batches them."""
    c = Client(url, s.model, api_key=s.api_key)
    n = s.batch_size if batched else 1
    async with c.session(limit=n) as session:
        if n <= 1:
            return [await c.send(session, RequestSpec(i, p, s.max_tokens, ignore_eos=False)) for i, p in enumerate(texts)]
        sem = asyncio.Semaphore(n)

        async def one(i: int, p: str) -> Any:
            async with sem:
                return await c.send(session, RequestSpec(i, p, s.max_tokens, ignore_eos=False))
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(texts))))


# ---------------------------------------------------------------- what differs between the two servers

@dataclass(frozen=True)
class Group:
    kind: str
    label: str
    keys: tuple[str, ...] = ()
    prefix: str = ""
    remedy: str = ""


_SPEC_REMEDY = ("Speculative decoding changed greedy output: check the draft/verify path (dtype, backend) before "
                "enabling it.")
# Server arguments that can change the tokens of a greedy completion, grouped by what a remedy is about, in the
# order a remedy names them (the first group that differs leads). A differing argument in none of these groups
# and not in INCIDENTAL is reported by its own name.
GROUPS: tuple[Group, ...] = (
    Group("version", "SGLang version", ("version",), remedy=(
        "Greedy output changed between SGLang versions: kernels and defaults change between releases. Run the recall "
        "and tool-call probes on the new version before upgrading (tune's upgrade canary).")),
    Group("model", "model weights", ("model_path", "revision", "load_format", "json_model_override_args"), remedy=(
        "The servers load different weights: different greedy output is expected. Compare one model under two "
        "settings to judge a setting.")),
    Group("precision", "weight dtype or quantization", ("dtype", "quantization", "modelopt_quant", "enable_fp32_lm_head"),
          remedy=("Weight precision differs: different greedy output is expected; judge the change with the recall A/B "
                  "(compare_url), not identity.")),
    Group("kv", "KV cache dtype", ("kv_cache_dtype", "quantization_param_path", "kv_bytes_per_token"), remedy=(
        "The KV cache dtype changed greedy output. An FP8 KV cache without calibrated k/v scales runs at scale 1.0 "
        "(SGLang logs \"no scaling factors provided\"; `runbook verify` reads that line) and clips outliers: serve "
        "`--kv-cache-dtype bf16`, or a checkpoint with KV scales, and confirm with the recall A/B (compare_url). "
        "`auto` takes the checkpoint's KV dtype, FP8 when its quantization config says so.")),
    Group("speculative", "speculative decoding", prefix="speculative_", remedy=_SPEC_REMEDY),
    Group("radix", "radix cache", ("disable_radix_cache",), remedy=(
        "Prefix caching must not change greedy output: a cached prefix decoded differently from a recomputed one. "
        "Report it to SGLang with these prompts and serve with the radix cache off (disable-radix-cache) until then.")),
    Group("deterministic", "deterministic inference", ("enable_deterministic_inference",), remedy=(
        "Deterministic inference changed greedy output: without it, outputs depend on how requests are batched "
        "(see accuracy.identity.batch).")),
    Group("kernels", "kernels", ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                                 "sampling_backend", "model_impl", "enable_tf32_matmul"), remedy=(
        "Different kernels round differently, so greedy outputs part after a near-tie: judge the change with the "
        "recall A/B (compare_url) rather than identity.")),
    Group("scheduling", "batching and chunking", ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
                                                  "schedule_policy", "page_size", "enable_mixed_chunk",
                                                  "enable_dynamic_chunking"), remedy=(
        "Batch and chunk shapes change the order of reductions, and with it greedy output: SGLang's deterministic "
        "inference (enable-deterministic-inference) makes outputs independent of them.")),
)
_GROUP_OF: dict[str, Group] = {k: g for g in GROUPS for k in g.keys}
# Arguments and state that cannot change the tokens of a greedy /v1/completions answer: addresses, seeds (greedy
# draws nothing), how much memory the pool takes, post-processing of chat answers, logging, metrics, timing.
INCIDENTAL = frozenset({
    "host", "port", "random_seed", "status", "startup_time", "internal_states", "max_total_num_tokens",
    "max_total_tokens", "mem_fraction_static", "served_model_name", "tool_call_parser", "reasoning_parser",
    "log_level", "log_level_http", "log_requests", "log_requests_level", "enable_metrics", "api_key",
    "admin_api_key", "launch_command", "sleep_on_idle", "enable_cache_report", "show_time_cost", "tokenizer_worker_num",
    "watchdog_timeout", "dist_timeout", "file_storage_path", "dist_init_addr", "nccl_port", "crash_dump_folder",
    "dump_requests_folder",
})
_INCIDENTAL_SUFFIXES = ("_port", "_ports", "_dir", "_folder", "_url", "_urls", "_endpoint", "_timeout")


def _incidental(key: str) -> bool:
    return key in INCIDENTAL or key.endswith(_INCIDENTAL_SUFFIXES) or key.startswith(("log_", "enable_metrics"))


def _group(key: str) -> Group | None:
    if key in _GROUP_OF:
        return _GROUP_OF[key]
    return next((g for g in GROUPS if g.prefix and key.startswith(g.prefix)), None)


def server_config(url: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
    """The server's /server_info (SGLang: its resolved arguments, version and state), secrets masked;
    None when it has none (llama-server, another OpenAI-compatible server) or does not answer."""
    base = url.rstrip("/")
    for path in ("/server_info", "/get_server_info"):        # the second: SGLang before /server_info
        try:
            info = fetch_json(base + path, api_key, timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                continue
            return None
        except (OSError, BadResponse, ValueError):
            return None
        if isinstance(info, dict):
            out = redact_server_info(info, api_key)     # also launch_command's --api-key value
            bpt = kv_bytes_per_token(info)
            if bpt is not None:
                out["kv_bytes_per_token"] = bpt
            return out
    return None


def kv_bytes_per_token(info: dict[str, Any]) -> int | None:
    """KV bytes per token of the live pool (memory_usage: kvcache GB over token_capacity), to the nearest 64 B: the
    effective KV dtype even where --kv-cache-dtype says `auto`."""
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    mem = first.get("memory_usage")
    if not isinstance(mem, dict):
        return None
    gb, tokens = mem.get("kvcache"), mem.get("token_capacity")
    if not (isinstance(gb, (int, float)) and isinstance(tokens, int) and gb > 0 and tokens > 0):
        return None
    return int(round(gb * 2**30 / tokens / 64) * 64)


def _show(key: str, v: Any) -> str:
    if key == "disable_radix_cache" and isinstance(v, bool):
        return "off" if v else "on"
    if key == "speculative_algorithm" and v in (None, "", "NONE"):
        return "off"
    if key == "kv_bytes_per_token" and isinstance(v, int):
        return f"{v:,} B/token"
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def config_differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What differs between two /server_info answers: one row per argument (`key`, `what` it is about, `a`, `b`,
    `effect`: `output` when it can change greedy tokens, `none` when it cannot). Secret values never appear."""
    if not (a and b):
        return []
    rows = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb or key == "kv_bytes_per_token":
            continue
        g = _group(key)
        secret = is_secret_key(key)
        main = g is not None and key == (g.keys[0] if g.keys else g.prefix + "algorithm")
        rows.append({"key": key, "what": (g.label if main else f"{g.label} ({key})") if g else key,
                     "kind": g.kind if g else "other",
                     "a": MASK if secret and va else _show(key, va), "b": MASK if secret and vb else _show(key, vb),
                     "effect": "none" if (_incidental(key) or secret) and not g else "output"})
    ba, bb = a.get("kv_bytes_per_token"), b.get("kv_bytes_per_token")
    # Same --kv-cache-dtype, different bytes per token: `auto` resolved to different dtypes (a checkpoint's FP8).
    if (isinstance(ba, int) and isinstance(bb, int) and not any(r["kind"] == "kv" for r in rows)
            and a.get("model_path") == b.get("model_path") and max(ba, bb) >= 1.5 * min(ba, bb)):
        rows.append({"key": "kv_bytes_per_token", "what": "KV cache dtype (bytes per token)", "kind": "kv",
                     "a": _show("kv_bytes_per_token", ba), "b": _show("kv_bytes_per_token", bb), "effect": "output"})
    return rows


def tested_difference(diffs: Sequence[dict[str, Any]], known: bool = True) -> str:
    """The difference between the two servers in words, output-relevant ones only ('KV cache dtype: auto vs
    fp8_e4m3')."""
    if not known:
        return "what differs is unknown (no /server_info)"
    out = [d for d in diffs if d["effect"] == "output"]
    if not out:
        return "no difference in their configuration"
    return "; ".join(f"{d['what']}: {d['a']} vs {d['b']}" for d in out[:6]) + ("; …" if len(out) > 6 else "")


def remedy_for(diffs: Sequence[dict[str, Any]], known: bool = True, urls: Sequence[str] = ()) -> str:
    """What to do about differing greedy output, for the difference actually tested."""
    if not known:
        return ("What differs between the two servers is unknown: " + (", ".join(urls) or "one of them")
                + " has no /server_info (not SGLang?). Compare two servers that differ in one setting you know.")
    out = [d for d in diffs if d["effect"] == "output"]
    if not out:
        return ("Both servers report the same configuration, yet greedy output differs: the serving path is not "
                "deterministic (batching with other traffic, kernels chosen by shape); see accuracy.identity.batch. "
                "SGLang's deterministic inference (enable-deterministic-inference) makes it so.")
    kinds: list[str] = []
    for d in out:
        if d["kind"] not in kinds:
            kinds.append(d["kind"])
    order = [g.kind for g in GROUPS] + ["other"]
    kinds.sort(key=order.index)
    first = next((g for g in GROUPS if g.kind == kinds[0]), None)
    text = first.remedy if first else (
        "The servers differ in " + ", ".join(d["key"] for d in out[:6]) + ": one of these changed greedy output.")
    if len(kinds) > 1:
        labels = [next((g.label for g in GROUPS if g.kind == k), "other arguments") for k in kinds]
        text = (f"The servers differ in more than one way ({', '.join(labels)}): change one at a time to learn which "
                f"changed greedy output. {text}")
    return text


def _head(p: Any, n: int = 32) -> str:
    s = " ".join(str(p).split())
    return repr(s if len(s) <= n else s[:n - 1] + "…")


def _rows(a: Sequence[Any], b: Sequence[Any], tokenizer: Any, prompts: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for ra, rb in zip(a, b, strict=True):
        pos = first_difference(ra.text, rb.text, tokenizer)
        ok = all(r.error_kind in (None, "no_output") for r in (ra, rb))   # an empty greedy output is still an output
        rows.append({"id": ra.id, "prompt": str(prompts[ra.id])[:200], "identical": pos is None and ok,
                     "first_diff": pos, "a": ra.text, "b": rb.text, "error": None if ok else (ra.error or rb.error)})
    return rows


def _evidence(bad: Sequence[dict[str, Any]], unit: str) -> str:
    return "; ".join(f"prompt {r['id']} {_head(r['prompt'])}: " + (f"error {str(r['error'])[:80]}" if r["error"]
                     else f"first differing {unit} {r['first_diff']}") for r in bad[:6]) + ("; …" if len(bad) > 6 else "")


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    differences: list[dict[str, Any]]
    finding: Finding


async def compare(s: AccuracySettings, url_a: str, url_b: str, texts: Sequence[str], tok: Any = None,
                  configs: tuple[dict[str, Any] | None, dict[str, Any] | None] | None = None) -> tuple[list[dict[str, Any]], list[Finding]]:
    """(rows, [finding]) for the same prompts against two servers (A, B), one request at a time; `tok`: a loaded
    tokenizer (differences in tokens, else in characters)."""
    c = await compare_configs(s, url_a, url_b, texts, tok, configs)
    return c.rows, [c.finding]


async def compare_configs(s: AccuracySettings, url_a: str, url_b: str, texts: Sequence[str], tok: Any = None,
                          configs: tuple[dict[str, Any] | None, dict[str, Any] | None] | None = None) -> Comparison:
    """The pair check with what differs between the servers: read from their /server_info unless `configs` gives it."""
    if configs is None:
        configs = (await asyncio.to_thread(server_config, url_a, s.api_key), await asyncio.to_thread(server_config, url_b, s.api_key))
    ca, cb = configs
    known = ca is not None and cb is not None
    diffs = config_differences(ca, cb)
    a = await greedy_outputs(s, url_a, texts)
    b = await greedy_outputs(s, url_b, texts)
    rows = _rows(a, b, tok, texts)
    bad = [r for r in rows if not r["identical"]]
    unit = "token" if tok is not None else "character"
    tested = tested_difference(diffs, known)
    incidental = [d for d in diffs if d["effect"] == "none" and d["key"] not in ("startup_time", "internal_states")]
    detail = f"A = {url_a}, B = {url_b}; tested: {tested}" + (
        "; also differ, without effect on greedy completions: " + ", ".join(f"{d['key']} ({d['a']} vs {d['b']})"
                                                                             for d in incidental[:5]) if incidental else "")
    if bad:
        f = Finding("accuracy.identity.mismatch", "fail",
                    f"greedy outputs differ on {len(bad)} of {len(rows)} prompts — {tested}", detail=detail,
                    evidence=_evidence(bad, unit), remedy=remedy_for(diffs, known, [u for u, c in ((url_a, ca), (url_b, cb)) if c is None]))
    else:
        f = Finding("accuracy.identity.mismatch", "pass", f"greedy outputs identical on all {len(rows)} prompts — {tested}",
                    detail=detail)
    return Comparison(rows, diffs, f)


BATCH_REMEDY = ("Greedy output depends on what else is in the batch: batched kernels reduce in another order at other "
                "batch shapes, and a near-tie flips. Measure accuracy at the load you serve (recall and tool calls under "
                "concurrency); SGLang's deterministic inference (enable-deterministic-inference) makes outputs batch-"
                "invariant at a cost in speed (bench it).")


async def batch_invariance(s: AccuracySettings, url: str, texts: Sequence[str],
                           tok: Any = None) -> tuple[list[dict[str, Any]], Finding]:
    """The same prompts against one server one at a time (A), then s.batch_size at once (B): greedy output must not
    depend on the batch it was decoded in. A difference is a `warn`: accuracy under load differs from the
    accuracy measured one request at a time."""
    a = await greedy_outputs(s, url, texts)
    b = await greedy_outputs(s, url, texts, batched=True)
    rows = _rows(a, b, tok, texts)
    bad = [r for r in rows if not r["identical"]]
    unit = "token" if tok is not None else "character"
    n = min(s.batch_size, len(texts))
    detail = f"{url}: {len(texts)} prompts one at a time (A), then {n} at once (B), {s.max_tokens} greedy tokens each"
    status: Status = "warn" if bad else "pass"
    if bad:
        return rows, Finding("accuracy.identity.batch", status,
                             f"greedy outputs change under load: {len(bad)} of {len(rows)} prompts differ between "
                             f"concurrency 1 and {n}", detail=detail, evidence=_evidence(bad, unit), remedy=BATCH_REMEDY)
    return rows, Finding("accuracy.identity.batch", status,
                         f"batch invariant: greedy outputs identical at concurrency 1 and {n} on all {len(rows)} prompts",
                         detail=detail)
