"""Stage 50's settings, each declared once: `AccuracySettings` is one run's settings, frozen, which the probes
(recall, identity, toolcall) and the stage's actions read. The stage's options model is the same one as flags and
notebook parameters: every setting but the internal ones, each optional, None meaning unset (accuracy/stage.py
derives it with `options_view`). Each field names where its spec value comes from (`from_spec`);
`AccuracySettings.resolve` (core/settings.py's one merge) fills them in, for the CLI, the notebook and tune's guard
alike, and `derived` keeps the recall lengths the server's context takes. A leaf: nothing else of runbook.accuracy is
imported here."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from runbook.core.options import Fraction, Integer, PosInt, Url
from runbook.core.settings import Settings, from_spec, internal
from runbook.core.spec import Accuracy, Deployment

_PLAN = Accuracy()          # the spec's defaults: the settings' defaults where no spec is given
# the probes that default to the spec's own server; report and identity skip without --url
_PROBES_ON_SPEC_SERVER = ("recall", "toolcall", "kld", "record")


def _compares_with_record(spec: Deployment | None, given: dict[str, Any]) -> bool:
    """The report (every `runbook run`) compares the spec's server with the spec's recorded reference."""
    return (spec is not None and given.get("probe", "report") == "report" and not given.get("compare_url")
            and bool(given.get("record") or spec.accuracy.record))


def _url(spec: Deployment | None, given: dict[str, Any]) -> str | None:
    on_spec = given.get("probe", "report") in _PROBES_ON_SPEC_SERVER or _compares_with_record(spec, given)
    return spec.serving.local_url if spec is not None and on_spec else None


def _tokenizer(spec: Deployment | None, given: dict[str, Any]) -> str | None:
    """kld cuts windows into ids: the served checkpoint's tokenizer, when it is here."""
    cuts = given.get("probe") in ("kld", "record") or _compares_with_record(spec, given)
    if spec is None or not cuts or not (Path(spec.model.path) / "tokenizer.json").is_file():
        return None
    return spec.model.path


def _record(spec: Deployment | None, given: dict[str, Any]) -> str | None:
    return str(spec.resolve_path(spec.accuracy.record)) if spec is not None and spec.accuracy.record else None


