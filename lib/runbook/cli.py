"""`python -m runbook VERB`: flags -> the same library call a notebook makes -> an exit code.

Exit codes (stable, for cron): 0 ok; 1 a check failed; 2 could not run (bad input, a notebook
errored); 75 another run of the deployment holds the lock; 77 a safety stop (tune would stop an active
production unit and --yes was not given); 128+N stopped by signal N (tune: after production was restored).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticUndefined

from runbook import alerts, fleet
from runbook.core import registry, secrets
from runbook.core.errors import EXIT_LOCKED, EXIT_SAFETY_STOP, InputError, LockHeld, RunbookError, SafetyStop
from runbook.core.findings import exit_code, format_text
from runbook.core.options import FiniteFloat, PosInt, Url, describe, flag, phrase, validate
from runbook.core.oscalls import Interrupted
from runbook.core.registry import Outcome, Stage, document
from runbook.core.spec import load as load_spec
from runbook.runner.run import OUTPUTS, ArchiveUrl, RunOptions, push, run
from runbook.runner.upload import open_store


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


def _typed(tp: Any, name: str, echo: bool = True) -> Callable[[str], Any]:
    """An argparse type from one of the stages' value types (core/options.py: one table of bounds), for
    the verbs outside the registry; its error in the same words as the stages' flags (echo=False: without
    the value, which may hold credentials)."""
    adapter: TypeAdapter[Any] = TypeAdapter(tp)

    def parse(s: str) -> Any:
        try:
            return adapter.validate_python(s.strip())
        except ValidationError as e:
            msg = describe(e.errors()[0])
            raise argparse.ArgumentTypeError(msg if "(got " in msg or not echo else f"{msg} (got {s!r})") from None
    parse.__name__ = name
    return parse


_POS_INT = _typed(PosInt, "int")
_URL = _typed(Url, "url")
_ARCHIVE_URL = _typed(ArchiveUrl, "archive_url", echo=False)   # the run verb's own check: one rule for both
_LINK_LIFETIME = _typed(Annotated[FiniteFloat, Field(ge=1, le=7 * 86400)], "float")


def _add_deployment(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deployment", metavar="FILE", help="deployment spec (default: deployments/qwen3.5-397b-a17b-nvfp4.yaml)")


def _add_output(p: argparse.ArgumentParser, what: str = "the report") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON")
    p.add_argument("--strict", action="store_true", help="warn and skip findings also give exit 1")


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


# The `run` flags the verbs share, added by their own helpers (_add_deployment, _add_textfile).
_SHARED = ("deployment", "textfile_dir")
_METAVARS = {int: "N", float: "X", str: "VALUE"}


class _Items(argparse.Action):
    """A list flag: comma-separated values or a JSON list, repeatable (the lists add up); each item checked by the
    field's own item type. `each`: every occurrence is one item as written (NAME=VALUE may hold commas)."""

    def __init__(self, *args: Any, item: Callable[[str], Any], each: bool = False, **kw: Any) -> None:
        self.item, self.each = item, each
        super().__init__(*args, **kw)

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any, option: Any = None) -> None:
        text = str(values)
        try:
            parts = [text] if self.each else (json.loads(text) if text.lstrip().startswith("[") else text.split(","))
        except json.JSONDecodeError:
            raise argparse.ArgumentError(self, f"must be a comma-separated list (got {text!r})") from None
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
    if isinstance(default, list):
        return f" (default: {','.join(map(str, default))})"
    return f" (default: {default:g})" if isinstance(default, float) else f" (default: {default})"


def _add_fields(p: argparse.ArgumentParser, model: type[BaseModel], skip: tuple[str, ...] = ()) -> None:
    """Every verb's flags, built one way from its options model: flag, metavar and help from the field; each value
    checked by the field's own type and bounds as it is read, so a bad one names its flag; an absent flag is None.
    The field says what it is: `positional` (its metavar), `switch` (a bool with no --no- form), `each` (a list
    flag taking one item per occurrence); a bool that may turn a spec's value off gets --X/--no-X."""
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if name in skip or extra.get("internal"):
            continue
        tp = _field_type(f)
        kind = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
        # an option's default is its settings' (core/settings.py options_view records it as "default")
        note = "" if not f.description or "(default" in f.description else _default_note(extra.get("default", f.default))
        help_ = f.description + note if f.description else argparse.SUPPRESS
        echo = extra.get("echo", True) is True
        if extra.get("positional"):
            choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
            p.add_argument(name, nargs="?", choices=choices, default=None, help=help_,
                           metavar=None if choices else str(extra["positional"]))
            continue
        kw: dict[str, Any] = {"dest": name, "default": None, "help": help_}
        if kind is bool:
            kw["action"] = "store_true" if extra.get("switch") or f.default is False else argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is list:
            item = typing.get_args(kind)[0]
            base = typing.get_args(item)[0] if typing.get_origin(item) is Annotated else item
            kw.update(action=_Items, item=_typed(item, name, echo=echo), each=bool(extra.get("each")),
                      metavar=extra.get("metavar") or f"{_METAVARS.get(base, 'VALUE') if base is not str else 'NAME'},...")
        else:
            choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
            kw.update(type=_typed(tp, name, echo=echo), choices=choices,
                      metavar=None if choices else extra.get("metavar") or _METAVARS.get(kind, "VALUE"))
        p.add_argument(flag(model, name), **kw)


