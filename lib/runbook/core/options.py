"""Stage settings, declared once: each stage's pydantic options model holds every setting's type,
bound, default and help. The CLI's flags are generated from it (cli.py's one builder),
the notebooks' parameters are validated through it (`from_params`), and core/settings.py's one `resolve`
merges the spec's values into it. None means unset everywhere (an absent flag, a parameter
left at None): the spec's value; a bool with a spec counterpart is `bool | None`, so --no-X turns a spec's
true off. Field name = notebook parameter; `alias` = the CLI flag where the two differ (`installed_unit` /
`--installed`)."""
from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from runbook.core.errors import FIELD_REF, InputError

# Every number a user gives (spec, flag, notebook parameter) is finite: nan compares false with every bound
# and inf turns the arithmetic absurd. Models and adapters take this config; FiniteFloat carries it where
# no model does.
FINITE = ConfigDict(allow_inf_nan=False)
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class Options(BaseModel):
    """Base of every stage's options: unknown names refused, CLI flag or parameter name accepted."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, frozen=True, **FINITE)


def _whole(v: Any) -> Any:
    """A whole number as written: an int, or text of digits. pydantic's lax mode would take "8.0", 8.0 and
    True as 8 and 1; a flag or parameter that says --tp 8.0 is a typo, not a tensor-parallel size."""
    if isinstance(v, (bool, float)) or (isinstance(v, str) and not re.fullmatch(r"\s*[+-]?\d+\s*", v)):
        raise ValueError("must be an integer")
    return v


def _url(s: str) -> str:
    bad = ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:30000")
    if not s or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in s):
        raise bad
    try:
        u = urlsplit(s)
        u.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise bad from None
    if u.scheme.lower() not in ("http", "https") or not u.hostname:
        raise bad
    return s


def _cc(v: str) -> str:
    if not re.fullmatch(r"\d{1,2}\.\d", v.strip()):
        raise ValueError("must be a compute capability such as 9.0 or 12.0")
    return v.strip()


# The value types the stages share (bounds in one place).
Integer = Annotated[int, BeforeValidator(_whole)]
PosInt = Annotated[Integer, Field(ge=1)]
NonNegInt = Annotated[Integer, Field(ge=0)]
PosFloat = Annotated[FiniteFloat, Field(gt=0)]
NonNegFloat = Annotated[FiniteFloat, Field(ge=0)]
Fraction = Annotated[FiniteFloat, Field(ge=0, le=1)]   # 0..1 inclusive
Url = Annotated[str, AfterValidator(_url)]
ComputeCapability = Annotated[str, AfterValidator(_cc)]

OptionsT = TypeVar("OptionsT", bound=Options)


def flag(model: type[BaseModel], name: str) -> str:
    """The CLI flag of a field: `--` + its alias (or name) with dashes."""
    f = model.model_fields[name]
    return "--" + (f.alias or name).replace("_", "-")


# pydantic's error types in the CLI's own words ("--tp must be at least 1 (got 0)").
_WORDS = {
    "int_parsing": "must be an integer", "int_from_float": "must be an integer", "int_type": "must be an integer",
    "float_parsing": "must be a number", "float_type": "must be a number", "finite_number": "must be finite",
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "literal_error": "must be {expected}", "bool_parsing": "must be true or false",
    "list_type": "must be a comma-separated list", "string_type": "must be text",
}


def describe(err: Any) -> str:
    """One pydantic error in the CLI's words: 'must be at least 1'."""
    ctx = err.get("ctx") or {}
    if err["type"] == "greater_than" and ctx.get("gt") == 0:
        return "must be positive"
    template = _WORDS.get(err["type"])
    if template is None:
        return str(err["msg"]).removeprefix("Value error, ")
    return template.format(**{k: v for k, v in ctx.items()}) if ctx else template.split(" {")[0]


def located(model: type[BaseModel], msg: str, cli: bool | None) -> str:
    """A rule's message with each `{field}` it names as its reader knows it: the CLI flag (`--log`), else the
    notebook parameter (`log_file`). Validators name fields this way, never by a flag's spelling. `cli` None: not
    known yet (a stage's settings resolved while it runs): left as `{field}` for Stage.input_finding to locate."""
    if cli is None:
        return msg
    def name(m: re.Match[str]) -> str:
        field = next((k for k, f in model.model_fields.items() if m.group(1) in (k, f.alias)), None)
        if field is None:   # another stage's setting (bench's, met inside tune): its usual spelling
            return "--" + m.group(1).replace("_", "-") if cli else m.group(1)
        return flag(model, field) if cli else field
    return FIELD_REF.sub(name, msg)


def marks(f: FieldInfo) -> dict[str, Any]:
    """What a field says about itself beyond its type (its `json_schema_extra`): `positional`, `switch`, `each`,
    `metavar`, `echo`, `shared`, `spec_less`, `internal` (docs/contributing.md)."""
    return f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}


def echoes(f: FieldInfo) -> bool:
    """Whether an error may repeat the field's value: not where it may hold credentials (`"echo": False`)."""
    return marks(f).get("echo", True) is True


_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")   # a number as typed: shown without quotes


def shown(err: Any, echo: bool) -> str:
    """' (got X)': the value an error refused, added here only (a validator's message never quotes its input, so
    the value shows once and never where the field says `"echo": False`); '' for a whole model."""
    got = err.get("input")
    if not echo or got is None or isinstance(got, (dict, BaseModel)):
        return ""
    number = isinstance(got, str) and _NUMBER.fullmatch(got) is not None
    return f" (got {got!r})" if isinstance(got, str) and not number else f" (got {got})"


def _problem(model: type[BaseModel], e: ValidationError, cli: bool | None) -> str:
    """The first error, located by its `loc`: the field it names gives the flag (cli) or the parameter, and
    whether its value may be shown."""
    err = e.errors()[0]
    loc = [x for x in err["loc"] if isinstance(x, str)]
    name = loc[0] if loc else ""
    field = next((k for k, f in model.model_fields.items() if name in (k, f.alias)), None)
    if field is None:
        return located(model, describe(err), cli) if not name else f"{name}: not a setting of this stage"
    where = flag(model, field) if cli else "{" + field + "}" if cli is None else field
    return phrase(where, located(model, describe(err), cli) + shown(err, echoes(model.model_fields[field])))


def phrase(where: str, msg: str) -> str:
    """An error naming its flag or parameter, in one style: '--tp must be at least 1', '--contexts: ...'."""
    return f"{where} {msg}" if msg.startswith("must ") else f"{where}: {msg}"


def validate(model: type[OptionsT], values: dict[str, Any], cli: bool | None = False) -> OptionsT:
    """The options from explicit values; a bad one is an InputError naming the flag (cli) or the
    notebook parameter (or, cli None, `{field}` for its reader: `located`), on one line."""
    try:
        return model.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        raise InputError(_problem(model, e, cli)) from None


def from_params(model: type[OptionsT], params: dict[str, Any]) -> OptionsT:
    """A notebook's options: its parameters with the unset ones (None) dropped, as an absent flag; 0, False,
    "" and [] are values. A field is named as its notebook parameter (the runner's too: `artifact_dir`, whose flag,
    its alias, is --out), so nothing is renamed; validated through the stage's model."""
    return validate(model, params)
