"""The deployment spec: one YAML file per deployment, the single source of truth.

Every notebook and CLI verb loads it through `load()`, which validates it with pydantic and
turns any problem into one SpecError line naming the file, the key and the expected form.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from runbook.core import paths, specyaml, topospec
from runbook.core.errors import SpecError
from runbook.core.options import echoes
from runbook.core.secrets import is_secret_key
from runbook.core.specbase import (
    MAX_CHECKPOINT_GIB,
    MAX_GPU_MEMORY_GIB,
    MAX_GPUS_PER_NODE,
    MAX_LIST,
    MAX_NODES,
    MAX_PARALLEL,
    MAX_SECONDS,
    MAX_TOKENS,
    SLO,
    FlagValue,
    Strict,
    check_flag_names,
    check_flag_values,
)
from runbook.core.topospec import Topology
from runbook.core.tunespec import Tune

DEFAULT_SPEC = paths.default_deployment()   # the checkout's deployments/, or the wheel's packaged copy
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Model(Strict):
    path: str = Field(description="what SGLang gets as --model-path: a local checkpoint dir or a Hugging Face repo id")
    card: str | None = Field(None, description="local dir with config.json etc. to inspect when path is not on this machine")
    served_name: str | None = None
    revision: str | None = None
    size_gib: float | None = Field(None, gt=0, le=MAX_CHECKPOINT_GIB,
                                   description="checkpoint size when it is not on this machine; read from its index when it is")


class Hardware(Strict):
    gpu_model: str
    gpu_count: int = Field(gt=0, le=MAX_GPUS_PER_NODE, description="GPUs per node")
    gpu_memory_gib: float = Field(gt=0, le=MAX_GPU_MEMORY_GIB, description="memory per GPU")
    compute_capability: str | None = Field(None, pattern=r"^\d+\.\d+$")
    require_gpus: bool = Field(False, description="true on the serving host: a missing driver then fails the run")


class Node(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    address: str = Field(description="address the other nodes reach this one at")
    env: dict[str, str] = Field(default_factory=dict, description="environment for this rank's unit only, over serving.env "
                                "(e.g. SGLANG_CPU_OMP_THREADS_BIND: each rank its own cores)")
    port: int | None = Field(None, gt=0, lt=65536, description="this rank's HTTP port (default serving.port): ranks >= 1 "
                             "answer /health there; set it only where two ranks share a host")

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_are_strings(cls, v: Any) -> Any:
        return Serving._env_values_are_strings(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return Serving._env_names(v)


class Parallelism(Strict):
    tp: int = Field(default=1, gt=0, le=MAX_PARALLEL)
    pp: int = Field(default=1, gt=0, le=MAX_PARALLEL)
    attn_dp: int = Field(default=1, gt=0, le=MAX_PARALLEL,
                         description="attention data parallel size (SGLang --dp-size with --enable-dp-attention)")
    nodes: list[Node] = Field(default_factory=list, max_length=MAX_NODES, description="multi-node: one entry per node, rank 0 first")
    dist_init_port: int = Field(default=50000, gt=0, lt=65536)

    @model_validator(mode="after")
    def _dp_divides_tp(self) -> Parallelism:
        if self.tp % self.attn_dp:
            raise ValueError(f"attn_dp ({self.attn_dp}) must divide tp ({self.tp})")
        return self

    @property
    def gpus(self) -> int:
        # Attention DP splits the TP group; it adds no GPUs.
        return self.tp * self.pp


class Serving(Strict):
    python: str = Field(description="absolute path of the python in the serving environment")
    host: str = "127.0.0.1"
    port: int = Field(30000, gt=0, lt=65536)
    flags: dict[str, FlagValue] = Field(default_factory=dict, description="SGLang flags without leading dashes; true for a switch")
    env: dict[str, str] = Field(default_factory=dict)
    env_file: str | None = Field(None, description="EnvironmentFile with secrets (API key, HF token); never inlined")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key for clients")
    apply_recommended: bool = Field(False, description="apply the quant notebook's recommended flags when rendering the unit")

    @property
    def local_url(self) -> str:
        """Where clients on this host reach the server (a wildcard bind address means loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"   # an IPv6 literal in a URL
        return f"http://{host}:{self.port}"

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_are_strings(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for k, val in v.items():
            if isinstance(val, (bool, float)):
                raise ValueError(f"{k}: quote the value (YAML read {val!r} as {type(val).__name__}, not a string)")
            out[k] = str(val) if isinstance(val, int) else val
        return out

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV_NAME.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name (letters, digits, _; not starting with a digit)")
            if is_secret_key(k):
                raise ValueError(f"{k} looks like a secret: put it in serving.env_file, not in the spec")
        return v

    @field_validator("flags", mode="before")
    @classmethod
    def _flag_values(cls, v: Any) -> Any:
        return check_flag_values(v)

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, v: dict[str, FlagValue]) -> dict[str, FlagValue]:
        return check_flag_names(v)


class Systemd(Strict):
    unit_name: str = Field(pattern=r"^[A-Za-z0-9@_.:-]+$")
    unit_path: str | None = Field(None, description="installed unit; default /etc/systemd/system/<unit_name>.service")
    user: str | None = None
    group: str | None = None
    working_directory: str | None = None
    timeout_start_sec: int = Field(1800, gt=0, le=MAX_SECONDS, description="long enough to load ~400 GB of weights")
    restart_sec: int = Field(30, ge=0, le=MAX_SECONDS)
    ready_path: Literal["/ready", "/health", "/health_generate"] = "/ready"

    @property
    def installed_path(self) -> str:
        return self.unit_path or f"/etc/systemd/system/{self.unit_name}.service"


_PositiveInt = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
_Fraction = Annotated[float, Field(ge=0, le=1)]


class Benchmark(Strict):
    concurrency: list[_PositiveInt] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], max_length=MAX_LIST)
    workload: str = "code"
    input_len: int = Field(default=1024, gt=0, le=MAX_TOKENS)
    output_len: int = Field(default=256, gt=0, le=MAX_TOKENS)
    requests_per_level: int = Field(default=64, gt=0, le=10_000_000)
    warmup: int = Field(default=2, ge=0, le=1_000_000)
    regression_threshold_pct: float = Field(default=10.0, gt=0, le=1000)
    # POST /flush_cache before each level, so every level starts with a cold prefix cache. Off by
    # default: on a production server it drops every user's cached prefixes.
    flush_cache: bool = False


