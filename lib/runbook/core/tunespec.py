"""The deployment spec's `tune:` section (stage 60): the candidates to try, what to measure them with,
and the time they may take. Built on the spec's shared base (specbase.py); core/spec.py makes it the
spec's `tune` section."""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from runbook.core.specbase import MAX_LIST, MAX_SECONDS, MAX_TOKENS, SLO, FlagValue, Strict, check_flag_names, check_flag_values
from runbook.core.topospec import Policy

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]{0,99}$")
REFERENCE = "reference"      # the candidate that is the deployment as the spec builds it
_Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
_Fraction = Annotated[float, Field(ge=0, le=1)]


def _flags(v: dict[str, FlagValue]) -> dict[str, FlagValue]:
    """Overlay flags pass the same checks as serving.flags (names, values, owned flags)."""
    return check_flag_names(check_flag_values(v))


class CandidateSpec(Strict):
    """One configuration to try, as the spec declares it (tune/candidates.py expands it into a `Candidate`): flags
    laid over serving.flags (null or false removes one)."""
    flags: dict[str, FlagValue] = Field(default_factory=dict, description="flags over serving.flags; null removes a flag")
    python: str | None = Field(default=None, description="another serving interpreter (an SGLang upgrade canary: same flags, "
                                                 "new version)")
    description: str = ""

    @field_validator("flags", mode="before")
    @classmethod
    def _check_flags(cls, v: object) -> object:
        return _flags(v) if isinstance(v, dict) else v    # type: ignore[arg-type]

    @field_validator("python")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must be an absolute path to a python (got {v!r})")
        return v


class Guard(Strict):
    """The accuracy guard: each candidate against the reference, on the same prompts."""
    identity_prompts: int = Field(default=4, ge=0, le=1000, description="greedy-identity prompts (0: off)")
    identity_max_tokens: int = Field(default=32, gt=0, le=MAX_TOKENS)
    min_identical_tokens: int = Field(default=16, ge=0, le=MAX_TOKENS, description="a prompt whose outputs first diverge before this "
                                      "token fails the guard (later divergence: batching numerics, reported only)")
    recall_lengths: list[_Tokens] = Field(default_factory=list, max_length=MAX_LIST,
                                          description="needle lengths (empty: accuracy.recall_lengths within the context)")
    recall_depths: list[_Fraction] = Field(default_factory=lambda: [0.5], max_length=MAX_LIST)
    max_recall_drop: float = Field(default=0.0, ge=0, le=1, description="recall below the reference's by more than this fails")
    toolcall: bool = Field(default=True, description="run the tool-call probe (fails when fewer cases pass than on the reference)")
    kld_windows: int = Field(default=2, ge=0, le=1000, description="SGLang: windows of the code corpus both servers score "
                             "for the KL divergence against the reference, its noise floor first (0: off; greedy identity "
                             "then judges)")
    kld_window_tokens: _Tokens = Field(default=512, description="token ids per KL-divergence window (at most the context)")


