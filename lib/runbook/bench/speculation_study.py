"""The speculative-decoding study (`runbook bench --speculation`): the same prompts of each corpus kind and context
length sent one at a time to a server that speculates (`--url`) and to the same server with speculation off
(`--speculation-baseline-url`), its /metrics read before and after each bucket; the figures are speculation.py's.

Kinds: `code` (the corpus's code text cut to exactly the context length, completions: the longctx workload),
`agentic` (an agentic session's opening turn over chat: system prompt, that many tokens of repository context and a
coding question), `random` (uniformly random token ids: the random workload). One request at a time, so each
bucket's /metrics deltas are its own and no batching blurs the decode rate. llama-server cannot turn speculation
off per request (its `speculative.*` request fields are compiled out in 0.3.36's server-schema.cpp), hence two
servers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runbook.bench import speculation
from runbook.bench.settings import BenchSettings
from runbook.bench.workloads.base import BuildContext
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.endpoint.client import Client
from runbook.endpoint.reach import fetch_json, run_sync
from runbook.endpoint.records import RequestRecord, RequestSpec


@dataclass
class StudyResult:
    """The study's buckets (speculation.bucket_row), its findings (the verdict first) and the raw records."""
    mode: str
    rows: list[dict[str, Any]]
    findings: list[Finding]
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        return {"mode": self.mode, "buckets": self.rows,
                "real": speculation.pooled(self.rows, True), "random": speculation.pooled(self.rows, False)}


def requests_for(kind: str, context: int, n: int, output_len: int, tokenizer: Any, tokenizer_dir: str | None,
                 seed: int = 0) -> list[RequestSpec]:
    """`n` prompts of `kind` at `context` tokens, built by the bench workloads (the same bytes on every commit)."""
    from runbook.bench import sessions, workloads  # lazy: the workload registry and numpy only when the study runs

    o = BenchSettings.resolve(None, workload="longctx" if kind == "code" else kind, input_len=context,
                              output_len=output_len, seed=seed, tokenizer=tokenizer_dir)
    ctx = BuildContext(tokenizer, tokenizer.get_vocab_size() if tokenizer is not None else None, ignore_eos=False)
    if kind == "agentic":
        from runbook.model.tokenizer import chat_counter  # lazy: jinja2 only for chat prompts

        sp = sessions.SessionPlan(n, o, tokenizer, chat=chat_counter(tokenizer_dir, tokenizer), ignore_eos=False)
        return [RequestSpec(k, m, output_len, sp.prompt_tokens(m), False) for k in range(n) for m in [sp.opening(k)]]
    if kind not in speculation.KINDS:
        raise InputError(f"speculation kind {kind}: one of {', '.join(speculation.KINDS)}")
    return list(workloads.WORKLOADS[o.workload].build(o, n, ctx).requests)


@dataclass
class Collected:
    """One server's answers to one bucket's prompts, and its /metrics counters' deltas over them (None: no /metrics)."""
    records: list[RequestRecord]
    deltas: dict[str, float] | None = None


Plan = dict[str, tuple[str, int, list[RequestSpec]]]     # "code-256" -> (kind, context tokens, its prompts)


def plan(o: BenchSettings, kinds: tuple[str, ...] = speculation.KINDS) -> Plan:
    """Every bucket's prompts under `o` (speculation_contexts, speculation_requests, output_len, seed, tokenizer), built
    before any server is asked: a bad kind or tokenizer is an InputError first."""
    from runbook.model.tokenizer import load_tokenizer  # lazy: tokenizers only when the study runs

    bad = [k for k in kinds if k not in speculation.KINDS]
    if bad:
        raise InputError(f"speculation kinds {','.join(bad)}: each one of {', '.join(speculation.KINDS)}")
    tok = load_tokenizer(o.tokenizer)
    return {f"{k}-{c}": (k, c, requests_for(k, c, o.speculation_requests, o.output_len, tok, o.tokenizer, o.seed))
            for c in o.speculation_contexts for k in kinds}


