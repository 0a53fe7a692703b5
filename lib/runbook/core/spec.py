"""The deployment spec: one YAML file per deployment, the single source of truth.

Every notebook and CLI verb loads it through `load()`, which validates it with pydantic and
turns any problem into one SpecError line naming the file, the key and the expected form.
"""
from __future__ import annotations

import math
import os
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from runbook.core import paths
from runbook.core.errors import SpecError
from runbook.core.fsutil import FileRefused, read_regular
from runbook.core.options import FINITE
from runbook.core.secrets import is_secret_key

DEFAULT_SPEC = paths.default_deployment()   # the checkout's deployments/, or the wheel's packaged copy
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Flags owned by other spec sections, so the spec cannot say the same thing twice.
_OWNED_FLAGS = {
    "model-path": "model.path", "model": "model.path", "tp-size": "parallelism.tp", "tp": "parallelism.tp",
    "tensor-parallel-size": "parallelism.tp", "pp-size": "parallelism.pp", "pipeline-parallel-size": "parallelism.pp",
    "dp-size": "parallelism.attn_dp", "attn-dp-size": "parallelism.attn_dp", "enable-dp-attention": "parallelism.attn_dp",
    "host": "serving.host", "port": "serving.port", "served-model-name": "model.served_name",
    "api-key": "serving.env_file (never inline a key)",
}

FlagValue = bool | int | float | str | None
# SGLang flags whose type the runbook relies on (kv sizing, service checks): checked at load, so a
# `context-length: lots` is a one-line spec error instead of a traceback in a later stage.
# name -> (type, lowest allowed, highest allowed, what to write)
_I32 = 2**31 - 1               # SGLang keeps token and request counts in int32 tensors
_TYPED_FLAGS: dict[str, tuple[type, float, float, str]] = {
    "context-length": (int, 1, _I32, f"a token count in [1, {_I32:,}]"),
    "max-running-requests": (int, 1, _I32, f"a request count in [1, {_I32:,}]"),
    "max-total-tokens": (int, 1, _I32, f"a token count in [1, {_I32:,}]"),
    "max-prefill-tokens": (int, 1, _I32, f"a token count in [1, {_I32:,}]"),
    "chunked-prefill-size": (int, -1, _I32, f"a token count in [1, {_I32:,}], or -1 to disable chunked prefill"),
    "page-size": (int, 1, 1 << 20, f"a token count in [1, {1 << 20:,}]"),
    "cuda-graph-max-bs": (int, 1, 1 << 20, f"a batch size in [1, {1 << 20:,}]"),
    "max-mamba-cache-size": (int, 1, _I32, f"a count in [1, {_I32:,}]"),
    "mem-fraction-static": (float, 0, 1, "a fraction in (0, 1]"),
    "mamba-full-memory-ratio": (float, 0, 1000, "a ratio in (0, 1000]"),
    "swa-full-tokens-ratio": (float, 0, 1000, "a ratio in (0, 1000]"),
}
_BOOL_STRINGS = {"true", "false", "yes", "no", "on", "off"}
MAX_SPEC_BYTES = 1 << 20      # a deployment spec is a few KiB; anything this big is a mistake (or a bomb)
_MAX_DEPTH = 64               # nesting levels
_MAX_NODES = 100_000          # YAML nodes after alias expansion ("billion laughs")


# Sane upper bounds: far above any real deployment, low enough that 2**70 GPUs or 1e30 GiB is an error,
# not a MemoryError (or a silently absurd plan) in a later stage.
MAX_GPUS_PER_NODE = 1024
MAX_PARALLEL = 1024           # tp, pp, attn_dp
MAX_NODES = 1024
MAX_GPU_MEMORY_GIB = 4096     # the largest GPUs today have under 300 GiB
MAX_CHECKPOINT_GIB = 1 << 20  # 1 PiB
MAX_TOKENS = 1 << 24          # benchmark and recall lengths: 16M tokens
MAX_LIST = 1000               # entries in a list of levels, lengths or depths
MAX_SECONDS = 7 * 24 * 3600