class Accuracy(Strict):
    recall_lengths: list[_PositiveInt] = Field(default_factory=lambda: [8192, 32768, 131072], max_length=MAX_LIST)
    recall_depths: list[_Fraction] = Field(default_factory=lambda: [0.1, 0.5, 0.9], max_length=MAX_LIST)
    clipped_frac_warn: float = Field(default=0.001, ge=0)
    clipped_frac_fail: float = Field(default=0.01, ge=0)
    attn_rel_err_warn: float = Field(default=0.01, ge=0)
    attn_rel_err_fail: float = Field(default=0.05, ge=0)
    record: str | None = Field(default=None, description="a recorded reference (`runbook accuracy record`; relative to this "
                                                 "file): every run compares the server with it (stage 50's KLD probe)")


def level_meets_slo(level: dict[str, Any], slo: Any) -> bool:
    """The level-wide SLO rule (bench.slo, goodput's search, the fleet's "max load under SLO"): each metric's
    p99 over the requests that have it within its limit; a metric no request has is not held against it."""
    if not level.get("completed"):
        return False
    for m in ("ttft", "tpot", "e2e"):
        limit = getattr(slo, f"{m}_ms_p99", None)
        p99 = (level.get(f"{m}_ms") or {}).get("p99")
        if limit is not None and p99 is not None and p99 > limit:
            return False
    return True


NO_CREDENTIALS = "must not carry credentials or tokens"


def archive_url_problem(url: str) -> str | None:
    """Why an archive URL (`s3://BUCKET/PREFIX`, `gs://…`, `az://…`, `file:///…`) is refused, or None.

    Credentials never travel in the URL: no `user:password@`, no query string (presigned or SAS tokens);
    they come from the standard environment and credential files of the storage client."""
    if not isinstance(url, str) or not url or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "must be a URL such as s3://BUCKET/PREFIX, without spaces or control characters"
    m = re.fullmatch(r"([a-z][a-z0-9+.-]*)://([^/]*)(/.*)?", url)
    if not m:
        return "must be a URL such as s3://BUCKET/PREFIX"
    scheme, bucket, _ = m.groups()
    if "@" in bucket or "?" in url or "#" in url:
        return (f"{NO_CREDENTIALS} (user@, ?query, #fragment): the storage client reads them from "
                "its environment (AWS_*, FSSPEC_S3_*) or credential files")
    if scheme != "file" and not bucket:
        return "names no bucket; e.g. s3://BUCKET/PREFIX"
    return None