def is_chat(reqs: list[RequestSpec]) -> bool:
    """Chat messages (a list of dicts), not a completion's text or token ids (a list of ints)."""
    return bool(reqs) and isinstance(reqs[0].prompt, list) and bool(reqs[0].prompt) and isinstance(reqs[0].prompt[0], dict)


def collect(url: str, buckets: Plan, model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0,
            tokenizer_dir: str | None = None) -> dict[str, Collected]:
    """Each bucket's prompts sent to `url` one at a time, its /metrics read before and after the bucket."""
    from runbook.bench.sweep import scrape, server_deltas  # lazy: prometheus_client and aiohttp only when the study runs
    from runbook.model.tokenizer import load_tokenizer  # lazy: as above

    tok = load_tokenizer(tokenizer_dir)
    clients = {chat: Client(url, model, chat, api_key, timeout_s, tok) for chat in (False, True)}

    async def go() -> dict[str, Collected]:
        out = {}
        for name, (_, _, reqs) in buckets.items():
            client = clients[is_chat(reqs)]
            async with client.session(limit=1) as s:
                before = await scrape(s, client.base_url)
                recs = [await client.send(s, r, name) for r in reqs]
                after = await scrape(s, client.base_url)
            out[name] = Collected(recs, server_deltas(before, after).get("deltas"))
        return out

    return run_sync(go())


def summarise(buckets: Plan, spec: dict[str, Collected], base: dict[str, Collected] | None, mode: str = "") -> StudyResult:
    """The buckets' figures from the speculating server's answers and the baseline's (None: no speed-up)."""
    rows: list[dict[str, Any]] = []
    problems: dict[str, list[str]] = {}
    records: dict[str, list[RequestRecord]] = {}
    for name, (kind, ctx, _) in buckets.items():
        got = spec.get(name) or Collected([])
        off = (base or {}).get(name) or Collected([])
        row, problems[name] = speculation.bucket_row(kind, ctx, got.records, off.records, got.deltas)
        rows.append(row)
        records[name] = got.records + off.records
    findings = [speculation.verdict(rows, mode)] + speculation.problem_findings(problems)
    if base is None:
        findings.append(Finding("bench.spec.baseline", "info", "speculative decoding: no speed-up measured",
                                detail="no server with speculation off was given",
                                remedy="Start the same server without --spec-type/--model-draft and pass --speculation-baseline-url."))
    return StudyResult(mode, rows, findings, records)


def server_mode(url: str, api_key: str | None = None) -> str:
    """What speculation the server runs, as far as it says: llama-server's /props `speculative.types` where it names
    one; else its /slots `speculative` flag ("on" / "none"; 0.3.36's /props reports `none` per slot even while the
    server speculates); "" where neither answers."""
    base = url.rstrip("/")
    try:
        props = fetch_json(base + "/props", api_key, 10.0)
        v = ((props.get("default_generation_settings") or {}).get("params") or {}).get("speculative.types")
        if isinstance(v, str) and v and v != "none":
            return v
    except Exception:  # an unknown mode is said as such, never a failure of the study
        pass
    try:
        slots = fetch_json(base + "/slots", api_key, 10.0, expect=list)
        flags = {s.get("speculative") for s in slots if isinstance(s, dict)}
        return "on" if True in flags else "none" if flags == {False} else ""
    except Exception:  # as above
        return ""


def run(o: BenchSettings, model: str | None = None, api_key: str | None = None) -> StudyResult:
    """The study against `o.server` (speculating) and `o.speculation_baseline_url` (the same server with speculation off;
    None: no speed-up)."""
    buckets = plan(o)
    mode = server_mode(o.server, api_key)
    spec = collect(o.server, buckets, model, api_key, o.timeout, o.tokenizer)
    base = collect(o.speculation_baseline_url, buckets, model, api_key, o.timeout, o.tokenizer) if o.speculation_baseline_url else None
    return summarise(buckets, spec, base, mode)