def _values(model: type[BaseModel], a: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(a, name, None) for name in model.model_fields}


def _cmd_run(a: argparse.Namespace) -> int:
    code, _ = run(validate(RunOptions, _values(RunOptions, a), cli=True))
    return code


def _cmd_push(a: argparse.Namespace) -> int:
    res = push(Path(a.out), a.archive_url, a.deployment, a.run, everything=True)
    if a.json:
        print(json.dumps([r.__dict__ for r in res], indent=2))
    else:
        for r in res:
            print(f"{'uploaded' if r.ok else 'FAILED  '} {r.run_id} -> {r.url}" + ("" if r.ok else f" ({r.error})"))
        if not res:
            print("nothing to upload: every run is in the store")
    return 0 if all(r.ok for r in res) else 1


def _cmd_fleet(a: argparse.Namespace) -> int:
    fs, root = open_store(a.source)
    fl = fleet.collect(a.source, workers=a.workers, fs=fs, root=root)
    doc = fleet.build(fl, trend=a.trend, links=a.links, link_base=a.link_base, expires=int(a.expires), fs=fs)
    html, js = fleet.write(doc, Path(a.out))
    if a.publish:
        fs.pipe_file(f"{root}/index.html", html.read_bytes())
        fs.pipe_file(f"{root}/fleet.json", js.read_bytes())
    if a.json:
        print(js.read_text())
    else:
        print(f"{doc['runs']} completed runs, {len(doc['hosts'])} hosts, {len(doc['deployments'])} deployments "
              f"({fl.objects_listed} objects listed in {fl.timings['list_s']:.2f} s, summaries read in {fl.timings['read_s']:.2f} s)")
        print(f"Index: {html}\nJSON:  {js}" + (f"\nPublished: {a.source.rstrip('/')}/index.html" if a.publish else ""))
    return 0


def _load(a: argparse.Namespace, spec_less: bool = False) -> Any:
    """The deployment spec; None when a MODEL_DIR is given without --deployment (quant, kv)."""
    return None if (spec_less and a.model_dir and not a.deployment) else load_spec(a.deployment)


def _cmd_stage(stage: Stage, a: argparse.Namespace, o: Any) -> int:
    """What the options pick, as the notebook calls it: the stage's entry point (its JSON is the results payload plus
    findings; its textfile metrics) or one of the verb's other actions."""
    spec = _load(a, spec_less="model_dir" in type(o).model_fields)
    entry = stage.entry(o)
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
    _add_output(p)
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
    _add_fields(r, RunOptions, skip=_SHARED)
    _add_textfile(r, "runbook_<deployment>.prom")
    r.set_defaults(fn=_cmd_run)

    for stage in registry.stages():
        _add_stage(sub, stage)

    pu = sub.add_parser("push", help="upload local runs that are not yet in the archive store (what a failed upload left)")
    _add_deployment(pu)
    pu.add_argument("--out", default=str(OUTPUTS), metavar="DIR", help="archive root (default: outputs/)")
    pu.add_argument("--archive-url", type=_ARCHIVE_URL, default=None, metavar="URL",
                    help="s3://BUCKET/PREFIX (default: $RUNBOOK_ARCHIVE_URL, else the spec's archive.url)")
    pu.add_argument("--run", action="append", default=[], metavar="RUN_ID", help="upload exactly this run (again); repeatable")
    pu.add_argument("--json", action="store_true", help="print the uploads as JSON")
    pu.set_defaults(fn=_cmd_push)

    fl = sub.add_parser("fleet", help="one static index of every host's runs in an archive store")
    fl.add_argument("--from", dest="source", required=True, type=_ARCHIVE_URL, metavar="URL", help="s3://BUCKET/PREFIX the hosts upload to")
    fl.add_argument("--out", default="fleet", metavar="DIR", help="write index.html and fleet.json here (default: fleet/)")
    fl.add_argument("--links", choices=["relative", "presigned"], default="relative",
                    help="run links relative to PREFIX (the page served from the store; see --publish) or presigned URLs")
    fl.add_argument("--link-base", type=_URL, default=None, metavar="URL", help="relative links under this base, e.g. https://runbooks.example.com/fleet")
    fl.add_argument("--expires", type=_LINK_LIFETIME, default=7 * 86400, metavar="S",
                    help="presigned links' lifetime (default and max 7 days)")
    fl.add_argument("--trend", type=_POS_INT, default=30, metavar="N", help="runs per host and deployment in the trends (default: 30)")
    fl.add_argument("--workers", type=_POS_INT, default=64, metavar="N", help="summaries read concurrently (default: 64)")
    fl.add_argument("--publish", action="store_true", help="also write index.html and fleet.json to PREFIX/ in the store")
    fl.add_argument("--json", action="store_true", help="print the fleet JSON")
    fl.set_defaults(fn=_cmd_fleet)
    return p


def _run_stage(verb: str, a: argparse.Namespace) -> int:
    stage = _VERBS[verb]
    try:
        o = _options(verb, a)
    except InputError as e:
        # a flag's value may be an environment secret (a key pasted into --url): never echoed
        print(f"runbook {verb}: error: {secrets.redact_text(stage.input_finding(e).detail, secrets.secret_values())}",
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
        # an error may quote what the user typed (--param KEY=VALUE): the environment's secrets never reach stderr
        print(f"runbook: error: {secrets.redact_text(str(e), secrets.secret_values())}", file=sys.stderr)
        return 2