def _unwrap(tp: Any) -> Any:
    """int / float / bool / str / "flag" / ("list", kind) / ("dict", kind) / ("model", cls) / "any" for an annotation."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _unwrap(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else "flag"
    if origin is Literal:
        return str
    if origin is list:
        return ("list", _unwrap(get_args(tp)[0]))
    if origin is dict:
        return ("dict", _unwrap(get_args(tp)[1]))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return ("model", tp)
    return tp if tp in (int, float, bool, str) else "any"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, **FINITE)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, data: Any) -> Any:
        """pydantic reads true as 1 for an int field: `tp: yes` must not mean TP 1."""
        if isinstance(data, dict):
            for name, f in cls.model_fields.items():
                if isinstance(data.get(name), bool) and _unwrap(f.annotation) in (int, float):
                    raise ValueError(f"{name}: must be a number, not true/false (got {data[name]!r})")
        return data


class Model(_Strict):
    path: str = Field(description="what SGLang gets as --model-path: a local checkpoint dir or a Hugging Face repo id")
    card: str | None = Field(None, description="local dir with config.json etc. to inspect when path is not on this machine")
    served_name: str | None = None
    revision: str | None = None
    size_gib: float | None = Field(None, gt=0, le=MAX_CHECKPOINT_GIB,
                                   description="checkpoint size when it is not on this machine; read from its index when it is")


class Hardware(_Strict):
    gpu_model: str
    gpu_count: int = Field(gt=0, le=MAX_GPUS_PER_NODE, description="GPUs per node")
    gpu_memory_gib: float = Field(gt=0, le=MAX_GPU_MEMORY_GIB, description="memory per GPU")
    compute_capability: str | None = Field(None, pattern=r"^\d+\.\d+$")
    require_gpus: bool = Field(False, description="true on the serving host: a missing driver then fails the run")


class Node(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    address: str = Field(description="address the other nodes reach this one at")


class Parallelism(_Strict):
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


class Serving(_Strict):
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
        if not isinstance(v, dict):
            return v
        for k, val in v.items():
            if isinstance(val, (dict, list)):
                raise ValueError(f"{k}: a flag takes one value (a string, number or true/false), not a {type(val).__name__}")
            if isinstance(val, float) and not math.isfinite(val):
                raise ValueError(f"{k}: {val} is not a finite number")
            if isinstance(val, str) and val.strip().lower() in _BOOL_STRINGS:
                raise ValueError(f"{k}: {val!r} is a quoted string, which SGLang would get as a value, not a switch: "
                                 f"write {k}: true (unquoted) to set the switch, or false to leave it off")
            if isinstance(k, str) and k in _TYPED_FLAGS and val is not None:
                typ, lo, hi, what = _TYPED_FLAGS[k]
                ok_type = (isinstance(val, int) and not isinstance(val, bool)) or (typ is float and isinstance(val, float))
                if not ok_type or not (lo <= val <= hi) or (typ is float and val == 0) or (typ is int and val == 0):
                    raise ValueError(f"{k}: must be {what} (got {val!r})")
        return v

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, v: dict[str, FlagValue]) -> dict[str, FlagValue]:
        for k in v:
            if k.startswith("-") or not _FLAG_NAME.match(k):
                raise ValueError(f"{k!r}: write flags without leading dashes, lower-case with hyphens (e.g. kv-cache-dtype)")
            if k in _OWNED_FLAGS:
                raise ValueError(f"{k}: set it through {_OWNED_FLAGS[k]}, not serving.flags")
        return v


class Systemd(_Strict):
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


class Benchmark(_Strict):
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


class Accuracy(_Strict):
    recall_lengths: list[_PositiveInt] = Field(default_factory=lambda: [8192, 32768, 131072], max_length=MAX_LIST)
    recall_depths: list[_Fraction] = Field(default_factory=lambda: [0.1, 0.5, 0.9], max_length=MAX_LIST)
    clipped_frac_warn: float = Field(default=0.001, ge=0)
    clipped_frac_fail: float = Field(default=0.01, ge=0)
    attn_rel_err_warn: float = Field(default=0.01, ge=0)
    attn_rel_err_fail: float = Field(default=0.05, ge=0)


class SLO(_Strict):
    ttft_ms_p99: float | None = Field(default=None, gt=0, le=MAX_SECONDS * 1000)
    tpot_ms_p99: float | None = Field(default=None, gt=0, le=MAX_SECONDS * 1000)
    e2e_ms_p99: float | None = Field(default=None, gt=0, le=MAX_SECONDS * 1000)


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


# A URL refused for carrying credentials is never echoed back ("(got …)") in the error line.
NO_CREDENTIALS = "must not carry credentials or tokens"


def archive_url_problem(url: str) -> str | None:
    """Why an archive URL (`s3://BUCKET/PREFIX`, `gs://…`, `az://…`, `file:///…`) is refused, or None.

    Credentials never travel in the URL: no `user:password@`, no query string (presigned or SAS tokens);
    they come from the standard environment and credential files of the storage client."""
    if not isinstance(url, str) or not url or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "must be a URL such as s3://BUCKET/PREFIX, without spaces or control characters"
    m = re.fullmatch(r"([a-z][a-z0-9+.-]*)://([^/]*)(/.*)?", url)
    if not m:
        return f"must be a URL such as s3://BUCKET/PREFIX (got {url!r})"
    scheme, bucket, _ = m.groups()
    if "@" in bucket or "?" in url or "#" in url:
        return (f"{NO_CREDENTIALS} (user@, ?query, #fragment): the storage client reads them from "
                "its environment (AWS_*, FSSPEC_S3_*) or credential files")
    if scheme != "file" and not bucket:
        return f"names no bucket (got {url!r}); e.g. s3://BUCKET/PREFIX"
    return None


class Archive(_Strict):
    """Where finished runs are also uploaded (object storage through fsspec). The endpoint, region and
    credentials are the storage client's own settings (AWS_ENDPOINT_URL, AWS_PROFILE, FSSPEC_S3_*), never here."""
    url: str | None = Field(None, description="s3://BUCKET/PREFIX; runs go to PREFIX/<host>/<run id>/")

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
        return f"must be an http(s) URL such as https://runbooks.example.com/fleet (got {url!r})"
    return None


