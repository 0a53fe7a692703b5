"""`python -m runbook VERB`: flags -> the same library call a notebook makes -> an exit code.

Exit codes (stable, for cron): 0 ok; 1 a check failed; 2 could not run (bad input, a notebook
errored); 75 another run of the deployment holds the lock; 77 a safety stop (tune would stop an active
production unit and --yes was not given); 128+N stopped by signal N (tune: after production was restored).
"""
from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticUndefined

from runbook import alerts, fleet
from runbook.core import registry, secrets
from runbook.core.errors import EXIT_LOCKED, EXIT_SAFETY_STOP, InputError, LockHeld, RunbookError, SafetyStop
from runbook.core.findings import exit_code, format_text
from runbook.core.options import Options, describe, echoes, flag, marks, phrase, shown, validate
from runbook.core.oscalls import Interrupted
from runbook.core.registry import Outcome, Stage, document
from runbook.core.settings import default_text, shown_default
from runbook.core.spec import load as load_spec
from runbook.runner.run import PushOptions, RunOptions, push, run


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors naming the option (cron logs; no usage block)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)   # its errors reach parse_known_args below, option and message apart
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as e:
            opt = (e.argument_name or "").split("/")[-1]   # "-h/--help" style: the long form
            self.error(phrase(opt, e.message) if opt else e.message)

    def error(self, message: str) -> Any:
        # a flag's value may be an environment secret (a key pasted into --url): never echoed
        text = secrets.redact_text(" ".join(message.split()), secrets.secret_values())
        self.exit(2, f"{self.prog}: error: {text}\n")


def _typed(tp: Any, echo: bool) -> Callable[[str], Any]:
    """A flag's argparse type from its field's value type (core/options.py: one table of bounds): its error in the
    model's own words, the value added as the model adds it (never for a field marked `"echo": False`). Its validator
    is built when a value is first read: every verb's parser is built for any command (~0.3 ms a field)."""
    adapter: list[TypeAdapter[Any]] = []

    def parse(s: str) -> Any:
        if not adapter:
            adapter.append(TypeAdapter(tp))
        try:
            return adapter[0].validate_python(s.strip())
        except ValidationError as e:
            err = e.errors()[0]
            raise argparse.ArgumentTypeError(describe(err) + shown(err, echo)) from None
    return parse