class Archive(Strict):
    """Where finished runs are also uploaded (object storage through fsspec). The endpoint, region and
    credentials are the storage client's own settings (AWS_ENDPOINT_URL, AWS_PROFILE, FSSPEC_S3_*), never here."""
    url: str | None = Field(None, description="s3://BUCKET/PREFIX; runs go to PREFIX/<host>/<run id>/",
                            json_schema_extra={"echo": False})   # may carry credentials: never repeated in an error

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str | None) -> str | None:
        problem = None if v is None else archive_url_problem(v)
        if problem:
            raise ValueError(problem)
        return v


def http_url_problem(url: str) -> str | None:
    """Why a link base (http(s)://HOST/PATH, shown in alerts) is refused, or None: no credentials, query or fragment."""
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "must be a URL such as https://runbooks.example.com/fleet, without spaces or control characters"
    if any(c in url for c in "@?#"):
        return f"{NO_CREDENTIALS} (user@, ?query, #fragment): the archive is served to whoever follows an alert's link"
    if not re.fullmatch(r"https?://[^/]+(/.*)?", url):
        return "must be an http(s) URL such as https://runbooks.example.com/fleet"
    return None


class Alerts(Strict):
    """Prometheus metrics of every run, for node_exporter's textfile collector (docs/alerts.md)."""
    textfile_dir: str | None = Field(default=None, description="write runbook_<deployment>.prom here after each run "
                                     "(node_exporter's --collector.textfile.directory); $RUNBOOK_TEXTFILE_DIR and "
                                     "--textfile-dir win over it")
    interval_s: int = Field(default=86400, gt=0, le=MAX_SECONDS,
                            description="how often cron or the timer runs the runbook: the 'not run' and 'stale textfile' alerts "
                            "fire after twice this")
    link_base: str | None = Field(default=None, description="where the archive is served (the fleet's --link-base): alerts "
                                  "link <link_base>/<host>/<run id>/summary.html",
                                  json_schema_extra={"echo": False})   # may carry credentials: never repeated in an error

    @field_validator("textfile_dir")
    @classmethod
    def _dir_ok(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in v)):
            raise ValueError("must be an absolute directory such as /var/lib/prometheus/node-exporter")
        return v

    @field_validator("link_base")
    @classmethod
    def _link_ok(cls, v: str | None) -> str | None:
        problem = None if v is None else http_url_problem(v)
        if problem:
            raise ValueError(problem)
        return v.rstrip("/") if v else v


DEPLOYMENT_NAME = r"^[a-z0-9][a-z0-9._-]*$"   # also a lock and textfile name: no path separator, no leading dot



