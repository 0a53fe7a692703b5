"""The speculative-decoding study (`runbook bench --spec-study`): the same prompts of each corpus kind and context
length sent one at a time to a server that speculates (`--url`) and to the same server with speculation off
(`--spec-baseline-url`), its /metrics read before and after each bucket; the figures are speculation.py's.

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

        plan = sessions.SessionPlan(n, o, tokenizer, chat=chat_counter(tokenizer_dir, tokenizer), ignore_eos=False)
        return [RequestSpec(k, m, output_len, plan.prompt_tokens(m), False) for k in range(n) for m in [plan.opening(k)]]
    if kind not in speculation.KINDS:
        raise InputError(f"--spec-kinds {kind}: one of {', '.join(speculation.KINDS)}")
    return list(workloads.WORKLOADS[o.workload].build(o, n, ctx).requests)


async def _scrape(session: Any, url: str) -> dict[str, float] | None:
    from runbook.bench.sweep import scrape  # lazy: prometheus_client only when the study runs

    return await scrape(session, url)


async def _bucket(spec_clients: dict[bool, Client], base_clients: dict[bool, Client] | None, reqs: list[RequestSpec]
                  ) -> tuple[list[RequestRecord], list[RequestRecord], dict[str, float] | None]:
    """The bucket's prompts one at a time: to the speculating server between two /metrics reads, then to the baseline."""
    from runbook.bench.sweep import server_deltas  # lazy: with the scrape

    chat = bool(reqs) and isinstance(reqs[0].prompt, list)
    client = spec_clients[chat]
    async with client.session(limit=1) as s:
        before = await _scrape(s, client.base_url)
        spec = [await client.send(s, r, "spec") for r in reqs]
        after = await _scrape(s, client.base_url)
    base: list[RequestRecord] = []
    if base_clients is not None:
        async with base_clients[chat].session(limit=1) as s:
            base = [await base_clients[chat].send(s, r, "base") for r in reqs]
    return spec, base, server_deltas(before, after).get("deltas")


def server_mode(url: str, api_key: str | None = None) -> str:
    """What speculation the server says it runs: llama-server's /props `speculative.types` ('' where not said)."""
    try:
        props = fetch_json(url.rstrip("/") + "/props", api_key, 10.0)
        params = (props.get("default_generation_settings") or {}).get("params") or {}
        v = params.get("speculative.types")
        return str(v) if isinstance(v, (str, list)) and v else ""
    except Exception:  # noqa: BLE001 - an unknown mode is said as such, never a failure of the study
        return ""


def run(url: str, baseline_url: str | None = None, kinds: tuple[str, ...] = speculation.KINDS,
        contexts: tuple[int, ...] = (256, 1024), requests: int = 3, output_len: int = 64, tokenizer_dir: str | None = None,
        model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0, seed: int = 0) -> StudyResult:
    """The study against `url` (speculating) and `baseline_url` (the same server, speculation off; None: no speed-up)."""
    from runbook.model.tokenizer import load_tokenizer  # lazy: tokenizers only when the study runs

    bad = [k for k in kinds if k not in speculation.KINDS]
    if bad:
        raise InputError(f"--spec-kinds {','.join(bad)}: each one of {', '.join(speculation.KINDS)}")
    tok = load_tokenizer(tokenizer_dir)
    plans = {f"{k}-{c}": (k, c, requests_for(k, c, requests, output_len, tok, tokenizer_dir, seed)) for c in contexts for k in kinds}
    mode = server_mode(url, api_key)

    async def go() -> StudyResult:
        def pair(u: str) -> dict[bool, Client]:
            return {chat: Client(u, model, chat, api_key, timeout_s, tok) for chat in (False, True)}

        spec_clients, base_clients = pair(url), pair(baseline_url) if baseline_url else None
        rows: list[dict[str, Any]] = []
        problems: dict[str, list[str]] = {}
        records: dict[str, list[RequestRecord]] = {}
        for name, (kind, ctx, reqs) in plans.items():
            spec, base, deltas = await _bucket(spec_clients, base_clients, reqs)
            row, problems[name] = speculation.bucket_row(kind, ctx, spec, base, deltas)
            rows.append(row)
            records[name] = spec + base
        findings = [speculation.verdict(rows, mode)] + speculation.problem_findings(problems)
        if baseline_url is None:
            findings.append(Finding("bench.spec.baseline", "info", "speculative decoding: no speed-up measured",
                                    detail="no server with speculation off was given",
                                    remedy="Start the same server without --spec-type/--model-draft and pass --spec-baseline-url."))
        return StudyResult(mode, rows, findings, records)

    return run_sync(go())