class Alerts(_Strict):
    """Prometheus metrics of every run, for node_exporter's textfile collector (docs/alerts.md)."""
    textfile_dir: str | None = Field(default=None, description="write runbook_<deployment>.prom here after each run "
                                     "(node_exporter's --collector.textfile.directory); $RUNBOOK_TEXTFILE_DIR and "
                                     "--textfile-dir win over it")
    interval_s: int = Field(default=86400, gt=0, le=MAX_SECONDS,
                            description="how often cron or the timer runs the runbook: the 'not run' and 'stale textfile' alerts "
                            "fire after twice this")
    link_base: str | None = Field(default=None, description="where the archive is served (the fleet's --link-base): alerts "
                                  "link <link_base>/<host>/<run id>/summary.html")

    @field_validator("textfile_dir")
    @classmethod
    def _dir_ok(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in v)):
            raise ValueError(f"must be an absolute directory such as /var/lib/prometheus/node-exporter (got {v!r})")
        return v

    @field_validator("link_base")
    @classmethod
    def _link_ok(cls, v: str | None) -> str | None:
        problem = None if v is None else http_url_problem(v)
        if problem:
            raise ValueError(problem)
        return v.rstrip("/") if v else v


DEPLOYMENT_NAME = r"^[a-z0-9][a-z0-9._-]*$"   # also a lock and textfile name: no path separator, no leading dot

from runbook.core.tunespec import Tune  # noqa: E402  (it builds on _Strict and SLO above)


class Deployment(_Strict):
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
        return self

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
    shown = "" if isinstance(got, (dict, list)) or NO_CREDENTIALS in msg else f" (got {got!r})"
    msg = msg.removeprefix("Value error, ")
    # A mapping's validator names the entry first ("context-length: must be ..."): make it part of the key path.
    m = re.match(r"^([^\s:]+): (.*)$", msg)
    if kind == "value_error" and isinstance(got, dict) and m and m.group(1) in got:
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