def _add_deployment(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deployment", metavar="FILE", help="deployment spec (default: deployments/qwen3.5-397b-a17b-nvfp4.yaml)")


def _add_json(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def _add_textfile(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--textfile-dir", default=None, metavar="DIR",
                   help=f"write Prometheus metrics to DIR/{name} for node_exporter's textfile collector "
                        "(default: $RUNBOOK_TEXTFILE_DIR, else the spec's alerts.textfile_dir)")


def _textfile(a: argparse.Namespace, spec: Any) -> Any:
    """The stage verb's textfile directory (flag > env > spec), checked before the stage runs; None: none set,
    or no deployment to name the file after (MODEL_DIR alone) unless the flag asked for one."""
    directory, where = alerts.textfile.resolve_dir(a.textfile_dir, spec.alerts.textfile_dir if spec else None)
    if directory is None or (spec is None and not a.textfile_dir):
        return None
    if spec is None:
        raise InputError("--textfile-dir: metrics are per deployment; give --deployment FILE too")
    alerts.textfile.check_dir(directory, where)
    return directory


_METAVARS = {int: "N", float: "X", str: "VALUE"}


class _Items(argparse.Action):
    """A list flag: comma-separated values or a JSON list, repeatable (the lists add up); each item checked by the
    field's own item type. `each`: every occurrence is one item as written (NAME=VALUE may hold commas)."""

    def __init__(self, *args: Any, item: Callable[[str], Any], each: bool = False, echo: bool = True, **kw: Any) -> None:
        self.item, self.each, self.echo = item, each, echo
        super().__init__(*args, **kw)

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any, option: Any = None) -> None:
        text = str(values)
        try:
            parts = [text] if self.each else (json.loads(text) if text.lstrip().startswith("[") else text.split(","))
        except json.JSONDecodeError:
            raise argparse.ArgumentError(self, "must be a comma-separated list" + shown({"input": text}, self.echo)) from None
        try:
            got = [self.item(str(x)) for x in parts]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        setattr(ns, self.dest, [*(getattr(ns, self.dest) or []), *got])


def _field_type(f: Any) -> Any:
    """A field's value type without None, with its bounds (its metadata) kept."""
    tp = f.annotation
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return Annotated.__class_getitem__((tp, *f.metadata)) if f.metadata else tp  # type: ignore[attr-defined]


def _default_note(default: Any) -> str:
    """Every flag's default shown one way: ' (default: X)' where the field has one; None (unset) shows nothing."""
    if default is None or default is PydanticUndefined or isinstance(default, bool) or default == []:
        return ""
    return f" (default: {default_text(default)})"


def _settings_default(f: Any) -> Any:
    """What unset takes where the options view's settings hold it (core/settings.py), else the field's own default."""
    shown = shown_default(f)
    return f.default if shown is None else shown


def _add_fields(p: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """Every verb's flags, built one way from its options model: flag, metavar and help from the field; each value
    checked by the field's own type and bounds as it is read, so a bad one names its flag; an absent flag is None.
    The field says what it is: `positional` (its metavar), `switch` (a bool with no --no- form), `each` (a list
    flag taking one item per occurrence), `shared` (a flag every verb has, added once for all: --deployment);
    a bool that may turn a spec's value off gets --X/--no-X; a field without a default is a required flag."""
    for name, f in model.model_fields.items():
        extra = marks(f)
        if extra.get("internal") or extra.get("shared"):
            continue
        tp = _field_type(f)
        kind = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
        # an option's default is its settings' (core/settings.py options_view records it as "default")
        note = "" if not f.description or "(default" in f.description else _default_note(_settings_default(f))
        help_ = f.description + note if f.description else argparse.SUPPRESS
        echo = echoes(f)
        if extra.get("positional"):
            choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
            p.add_argument(name, nargs="?", choices=choices, default=None, help=help_,
                           metavar=None if choices else str(extra["positional"]))
            continue
        kw: dict[str, Any] = {"dest": name, "default": None, "help": help_, "required": f.is_required()}
        if kind is bool:
            kw.update(action="store_true" if extra.get("switch") or f.default is False else argparse.BooleanOptionalAction)
        elif typing.get_origin(kind) is list:
            item = typing.get_args(kind)[0]
            base = typing.get_args(item)[0] if typing.get_origin(item) is Annotated else item
            kw.update(action=_Items, item=_typed(item, echo), each=bool(extra.get("each")), echo=echo,
                      metavar=extra.get("metavar") or f"{_METAVARS.get(base, 'VALUE') if base is not str else 'NAME'},...")
        else:
            choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
            kw.update(type=_typed(tp, echo), choices=choices,
                      metavar=None if choices else extra.get("metavar") or _METAVARS.get(kind, "VALUE"))
        p.add_argument(flag(model, name), **kw)


def _values(model: type[BaseModel], a: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(a, name, None) for name in model.model_fields}


def _cmd_run(a: argparse.Namespace) -> int:
    code, _ = run(validate(RunOptions, _values(RunOptions, a), cli=True))
    return code


def _cmd_push(a: argparse.Namespace) -> int:
    res = push(validate(PushOptions, _values(PushOptions, a), cli=True))
    if a.json:
        print(json.dumps([r.__dict__ for r in res], indent=2))
    else:
        for r in res:
            print(f"{'uploaded' if r.ok else 'FAILED  '} {r.run_id} -> {r.url}" + ("" if r.ok else f" ({r.error})"))
        if not res:
            print("nothing to upload: every run is in the store")
    return 0 if all(r.ok for r in res) else 1


def _cmd_fleet(a: argparse.Namespace) -> int:
    made = fleet.make(validate(fleet.FleetOptions, _values(fleet.FleetOptions, a), cli=True))
    print(made.json.read_text() if a.json else made.text())
    return 0


def _load(a: argparse.Namespace, o: Options) -> Any:
    """The deployment spec; None when a field marked `spec_less` (quant's and kv's MODEL_DIR) is given without
    --deployment: the stage then reads that instead of a spec."""
    instead = any(getattr(o, name) for name, f in type(o).model_fields.items() if marks(f).get("spec_less"))
    return None if instead and not a.deployment else load_spec(a.deployment)


def _cmd_stage(stage: Stage, a: argparse.Namespace, o: Options) -> int:
    """What the options pick, as the notebook calls it: the stage's entry point (its JSON is the results payload plus
    findings; its textfile metrics) or one of the verb's other actions."""
    spec = _load(a, o)
    entry = stage.entry(o)
    if entry is not stage.evaluate and a.textfile_dir:    # an action publishes nothing: say so rather than write nothing
        raise InputError(f"--textfile-dir publishes `runbook {stage.verb}`'s own checks; this action writes no metrics: "
                         "drop --textfile-dir, or run the verb without an action")
    directory = _textfile(a, spec) if entry is stage.evaluate else None
    rep = entry(spec, o)
    if directory is not None:
        alerts.publish_stage(directory, spec, stage.name, rep, lambda m: print(f"runbook {stage.verb}: {m}", file=sys.stderr))
    if a.json:
        print(json.dumps(document(rep), indent=2, default=str))
    elif isinstance(rep, Outcome) and rep.shown is not None:
        sys.stdout.write(rep.shown)
    else:
        shown = stage.text(rep) if stage.text else ""
        if shown:
            print(shown)
        print(format_text(rep.findings, colour=sys.stdout.isatty()))
    return exit_code(rep.findings, a.strict)


_VERBS: dict[str, Stage] = {}   # verb -> its stage


def _add_stage(sub: Any, stage: Stage) -> None:
    p = sub.add_parser(stage.verb, help=stage.summary, description=stage.summary)
    _add_deployment(p)
    _add_fields(p, stage.options)
    _add_json(p, "the report")
    p.add_argument("--strict", action="store_true", help="warn and skip findings also give exit 1")
    _add_textfile(p, f"runbook_<deployment>.{stage.name}.prom")
    _VERBS[stage.verb] = stage


def _options(verb: str, a: argparse.Namespace) -> Any:
    """The verb's flags, each already checked by its own type, validated as a whole by the stage's model."""
    stage = _VERBS[verb]
    values = _values(stage.options, a)
    for name, value in (stage.cli_defaults() if stage.cli_defaults else {}).items():
        if values.get(name) is None:
            values[name] = value
    return validate(stage.options, values, cli=True)


def build_parser() -> argparse.ArgumentParser:

    p = _Parser(prog="runbook", description="SGLang deployment runbooks: checks, archive, reports.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    r = sub.add_parser("run", help="execute the notebooks with papermill and archive the run")
    _add_deployment(r)
    _add_fields(r, RunOptions)
    _add_textfile(r, "runbook_<deployment>.prom")
    r.set_defaults(fn=_cmd_run)

    for stage in registry.stages():
        _add_stage(sub, stage)

    pu = sub.add_parser("push", help="upload local runs that are not yet in the archive store (what a failed upload left)")
    _add_deployment(pu)
    _add_fields(pu, PushOptions)
    _add_json(pu, "the uploads")
    pu.set_defaults(fn=_cmd_push)

    fl = sub.add_parser("fleet", help="one static index of every host's runs in an archive store")
    _add_fields(fl, fleet.FleetOptions)
    _add_json(fl, "the fleet index")
    fl.set_defaults(fn=_cmd_fleet)
    return p


def _run_stage(verb: str, a: argparse.Namespace) -> int:
    stage = _VERBS[verb]
    try:
        o = _options(verb, a)
    except InputError as e:
        # a flag's value may be an environment secret (a key pasted into --url): never echoed
        print(f"runbook {verb}: error: {secrets.redact_text(stage.input_finding(e, cli=True).detail, secrets.secret_values())}",
              file=sys.stderr)
        return 2
    return _cmd_stage(stage, a, o)




def resume_command(argv: list[str], run_id: str) -> str:
    """The command line that continues a run: the same verb and flags, any --resume replaced by this run's."""
    out: list[str] = []
    skip = False
    for w in argv:
        if skip:
            skip = False
        elif w == "--resume":
            skip = True
        elif not w.startswith("--resume="):
            out.append(w)
    return shlex.join([sys.executable, "-m", "runbook", *out, "--resume", run_id])


def _interrupted(verb: str, argv: list[str], e: Interrupted) -> int:
    """What an operator needs after a signal stopped a stage: what state it left, and how to go on."""
    print(f"runbook {verb}: stopped by {e.name}", file=sys.stderr)
    findings = getattr(e, "findings", None)
    if findings:
        print(format_text(findings, colour=sys.stderr.isatty()), file=sys.stderr)
    run_id = getattr(e, "run_id", None)
    if run_id:
        print(f"runbook {verb}: to continue run {run_id}: {resume_command(argv, run_id)}", file=sys.stderr)
    elif hasattr(e, "run_id"):
        print(f"runbook {verb}: no run was started; run the same command again", file=sys.stderr)
    return e.exit_code


def main(argv: list[str] | None = None) -> int:
    # What the imports built (every stage's modules and options models) lives as long as the command: out of the
    # collector's sight, the start-up's own collections stop re-scanning it (~25 ms of a 0.4 s `--help`).
    gc.freeze()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:       # a flag's one-line error (2), or --help (0): the code, as for every other outcome
        return e.code if isinstance(e.code, int) else 2
    try:
        if args.verb in _VERBS:
            return _run_stage(args.verb, args)
        fn: Callable[[argparse.Namespace], int] = args.fn
        return fn(args)
    except Interrupted as e:
        return _interrupted(args.verb, argv, e)
    except LockHeld as e:
        print(f"runbook: {e}", file=sys.stderr)
        return EXIT_LOCKED
    except SafetyStop as e:
        print(f"runbook {args.verb}: safety stop: {e}", file=sys.stderr)
        return EXIT_SAFETY_STOP
    except RunbookError as e:
        # an error may quote what the user typed (--param KEY=VALUE): the environment's secrets never reach stderr;
        # a stage's error names its settings as flags (Stage.input_finding)
        text = _VERBS[args.verb].input_finding(e, cli=True).detail if args.verb in _VERBS else str(e)
        print(f"runbook: error: {secrets.redact_text(text, secrets.secret_values())}", file=sys.stderr)
        return 2