class Tune(Strict):
    engine: Literal["sglang", "llama-server"] = Field(default="sglang", description="the server tune launches; llama-server: "
                                                      "the CPU engine (serving.flags are its flags, model.path a GGUF file)")
    llama_server: str | None = Field(default=None, description="engine llama-server: its binary (relative to this file)")
    candidates: dict[str, CandidateSpec] = Field(default_factory=dict, description="named flag overlays")
    grid: dict[str, list[FlagValue]] = Field(default_factory=dict, description="flag -> values: one candidate per combination")
    gateway_policies: list[Policy] = Field(
        default_factory=list, max_length=16, description="where topology.gateway is declared: the gateway's --policy values "
        "to try against its own (each relaunches only the gateway, on a free port; the replicas stay up)")
    reference: str = Field(default=REFERENCE, description="the candidate the others are compared with (default: the spec as it "
                                                  "builds the unit)")
    workload: str = Field(default="agentic", description="benchmark workload (default: agentic coding sessions from the corpus)")
    concurrency: list[Annotated[int, Field(gt=0, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [1, 4, 16], max_length=MAX_LIST, description="fixed concurrency levels per candidate")
    requests_per_level: int = Field(default=32, gt=0, le=1_000_000)
    turns: int = Field(default=3, gt=0, le=1000, description="agentic: turns per session")
    input_len: int | None = Field(default=None, gt=0, le=MAX_TOKENS, description="default: benchmark.input_len")
    output_len: int | None = Field(default=None, gt=0, le=MAX_TOKENS, description="default: benchmark.output_len")
    slo_search: bool = Field(default=True, description="also search the highest concurrency meeting the SLOs (needs one)")
    search_levels: int = Field(default=6, gt=0, le=100, description="the SLO search's levels per candidate (bounds its time)")
    warm_search: bool = Field(default=False, description="also search how many agent sessions each candidate keeps warm "
                              "(bench --find-max warm, from a flushed cache; agentic workload, turns 2 or more): the knee "
                              "beside the plan's, e.g. across a grid of radix-eviction-policy values")
    slo: SLO | None = Field(default=None, description="default: the spec's slo")
    buckets: list[_Tokens] = Field(default_factory=lambda: [8192, 32768, 131072], min_length=1, max_length=16,
                                   description="context-length buckets' upper bounds (≤8k, 8–32k, 32–128k)")
    longest_context: _Tokens | None = Field(default=None, description="the workload's longest request (default: the largest "
                                            "bucket): a candidate that cannot hold one is skipped")
    min_gain: float = Field(default=0.05, ge=0, le=10, description="a candidate replaces the reference only when it carries "
                            "more load within the SLOs, or as much and a throughput gain outside the noise of at least this "
                            "much (0.05: 5 %)")
    reference_runs: int = Field(default=3, ge=1, le=20, description="times the reference is launched and benchmarked, spread "
                                "among the candidates (first, then evenly to the last): its launch-to-launch spread is the "
                                "noise a candidate's gain must clear (1: not measured; each run is one more launch)")
    confidence: float = Field(default=0.95, ge=0.5, le=0.999, description="the coverage of the interval a candidate's "
                              "throughput gain over the reference must clear")
    guard: Guard = Guard()
    budget_per_candidate_s: float = Field(default=3600, gt=0, le=MAX_SECONDS)
    budget_s: float = Field(default=8 * 3600, gt=0, le=MAX_SECONDS)
    ready_timeout_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS, description="default: systemd.timeout_start_sec")
    systemd_run: bool = Field(default=False, description="launch each candidate as a transient unit (systemd-run), else a child process")

    @field_validator("candidates")
    @classmethod
    def _names(cls, v: dict[str, CandidateSpec]) -> dict[str, CandidateSpec]:
        for k in v:
            if not _NAME.match(k):
                raise ValueError(f"{k!r}: a candidate name is letters, digits and . _ = , + - (at most 100)")
        return v

    @field_validator("gateway_policies")
    @classmethod
    def _policies_once(cls, v: list[str]) -> list[str]:
        twice = sorted({p for p in v if v.count(p) > 1})
        if twice:
            raise ValueError(f"{twice[0]} is listed twice; name each policy once")
        return v

    @field_validator("grid", mode="before")
    @classmethod
    def _grid(cls, v: object) -> object:
        if isinstance(v, dict):
            for k, vals in v.items():
                if not isinstance(vals, list) or not vals:
                    raise ValueError(f"{k}: a grid entry is a non-empty list of values")
                for x in vals:
                    _flags({k: x})
        return v

    @model_validator(mode="after")
    def _buckets_ascending(self) -> Tune:
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"buckets: must ascend without repeats (got {list(self.buckets)})")
        if self.engine == "llama-server" and not self.llama_server:
            raise ValueError("llama_server: engine llama-server needs the binary's path")
        return self