_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, line, seen[key])
                seen[key] = line
            except TypeError:
                continue  # unhashable: SafeConstructor reports it
        return super().construct_mapping(node, deep=deep)


def _read_spec(p: Path) -> str:
    """The spec's text: a regular, small, UTF-8 file, else one SpecError line naming it and the fix."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise SpecError(f"{p}: deployment spec not found (see deployments/ for examples)") from None
    except (OSError, ValueError) as e:
        raise SpecError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = read_regular(p, MAX_SPEC_BYTES, st, what="a deployment spec")
    except FileRefused as e:
        raise SpecError(f"{p}: {e.reason}; give the deployment spec's YAML file (e.g. deployments/<name>.yaml)") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save the file as UTF-8") from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.reader.ReaderError):
        return f"character #x{e.character if isinstance(e.character, int) else ord(e.character):04x} at position {e.position}: {e.reason}"
    msg = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
    return " ".join(str(msg).split())


def _check_shape(text: str, p: Path) -> None:
    """Bound nesting before composing (PyYAML composes recursively)."""
    depth = 0
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > _MAX_DEPTH:
                raise SpecError(f"{p}: line {ev.start_mark.line + 1}: nested more than {_MAX_DEPTH} levels deep; "
                                "a deployment spec is a few levels of keys")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _count_nodes(root: yaml.Node, p: Path) -> None:
    """Refuse recursive aliases and alias bombs: count nodes as the constructed data would hold them."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            raise SpecError(f"{p}: line {n.start_mark.line + 1}: recursive alias (an anchor used inside itself)")
        total = 1
        if isinstance(n, (yaml.MappingNode, yaml.SequenceNode)):
            active.add(id(n))
            for child in n.value:
                for c in (child if isinstance(child, tuple) else (child,)):
                    total += size(c)
                    if total > _MAX_NODES:
                        raise SpecError(f"{p}: line {n.start_mark.line + 1}: aliases expand to more than {_MAX_NODES:,} "
                                        "values; a deployment spec needs far fewer (remove the alias chain)")
            active.discard(id(n))
        sizes[id(n)] = total
        return total

    size(root)


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL_TAG, _NULL_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
# Plain scalars only YAML 1.1 reads as numbers, and not as the digits show: base 60 (`30:00` is 1800,
# `1:30` is 90) and a leading-zero octal (`0755` is 493). YAML 1.2 and every reader would not agree.
_YAML11_ONLY = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?|0[0-7_]+)$")


def _as_written(root: yaml.Node, p: Path) -> None:
    """Everywhere in the spec, a plain scalar is read the way its field needs, never by a YAML 1.1 surprise:

    - string fields (and serving.flags values SGLang gets as text): a number or date is kept as the text
      written (`served_name: 0755` stays "0755", `compute_capability: 12.0` stays "12.0", a flag `x: 1:30`
      stays "1:30"); yes/no/on/off/true/false must be quoted (YAML reads them as booleans); dates are left
      to the loader (an impossible one is refused with "quote a value meant as text"); serving.env's values
      ("text": a string that cannot be left empty) keep `0755`, `1:30`, `1e3` as written and refuse null too;
    - number fields (and the flags the runbook computes with): base-60 (`port: 30:00`) and leading-zero
      octal (`port: 030000`) are refused, as is a boolean; `0x1F`, `1_000` and quoted digits are numbers.
    """
    _walk(root, ("model", Deployment), "", "", p)