class Deployment(Strict):
    name: str = Field(pattern=DEPLOYMENT_NAME)
    description: str = ""
    model: Model
    hardware: Hardware
    parallelism: Parallelism = Parallelism()
    serving: Serving
    systemd: Systemd
    benchmark: Benchmark = Benchmark()
    accuracy: Accuracy = Accuracy()
    slo: SLO = SLO()
    archive: Archive = Archive(url=None)
    alerts: Alerts = Alerts()
    tune: Tune = Field(Tune(), description="stage 60's candidates, workload and budgets")
    topology: Topology = Field(Topology(), description="replicas behind SGLang's gateway; absent: one server")
    # Filled by load(): where the spec came from, for resolving relative paths and for messages.
    source: str | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _parallelism_fits(self) -> Deployment:
        nodes = max(1, len(self.parallelism.nodes))
        if self.parallelism.gpus > self.hardware.gpu_count * nodes:
            raise ValueError(
                f"parallelism needs {self.parallelism.gpus} GPUs (tp {self.parallelism.tp} × pp {self.parallelism.pp}) "
                f"but hardware.gpu_count is {self.hardware.gpu_count}" + (f" × {nodes} nodes" if nodes > 1 else "")
            )
        if nodes > 1 and self.parallelism.gpus % nodes:
            raise ValueError(f"parallelism.tp: tp × pp ({self.parallelism.gpus}) must be a multiple of the "
                             f"{nodes} nodes (SGLang splits the ranks evenly across nodes)")
        placement = topospec.placement_problem(self.parallelism.tp, self.parallelism.pp, nodes) if nodes > 1 else None
        if placement:
            raise ValueError(f"parallelism.pp: {self.parallelism.pp} over {nodes} nodes: {placement} (SGLang places "
                             "pp // nodes PP ranks per node, or one PP rank per nodes // pp nodes); make pp a multiple "
                             "or a divisor of the node count")
        topospec.check(self.topology, gpus_per_server=self.parallelism.gpus, gpu_count=self.hardware.gpu_count,
                       nodes=nodes, cpu=self.serving.flags.get("device") == "cpu")
        if self.tune.gateway_policies and self.topology.gateway is None:
            raise ValueError("tune.gateway_policies: this deployment declares no gateway (topology.gateway); "
                             "declare one, or leave gateway_policies out")
        return self

    @property
    def servers(self) -> list[tuple[str, str]]:
        """(name, url) of every SGLang server the deployment runs: each replica, or the one server."""
        if self.topology.replicas:
            return [(r.name, r.url) for r in self.topology.replicas]
        return [(self.name, self.serving.local_url)]

    def resolve_path(self, p: str) -> Path:
        """A path from the spec: absolute as is, relative to the spec file's directory."""
        path = Path(os.path.expanduser(p))
        if path.is_absolute() or self.source is None:
            return path
        return (Path(self.source).parent / path).resolve()


def _describe(err: Mapping[str, Any], model: type[BaseModel]) -> str:
    loc = ".".join(str(x) for x in err["loc"])
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        parent = _submodel(model, err["loc"][:-1])
        allowed = ", ".join(parent.model_fields) if parent else ""
        return f"{loc}: unknown key" + (f" (allowed here: {allowed})" if allowed else "")
    if kind == "missing":
        field = _field(model, err["loc"])
        hint = f" ({field.description})" if field is not None and field.description else ""
        return f"{loc}: missing required key{hint}"
    got = err.get("input")
    if kind == "finite_number":
        msg = "must be a finite number (YAML's .inf and .nan are not)"
    field = _field(model, err["loc"])
    echo = field is None or echoes(field)      # a field marked "echo": False (a URL that may carry credentials): never shown
    shown = "" if isinstance(got, (dict, list)) or not echo else f" (got {got!r})"
    msg = msg.removeprefix("Value error, ")
    # A mapping's validator names the entry first ("context-length: must be ..."): make it part of the key path.
    m = re.match(r"^([^\s:]+): (.*)$", msg)
    if kind == "value_error" and isinstance(got, dict) and m and re.split(r"[.\[]", m.group(1))[0] in got:
        return f"{loc}.{m.group(1)}: {m.group(2)}"
    return f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}"


def _submodel(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    cur: Any = model
    for part in loc:
        f = getattr(cur, "model_fields", {}).get(part)
        if f is None:
            return None
        cur = f.annotation
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _field(model: type[BaseModel], loc: tuple):
    parent = _submodel(model, loc[:-1])
    return parent.model_fields.get(loc[-1]) if parent and loc else None


def from_dict(data: Any, source: str = "<spec>") -> Deployment:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of keys (name, model, hardware, …), got {type(data).__name__}")
    try:
        dep = Deployment.model_validate({**data, "source": source})
    except ValidationError as e:
        errs = e.errors()
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise SpecError(f"{source}: {_describe(errs[0], Deployment)}{more}") from None
    return dep


def load(path: str | os.PathLike | None = None) -> Deployment:
    """Load and validate a deployment spec; default: DEFAULT_SPEC (the Qwen3.5 NVFP4 deployment)."""
    p = Path(path) if path else DEFAULT_SPEC
    data = specyaml.parse(specyaml.read_spec(p), p, Deployment)
    return from_dict(data, str(p.resolve()))
