"""Stage 40's settings, each declared once: `BenchSettings` is one run's settings, frozen, which the sweep, the
workloads and the worker processes read. The stage's options model is the same one as flags and notebook parameters:
every setting but the internal ones, each optional, None meaning unset (bench/stage.py derives it with
`options_view`). Each field names where its spec value comes from (`from_spec`: the benchmark plan, the server's
URL); `BenchSettings.resolve` (core/settings.py's one merge) fills them in, for the CLI, the notebook and tune alike.
A leaf: nothing else of runbook.bench is imported here, so every bench module can import it."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from runbook.core.errors import InputError
from runbook.core.options import Fraction, Integer, NonNegFloat, NonNegInt, PosFloat, PosInt, Url
from runbook.core.settings import Settings, from_spec, internal
from runbook.core.spec import Benchmark, Deployment

DURATION_REQUESTS = 100000   # the request budget of a level bounded by time (built lazily: only those sent)
MAX_WORKERS = 64
_PLAN = Benchmark()          # the spec's default plan: the settings' defaults where no spec is given


def _transport(name: str) -> str:
    from runbook.endpoint import client  # lazy: aiohttp only when a transport is named, not for `runbook --help`

    if name not in client.TRANSPORTS:
        raise ValueError(f"must be one of {', '.join(client.TRANSPORTS)}")
    return name


Transport = Annotated[str, AfterValidator(_transport)]


# The spec values that depend on what else was set (from_spec's computed sources: (spec or None, given) -> value).
def _url(spec: Deployment | None, given: dict[str, Any]) -> str | None:
    return _front(spec) if spec is not None else None


def _concurrency(spec: Deployment | None, given: dict[str, Any]) -> list[int] | None:
    if given.get("rates"):
        return []        # --rate alone runs rate levels alone, not the spec's concurrency plan too
    return list(spec.benchmark.concurrency) if spec is not None else None


def _requests(spec: Deployment | None, given: dict[str, Any]) -> int | None:
    if given.get("duration") or spec is None:
        return None      # a level bounded by --duration, not by the spec's request count
    return spec.benchmark.requests_per_level


def _tokenizer(spec: Deployment | None, given: dict[str, Any]) -> str | None:
    return _spec_tokenizer(spec) if spec is not None and "url" not in given else None


def _replicas(spec: Deployment | None, given: dict[str, Any]) -> dict[str, str] | None:
    if spec is None or not spec.topology.replicas:
        return None
    return _behind(spec, given.get("url") or _front(spec))


class BenchSettings(Settings):
    url: Url | None = Field(default=None, description="server base URL (default: the spec's host:port)",
                            json_schema_extra=from_spec(_url))
    model: str | None = Field(default=None, description="model name to send (default: the server's first /v1/models entry)")
    concurrency: list[PosInt] = Field(default_factory=lambda: list(_PLAN.concurrency),
                                      description="fixed-concurrency levels, e.g. 1,2,4 (default: the spec's plan)",
                                      json_schema_extra=from_spec(_concurrency))
    rates: list[PosFloat] = Field(default_factory=list, alias="rate",
                                  description="Poisson request-rate levels (requests/s), run alone (default: none)")
    requests: PosInt | None = Field(default=None, description="measured requests per level (default: the spec's)",
                                    json_schema_extra=from_spec(_requests))
    duration: PosFloat | None = Field(default=None, description="measure each level for S seconds (no request starts later) "
                                                 "(default: a request count)")
    workload: str = Field(default=_PLAN.workload, description="the workload (`runbook bench --help` lists them; default: the spec's)",
                          json_schema_extra=from_spec("benchmark.workload"))
    turns: PosInt = Field(default=4, description="agentic: turns per session (default: 4)")
    think_time: NonNegFloat = Field(default=0.0, description="agentic: pause between turns, fixed or an exponential's mean (default: 0)")
    think_dist: Literal["fixed", "exp"] = Field(default="fixed", description="agentic: think time fixed, or exponential with that mean "
                                                                                        "(default: fixed)")
    tool_result_len: NonNegInt = Field(default=256, description="agentic: synthetic tool-result tokens per turn (default: 256)")
    trace_speed: PosFloat = Field(default=1.0, description="trace:FILE: replay X times as fast (default: 1)")
    find_max: Literal["slo", "warm"] | None = Field(
        default=None, description="instead of the fixed levels, bracket then bisect from --concurrency START (or --rate START) "
                                  "for: slo, the highest load meeting the spec's SLOs; warm, the most agent sessions whose "
                                  "turns 2+ stay in the prefix cache, beside the plan's prediction (default: fixed levels)")
    workers: Annotated[PosInt, Field(le=MAX_WORKERS)] = Field(
        default=1, description=f"load-generator processes for fixed-concurrency levels (default: 1, at most {MAX_WORKERS}): each "
                       "takes every N-th request and a share of the concurrency, one clock, records merged")
    transport: Transport | None = Field(default=None, description="HTTP client for the streamed requests: h1 (asyncio "
                                                          "protocol over httptools) or aiohttp (default: h1)")
    input_len: PosInt = Field(default=_PLAN.input_len, description="prompt tokens (random, longctx, prefix; default: the spec's)",
                              json_schema_extra=from_spec("benchmark.input_len"))
    output_len: PosInt = Field(default=_PLAN.output_len, description="generated tokens per request, ignore_eos (default: the spec's)",
                               json_schema_extra=from_spec("benchmark.output_len"))
    chat: bool | None = Field(default=None, description="use /v1/chat/completions (default: off)")
    tokenizer: str | None = Field(default=None, description="dir with tokenizer.json for exact lengths and client token counts "
                                                 "(default: approximate lengths)",
                                  json_schema_extra=from_spec(_tokenizer))
    warmup: NonNegInt = Field(default=_PLAN.warmup, description="warm-up requests per level (default: the spec's)",
                              json_schema_extra=from_spec("benchmark.warmup"))
    artifact_dir: Path | None = Field(default=None, alias="out", description="write records.jsonl and summary.json here",
                                      json_schema_extra={"metavar": "DIR"})
    compare_url: Url | None = Field(default=None, description="A/B: the same workload against this second endpoint (default: no A/B)")
    seed: Integer = Field(default=0, description="the workload is deterministic from this seed")
    timeout: PosFloat = Field(default=600.0, description="per-request timeout, seconds")
    flush_cache: bool | None = Field(default=None, description="POST /flush_cache before each level; --no-flush-cache: not even when "
                                                       "the spec's benchmark.flush_cache asks (default: the spec's, off)",
                                       json_schema_extra=from_spec("benchmark.flush_cache"))
    archive_root: str | None = Field(default=None, alias="archive", description="compare with this deployment's newest "
                                     "benchmark archived here (default: outputs/; '' to skip)")
    interactive: bool = Field(default=False, alias="progress", description="progress bars on stderr: a person is watching "
                              "(default: on when stderr is a terminal; off under the runner)")
    speculation: bool = Field(default=False, description="after the levels, speculative decoding on real text vs random tokens: "
                                                         "acceptance and speed-up per context length "
                                                         "(bench/speculation_study.py) (default: off)")
    speculation_baseline_url: Url | None = Field(default=None, description="--speculation: the same server with speculative "
                                                                           "decoding off, for the speed-up (default: none)")
    speculation_contexts: list[PosInt] = Field(default_factory=lambda: [256, 1024],
                                               description="--speculation: prompt lengths in tokens, one bucket each (default: 256,1024)")
    speculation_requests: PosInt = Field(default=3, description="--speculation: prompts per corpus kind and length (default: 3)")
    # Set by the run itself, never a flag or a notebook parameter:
    api_key_env: str | None = internal(None, "the spec's serving.api_key_env: the variable holding the API key",
                                       "serving.api_key_env")
    range_ratio: Fraction = internal(0.0, "random: input lengths drawn from U[L·(1−r), L·(1+r)]")
    telemetry: bool = internal(True, "NVML + /metrics sampled during each level (bench/telemetry.py)")
    telemetry_interval_s: PosFloat = internal(1.0, "seconds between telemetry samples")
    nvml: Any = internal(None, "an NVML module to sample (tests inject one); None: pynvml when a driver is there")
    find_max_levels: Annotated[Integer, Field(ge=2)] = internal(10, "--find-max: at most this many levels")
    replicas: dict[str, str] = internal({}, "name -> URL of the spec's replicas behind the benchmarked URL: each one's "
                                            "/metrics read before and after every level (bench/replicas.py)", _replicas)

    @model_validator(mode="after")
    def _rules(self) -> BenchSettings:
        if self.requests and self.duration:
            raise ValueError("{requests} and {duration} both bound a level: give one")
        if self.find_max == "warm":
            if self.workload not in (None, "agentic"):
                raise ValueError("{find_max} warm runs agent sessions: give {workload} agentic")
            if self.turns is not None and self.turns < 2:
                raise ValueError("{find_max} warm measures turns 2+ (what the cache kept between turns): give {turns} 2 or more")
            if self.duration:
                raise ValueError("{find_max} warm runs each level's sessions to their last turn: drop {duration}")
        if self.find_max is not None and self.rates and self.concurrency:
            raise ValueError("{find_max} slo searches concurrency or rate, not both: give {concurrency} START or {rates} START")
        if self.speculation_baseline_url and not self.speculation:
            raise ValueError("{speculation_baseline_url} is the study's baseline: add {speculation}")
        if self.workers not in (None, 1) and (self.rates or self.duration or self.compare_url):   # None: unset (options)
            raise ValueError("{workers} N splits fixed-concurrency levels of {requests} over N processes; "
                             "{rates}, {duration} and {compare_url} run in one process: drop {workers}")
        return self

    @property
    def server(self) -> str:
        """The server's base URL: --url, else the spec's (resolve sets it)."""
        if self.url is None:
            raise InputError("no server URL: give {url}, or a deployment spec")
        return self.url


def _front(spec: Deployment) -> str:
    """The URL clients use: the gateway's where the spec declares one, else the one server's."""
    g = spec.topology.gateway
    return g.url if g is not None else spec.serving.local_url


def _behind(spec: Deployment, url: str | None) -> dict[str, str]:
    """The spec's replicas, when `url` is in front of them (the gateway, or any URL that is not a replica's own);
    none when the benchmark targets one replica directly."""
    reps = {r.name: r.url for r in spec.topology.replicas}
    own = {u.rstrip("/") for u in reps.values()}
    return {} if url is None or url.rstrip("/") in own else reps


def _spec_tokenizer(spec: Deployment) -> str | None:
    """Benchmarking the spec's own server: its model's tokenizer, when the checkpoint is here."""
    from runbook.model.location import locate  # lazy: the model's files only when a spec's server is benchmarked

    loc = locate(spec)
    return str(loc.path) if loc.path is not None and (loc.path / "tokenizer.json").is_file() else None