def _walk(n: yaml.Node, kind: Any, where: str, key: str, p: Path) -> None:
    """Follow the spec's node tree alongside the model's fields; `kind` is what the field at `where` needs."""
    if isinstance(kind, tuple) and isinstance(n, yaml.MappingNode):
        _walk_mapping(n, kind, where, key, p)
    elif isinstance(kind, tuple) and kind[0] == "list" and isinstance(n, yaml.SequenceNode):
        for i, item in enumerate(n.value):
            _walk(item, kind[1], f"{where}[{i}]", key, p)
    elif isinstance(n, yaml.ScalarNode):
        if kind == "flag":
            # A value SGLang gets as text: keep YAML 1.1-only numbers and dates as written; true/false stay switches.
            if n.style is None and n.tag in (_INT_TAG, _FLOAT_TAG) and _YAML11_ONLY.match(n.value):
                n.tag = _STR
            return
        _scalar(n, kind, where, key, p)


def _walk_mapping(n: yaml.MappingNode, kind: tuple[Any, Any], where: str, key: str, p: Path) -> None:
    """A model's fields or a dict's values (merge keys followed); unknown keys are left for pydantic to report."""
    what, sub = kind
    for k, v in n.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        if k.tag == _MERGE:
            for m in (v.value if isinstance(v, yaml.SequenceNode) else [v]):
                _walk(m, kind, where, key, p)
            continue
        name = k.value
        path = f"{where}.{name}" if where else name
        if what == "model":
            f = sub.model_fields.get(name)
            if f is None:   # unknown keys: pydantic says so
                continue
            _walk(v, _unwrap(f.annotation), path, name, p)
        elif what == "dict":
            child = "text" if sub is str else sub   # a mapping's string values are never empty (serving.env)
            if sub == "flag":
                typed = _TYPED_FLAGS.get(name)
                child = typed[0] if typed else "flag"
            _walk(v, child, path, name, p)


def _scalar(n: yaml.ScalarNode, kind: Any, where: str, key: str, p: Path) -> None:
    """One plain scalar, read as its field needs: text kept as written, a number refused when only YAML 1.1 reads it."""
    if n.style is not None:        # quoted or block scalar: a string, as written
        return
    line = n.start_mark.line + 1
    if kind in (str, "text"):
        if n.tag in (_INT_TAG, _FLOAT_TAG):
            n.tag = _STR
        elif n.tag == _BOOL_TAG or (kind == "text" and n.tag == _NULL_TAG):
            what = "true/false" if n.tag == _BOOL_TAG else "null (no value)"
            raise SpecError(f"{p}: line {line}: {where}: YAML reads {n.value or 'an empty value'} as {what}, not text; "
                            f"quote the value: {key}: \"{n.value}\"")
    elif kind in (int, float):
        if n.tag in (_INT_TAG, _FLOAT_TAG) and _YAML11_ONLY.match(n.value):
            how = "base 60" if ":" in n.value else "octal"
            read = yaml.safe_load(n.value)
            raise SpecError(f"{p}: line {line}: {where}: YAML 1.1 reads {n.value} as {read} ({how}); "
                            f"write the number you mean in plain decimal digits, without leading zeros or colons")
        if n.tag == _BOOL_TAG:
            raise SpecError(f"{p}: line {line}: {where}: YAML reads {n.value} as true/false; write a number")


def _parse(text: str, p: Path) -> Any:
    try:
        _check_shape(text, p)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _count_nodes(node, p)
            _as_written(node, p)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _DuplicateKey as e:
        raise SpecError(f"{p}: line {e.line}: duplicate key {e.key!r} (first at line {e.first}); keep only one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        raise SpecError(f"{p}:{where} not valid YAML: {_yaml_problem(e)}") from None
    except SpecError:
        raise
    except RecursionError:
        raise SpecError(f"{p}: nested too deeply to be a deployment spec") from None
    except Exception as e:  # a value PyYAML's constructors cannot build (e.g. `2001-02-30` as a date)
        raise SpecError(f"{p}: not a valid YAML value ({' '.join(str(e).split()) or type(e).__name__}); "
                        "quote a value meant as text, e.g. description: \"2001-02-30\"") from None


def load(path: str | os.PathLike | None = None) -> Deployment:
    """Load and validate a deployment spec; default: the story's Qwen3.5 NVFP4 deployment."""
    p = Path(path) if path else DEFAULT_SPEC
    data = _parse(_read_spec(p), p)
    return from_dict(data, str(p.resolve()))
