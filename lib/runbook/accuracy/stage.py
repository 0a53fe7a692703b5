"""Stage 50's contract and entry point: the offline KV-quantization study plus the live recall, greedy-identity and
tool-call probes (each a `skip` finding when its endpoint is not given or not reachable)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from runbook.core.archive import number
from runbook.core.findings import Finding
from runbook.core.options import Fraction, Integer, Options, PosInt, Url
from runbook.core.registry import Outcome, Stage, register
from runbook.core.spec import SLO, Deployment

if TYPE_CHECKING:
    from runbook.accuracy import kvquant


@dataclass
class AccuracyReport:
    study: kvquant.Study
    active: tuple[str, str]                       # this deployment's KV (format, scaling)
    recall: dict[str, Any] = field(default_factory=dict)
    identity: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    toolcall: dict[str, Any] = field(default_factory=dict)     # accuracy.toolcall.ToolCallReport.data()
    identity_batch: list[dict[str, Any]] = field(default_factory=list)         # url at concurrency 1 vs N
    identity_differences: list[dict[str, Any]] = field(default_factory=list)   # what differs between identity's A and B

    def data(self) -> dict[str, Any]:
        return {"kvquant": {"rows": self.study.rows, "growth": self.study.growth, "source": self.study.source,
                            "active": list(self.active)},
                "recall": dict(self.recall), "identity": self.identity, "identity_batch": self.identity_batch,
                "identity_differences": self.identity_differences, "toolcall": dict(self.toolcall)}


def assess(spec: Deployment, url: str | None = None, compare_url: str | None = None, spec_off_url: str | None = None,
           lengths: Sequence[int] | None = None, depths: Sequence[float] | None = None,
           tokenizer: str | None = None, seed: int = 0, per_cell: int = 1, artifact_dir: str | Path | None = None,
           prompts: int = 8, max_tokens: int = 64, toolcall_max_tokens: int = 1024,
           tool_choice: str = "auto", concurrency: int = 8) -> AccuracyReport:
    """Empty or None arguments mean the spec's value (lengths up to its --context-length). Greedy identity compares
    `url` with `spec_off_url`, else with `compare_url`: its findings name what differs between the two."""
    from runbook.accuracy import kvquant, probes, toolcall  # numeric and HTTP stacks: only when the stage runs

    active = probes.deployment_format(spec)
    study = kvquant.run(spec.accuracy, active=active)
    rec, recall_findings = probes.run_recall(url or None, probes.recall_lengths(spec, list(lengths or [])),
                                             list(depths or spec.accuracy.recall_depths), tokenizer or None,
                                             compare_url or None, seed, per_cell, Path(artifact_dir) if artifact_dir else None,
                                             spec.serving.api_key_env)
    key = _api_key(spec)
    ident = probes.run_identity(url or None, spec_off_url or compare_url or None, prompts, max_tokens, tokenizer or None,
                                concurrency=concurrency, api_key=key)
    tc = toolcall.run(url or None, api_key=key, max_tokens=toolcall_max_tokens, tool_choice=tool_choice)
    return AccuracyReport(study, active, rec, ident.rows, study.findings + recall_findings + ident.findings + tc.findings,
                          tc.data(), ident.batch, ident.differences)


PROBES = ("kvquant", "recall", "identity", "report", "toolcall")


class AccuracyOptions(Options):
    probe: Literal["kvquant", "recall", "identity", "report", "toolcall"] = Field(
        "report", description="report: all four, what 50_accuracy shows (live probes skip without --url)")
    url: Url | None = Field(None, description="recall: the endpoint (default: the spec's); identity: A, and the server "
                                              "checked for batch invariance")
    compare_url: Url | None = Field(None, description="recall, report: A/B second endpoint (e.g. BF16 KV); identity: B, a "
                                                      "server that differs from A in the setting to test")
    spec_off_url: Url | None = Field(None, description="report, identity: B when it is not compare_url (e.g. the same model "
                                                       "with speculative decoding off)")
    lengths: list[PosInt] | None = Field(None, description="recall: haystack token lengths (default: the spec's, up to --context-length)")
    depths: list[Fraction] | None = Field(None, description="recall: needle depths as fractions (default: the spec's)")
    per_cell: PosInt = Field(1, description="recall: needles per length × depth cell")
    tokenizer: str | None = Field(None, description="dir with tokenizer.json: exact prompt lengths")
    seed: Integer = Field(0, description="the prompts are deterministic from this seed")
    prompts: PosInt = Field(8, description="identity: number of prompts")
    max_tokens: PosInt = Field(64, description="identity: greedy tokens per prompt")
    concurrency: PosInt = Field(8, description="identity, report: the prompts sent this many at once, against their answers "
                                               "one at a time (batch invariance; 1: not checked)")
    model: str | None = Field(None, description="toolcall: the served model name (default: the first /v1/models lists)")
    tool_choice: Literal["auto", "required"] = Field(
        "auto", description="toolcall, report: auto (default: what agent loops send) or required (the server must call a "
                            "tool; prose is then a fail: the chat template or parser ignores the tools)")
    toolcall_max_tokens: PosInt = Field(1024, description="toolcall, report: tokens per tool-call answer")
    out: str | None = Field(None, description="recall, report: archive the prompts here")


def evaluate(spec: Deployment, options: AccuracyOptions) -> AccuracyReport:
    o = options
    return assess(spec, o.url, o.compare_url, o.spec_off_url, o.lengths, o.depths, o.tokenizer, o.seed, o.per_cell, o.out,
                  o.prompts, o.max_tokens, o.toolcall_max_tokens, o.tool_choice, o.concurrency)



def _api_key(spec: Deployment) -> str | None:
    env = spec.serving.api_key_env
    return (os.environ.get(env) or None) if env else None


def _kvquant(spec: Deployment, o: AccuracyOptions) -> Outcome:
    from runbook.accuracy import kvquant, probes  # lazy: numpy and ml_dtypes (~0.7 s) only when a probe runs

    st = kvquant.run(spec.accuracy, active=probes.deployment_format(spec))
    return Outcome(st.findings, {"kvquant": st.to_json()})


def _recall(spec: Deployment, o: AccuracyOptions) -> Outcome:
    from runbook.accuracy import probes  # lazy: numpy and aiohttp only when a probe runs

    rec, findings = probes.run_recall(o.url or spec.serving.local_url, probes.recall_lengths(spec, o.lengths),
                                      o.depths or list(spec.accuracy.recall_depths), o.tokenizer, o.compare_url, o.seed,
                                      o.per_cell, Path(o.out) if o.out else None, spec.serving.api_key_env)
    return Outcome(findings, {"recall": rec})


def _toolcall(spec: Deployment, o: AccuracyOptions) -> Outcome:
    from runbook.accuracy import toolcall  # lazy: aiohttp only when a probe runs

    tc = toolcall.run(o.url or spec.serving.local_url, o.model, _api_key(spec), tool_choice=o.tool_choice,
                      max_tokens=o.toolcall_max_tokens)
    return Outcome(tc.findings, {"toolcall": tc.data()})


def _identity(spec: Deployment, o: AccuracyOptions) -> Outcome:
    from runbook.accuracy import probes  # lazy: numpy and aiohttp only when a probe runs

    ident = probes.run_identity(o.url, o.compare_url or o.spec_off_url, o.prompts, o.max_tokens, o.tokenizer, o.model,
                                o.concurrency, _api_key(spec))
    return Outcome(ident.findings, {"identity": ident.rows, "identity_batch": ident.batch,
                                    "identity_differences": ident.differences})


def figures(data: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    """recall (share of needles found), greedy_identical (share of identical prompts) and the KV study's
    largest attention-output error for this deployment's own KV format."""
    out: dict[str, Any] = {}
    grid = [c for c in ((data.get("recall") or {}).get("grid") or []) if isinstance(c, dict)]
    total = sum(int(c.get("total") or 0) for c in grid)
    if total:
        out["recall"] = round(sum(int(c.get("correct") or 0) for c in grid) / total, 4)
    ident = [r for r in (data.get("identity") or []) if isinstance(r, dict)]
    if ident:
        out["greedy_identical"] = round(sum(1 for r in ident if r.get("identical")) / len(ident), 4)
    kvq = data.get("kvquant") or {}
    rows = [r for r in (kvq.get("rows") or []) if isinstance(r, dict)]
    active = kvq.get("active")
    if rows and isinstance(active, list) and len(active) == 2:
        errs = [e for e in (number(r.get("attn_out_rel_err")) for r in rows if [r.get("format"), r.get("scaling")] == active)
                if e is not None]
        if errs:
            out["kvquant_attn_rel_err_max"] = round(max(errs), 6)
    return out


STAGE = register(Stage(50, "accuracy", "accuracy",
                       "KV-quantization error offline; long-context recall, greedy identity and tool calls live",
                       AccuracyOptions, evaluate, figures=figures, trends=("recall", "greedy_identical", "kvquant_attn_rel_err_max"),
                       runner_params={"artifact_dir": "out"},
                       actions={"kvquant": _kvquant, "recall": _recall, "toolcall": _toolcall, "identity": _identity},
                       action_field="probe"))
