"""One settings base: a stage's options (what a flag or a notebook parameter set; None is unset) resolved against the
deployment spec into the frozen settings its run reads. Each field says where its spec value comes from, on the field
(`from_spec("benchmark.concurrency")`, or a function for the few computed ones); an unset field takes that value, else
the field's own default, so a default lives in one place. `Settings.resolve` is the one merge (CLI, notebook and the
stages that call another's, such as tune); a stage whose settings need a value derived from the merged ones
overrides `derived`. `options_view` makes the options model (flags, notebook parameters) from the settings model."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar, cast

from pydantic import Field, ValidationError, create_model, model_validator
from pydantic_core import PydanticUndefined

from runbook.core.errors import InputError
from runbook.core.options import Options, describe, phrase, validate

if TYPE_CHECKING:
    from pydantic.json_schema import JsonDict  # for the type only: importing it costs the CLI's start-up ~2.5 ms

    from runbook.core.spec import Deployment

_SPEC = "spec"          # json_schema_extra: where the field's spec value comes from
_AT = "spec_at"         # json_schema_extra: where a computed spec value is read, for errors
_INTERNAL = "internal"  # json_schema_extra: set by the run itself, no flag or notebook parameter
SHOWN_DEFAULT = "default"   # json_schema_extra: the default --help shows for an option whose settings hold it

SettingsT = TypeVar("SettingsT", bound="Settings")
# A computed source: (the spec or None, the values the options and the caller set) -> the value, None for none.
Computed = Callable[["Deployment | None", dict[str, Any]], Any]


def from_spec(source: str | Computed, at: str | None = None, **extra: Any) -> JsonDict:
    """A field's json_schema_extra naming where its spec value comes from: a dotted path into the spec (a mapping's
    key after a dot, e.g. `serving.flags.context-length`), read only when there is a spec; or `f(spec, given)` for a
    computed one, called with or without a spec, with `at` the path an error about its value names. None from
    either leaves the field's default."""
    return cast("JsonDict", {_SPEC: source, **({_AT: at} if at else {}), **extra})


def internal(default: Any, description: str, source: str | Computed | None = None, **kw: Any) -> Any:
    """A setting the run sets itself (from the spec, or a caller such as tune): no flag, no notebook parameter."""
    extra: JsonDict = {_INTERNAL: True, **(from_spec(source) if source is not None else {})}
    return Field(default, description=description, json_schema_extra=extra, **kw)


def read(spec: Any, path: str) -> Any:
    """The value at a dotted path of the spec (attributes, then a mapping's keys); None where any step is missing."""
    obj = spec
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, Mapping) else getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _spec_problem(spec: Any, where: str, e: ValidationError, got: Any) -> str:
    """'qwen.yaml: serving.flags --mem-fraction-static must be a number (got 'lots')': the spec's file and place."""
    flags = "serving.flags."
    place = f"{flags[:-1]} --{where[len(flags):]}" if where.startswith(flags) else where
    return f"{getattr(spec, 'source', None) or 'the spec'}: " + phrase(place, f"{describe(e.errors()[0])} (got {got!r})")


def _extra(f: Any) -> dict[str, Any]:
    return f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}


class Settings(Options):
    """Base of the frozen settings a stage runs on; its fields declare their spec sources (`from_spec`)."""

    @classmethod
    def resolve(cls: type[SettingsT], spec: Deployment | None = None, options: Options | None = None,
                **values: Any) -> SettingsT:
        """The options' set fields, then `values` (what a caller sets itself: internal settings, tune's plan), over each
        field's spec value; None is unset everywhere. InputError naming the setting when a value or a rule fails."""
        names = {f.alias: k for k, f in cls.model_fields.items() if f.alias}     # a flag's name (rate) -> its field
        # the options' settings (a view's own fields, e.g. kv's model_dir, are its stage's to read)
        given = options.model_dump(exclude_none=True, include=set(cls.model_fields)) if options is not None else {}
        given.update({names.get(k, k): v for k, v in values.items() if v is not None})
        base: dict[str, Any] = {}
        for k, f in cls.model_fields.items():
            source = _extra(f).get(_SPEC)
            if k in given or source is None:
                continue
            v = source(spec, given) if callable(source) else (read(spec, source) if spec is not None else None)
            if v is not None:
                base[k] = v
        merged = {**base, **given}
        try:
            s = cls.model_validate(merged)
        except ValidationError as e:
            loc = e.errors()[0]["loc"]
            k = names.get(str(loc[0]), str(loc[0])) if loc else ""
            if k in base:      # a spec value the settings refuse: named where the spec holds it
                extra = _extra(cls.model_fields[k])
                where = extra[_SPEC] if isinstance(extra[_SPEC], str) else extra.get(_AT, k)
                raise InputError(_spec_problem(spec, where, e, base[k])) from None
            s = validate(cls, merged, cli=None)   # raises: the value named as `{field}`, located by Stage.input_finding
        return s.derived(spec)

    def derived(self: SettingsT, spec: Deployment | None) -> SettingsT:
        """The settings with what follows from their merged values (accuracy: the lengths that fit the server's
        context); the merged settings themselves unless a stage overrides it."""
        return self


def default_text(value: Any) -> str:
    """A default as --help and a notebook's parameters cell both say it: a list joined by commas, a float as %g, a
    switch as on/off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def shown_default(f: Any) -> Any:
    """The default an option's settings hold (None where it has none of its own: unset is the spec's value)."""
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    return extra.get(SHOWN_DEFAULT)


def options_view(settings: type[Options], name: str, help: dict[str, str] | None = None,
                 own: dict[str, Any] | None = None) -> type[Options]:
    """A settings model as a stage's options: every field but the `internal()` ones, each optional with None meaning
    unset (the spec's value, else the setting's default, which --help shows), with the type, bounds, alias and help
    the settings declare (`help` replaces a field's, e.g. one built from a registry the settings module cannot import).
    `own`: options that are no setting of the model, first (name -> (type, Field)), e.g. where to read what the
    settings are resolved from. The settings' cross-field rules (after-validators, each taking None for unset) hold
    for the options too, so a notebook and the CLI refuse a bad pair when the options are made, each naming the
    fields as its reader knows them."""
    fields: dict[str, Any] = dict(own or {})
    for k, f in settings.model_fields.items():
        extra = {x: v for x, v in _extra(f).items() if x not in (_SPEC, _AT)}
        if extra.get(_INTERNAL):
            continue
        default = f.get_default(call_default_factory=True)
        if default is not None and default is not PydanticUndefined and default != []:
            extra[SHOWN_DEFAULT] = default
        kind = Annotated.__class_getitem__((f.annotation, *f.metadata)) if f.metadata else f.annotation  # type: ignore[attr-defined]
        fields[k] = (Optional[kind], Field(None, alias=f.alias, description=(help or {}).get(k, f.description),  # noqa: UP045
                                           json_schema_extra=extra or None))
    rules: dict[str, Any] = {f"_rule_{n}": model_validator(mode="after")(d.func) for n, d in
                             settings.__pydantic_decorators__.model_validators.items() if d.info.mode == "after"}
    model = create_model(name, __base__=Options, __doc__=f"{settings.__name__}'s settings as options: None is unset.",
                         __module__=settings.__module__, __validators__=rules, **fields)
    _VIEWS[model] = settings
    return cast(type[Options], model)


_VIEWS: dict[type, type[Options]] = {}


def settings_of(options: type[Options]) -> type[Options] | None:
    """The settings model an options model is the view of (None: options made by hand)."""
    return _VIEWS.get(options)