class AccuracySettings(Settings):
    probe: Literal["kvquant", "recall", "identity", "report", "toolcall", "kld", "record"] = Field(
        "report", description="report: all of them, what 50_accuracy shows (live probes skip without --url); record: "
                              "write the reference's scores and floors to --record",
        json_schema_extra={"positional": "PROBE"})
    url: Url | None = Field(None, description="recall, toolcall: the endpoint (default: the spec's); identity, report: A, and "
                                              "the server checked for batch invariance (default: none, skipped)",
                                json_schema_extra=from_spec(_url))
    compare_url: Url | None = Field(None, description="recall, report: A/B second endpoint (e.g. BF16 KV); identity: B, a "
                                                      "server that differs from A in the setting to test (default: no A/B)")
    spec_off_url: Url | None = Field(None, description="report, identity: B when it is not compare_url (e.g. the same model "
                                                       "with speculative decoding off; default: compare_url)")
    lengths: list[PosInt] = Field(default_factory=lambda: list(_PLAN.recall_lengths),
                                  description="recall: haystack token lengths (default: the spec's, up to --context-length)",
                                  json_schema_extra=from_spec("accuracy.recall_lengths"))
    depths: list[Fraction] = Field(default_factory=lambda: list(_PLAN.recall_depths),
                                   description="recall: needle depths as fractions (default: the spec's)",
                                   json_schema_extra=from_spec("accuracy.recall_depths"))
    per_cell: PosInt = Field(1, description="recall: needles per length × depth cell (default: 1)")
    tokenizer: str | None = Field(None, description="dir with tokenizer.json: exact prompt lengths; kld: the windows' token "
                                                    "ids (default: approximate lengths; kld: the spec's model dir when it has one)",
                                json_schema_extra=from_spec(_tokenizer))
    seed: Integer = Field(0, description="the prompts are deterministic from this seed (default: 0)")
    prompts: PosInt = Field(8, description="identity: number of prompts (default: 8)")
    max_tokens: PosInt = Field(64, description="identity: greedy tokens per prompt (default: 64)")
    batch_size: PosInt = Field(8, description="identity, kld, report: the prompts (kld: windows) sent this many at once, "
                                              "against their answers one at a time (batch invariance; 1: not checked; default: 8)")
    model: str | None = Field(None, description="the served model name (default: the first /v1/models lists)")
    tool_choice: Literal["auto", "required"] = Field(
        "auto", description="toolcall, report: auto (default: what agent loops send) or required (the server must call a "
                            "tool; prose is then a fail: the chat template or parser ignores the tools)")
    toolcall_max_tokens: PosInt = Field(1024, description="toolcall, report: tokens per tool-call answer (default: 1024)")
    artifact_dir: str | None = Field(None, alias="out", description="recall, report: archive the prompts here (report, kvquant: "
                                                                    "and the KV scales)")
    kv_model: str | None = Field(None, description="kvquant, report: an HF checkpoint dir whose cached K and V the KV study "
                                                   "measures (default: the deployment's model when it is here and at most 2 "
                                                   "GiB; else the MiniLM encoder)")
    kld_windows: PosInt = Field(4, description="kld, identity, report: windows of the frozen code corpus scored by both "
                                               "servers (default: 4)")
    kld_window_tokens: PosInt = Field(1024, description="kld, identity, report: token ids per window, cut with --tokenizer "
                                                        "(default: 1024; at most the servers' context)")
    kld_top_k: PosInt = Field(20, description="kld, identity, report: the reference's top-k per position; the rest is one "
                                              "tail bucket (default: 20)")
    kld_chunk: PosInt = Field(128, description="kld, identity, report: positions per candidate request, which bounds its "
                                               "answer (default: 128)")
    floor_url: Url | None = Field(None, description="kld, identity, report: a restart of the reference with the same "
                                                    "settings, for the noise floor (default: a second pass on the reference)")
    record: str | None = Field(None, description="record: the file to write (the reference at --url, its windows' top-k "
                                                 "and noise floors); kld, report: compare --url with this recorded "
                                                 "reference instead of --compare-url (default: the spec's "
                                                 "accuracy.record; report then defaults --url to the spec's server)",
                        json_schema_extra=from_spec(_record))
    # Set by the run itself, never a flag or a notebook parameter:
    api_key_env: str | None = internal(None, "the spec's serving.api_key_env: the variable holding the API key",
                                       "serving.api_key_env")

    @model_validator(mode="after")
    def _rules(self) -> AccuracySettings:
        if self.floor_url and self.url and self.floor_url.rstrip("/") == self.url.rstrip("/"):
            raise ValueError("{floor_url} is a restart of the reference ({compare_url}) for the noise floor, not the server "
                             "measured ({url}): give the reference's restart, or leave it out")
        return self

    @property
    def api_key(self) -> str | None:
        return (os.environ.get(self.api_key_env) or None) if self.api_key_env else None

    @property
    def identity_b(self) -> str | None:
        """Greedy identity's B: `accuracy identity` compares with compare_url first; the report keeps compare_url for
        recall's A/B and compares with spec_off_url first."""
        first, second = ((self.compare_url, self.spec_off_url) if self.probe == "identity"
                         else (self.spec_off_url, self.compare_url))
        return first or second

    def derived(self, spec: Deployment | None) -> AccuracySettings:
        """The recall lengths the server takes: a prompt longer than its --context-length would be rejected."""
        ctx = spec.serving.flags.get("context-length") if spec is not None else None
        if ctx is None:
            return self
        return self.model_copy(update={"lengths": [L for L in self.lengths if int(ctx) >= L] or self.lengths[:1]})
