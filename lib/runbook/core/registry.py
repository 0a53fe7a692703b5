"""The stage registry (papermill's engine registry is the model): each stage package registers, in its
`stage.py`, its number, name, CLI verb, options model and `evaluate(spec, options) -> Report`, and with them
what its verb prints, its verb's other actions and the one finding an input error becomes.

The CLI's verbs, the runner's notebook list, the run summary's figures, the fleet index's trend keys
and a stage's own look-ups of earlier results all read this registry, so a notebook's file name is
written in one place: `Stage.notebook`. Adding a stage is one package with a `stage.py`, one
notebook `NN_name.ipynb` and its tests; `stages()` finds the package by that file.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

import runbook
from runbook.core.errors import RunbookError
from runbook.core.findings import Finding
from runbook.core.options import Options, located

if TYPE_CHECKING:
    from runbook.core.spec import SLO, Deployment


class Report(Protocol):
    """What every stage's `evaluate` returns: its findings and one results-JSON payload."""

    findings: list[Finding]

    def data(self) -> dict[str, Any]:
        """The results-JSON payload (what the notebook archives and `--json` prints, less the findings)."""
        ...


@dataclass
class Outcome:
    """What one of a verb's other actions returns (service render, accuracy's probes): its findings, the rest of
    its `--json` document, and what it prints without `--json` in place of the findings (None: the findings)."""

    findings: list[Finding]
    payload: dict[str, Any]
    shown: str | None = None
    listed: bool = True         # False: the document is the payload alone (`service render` lists units only)

    def data(self) -> dict[str, Any]:
        return dict(self.payload)


@dataclass
class Empty:
    """The report of a stage whose input could not be used (`notebook.evaluate`): its one `<verb>.input` finding and
    nothing to show, so a notebook's display cells need no guard: every display function returns None for it."""

    findings: list[Finding]

    def data(self) -> dict[str, Any]:
        return {}


R = TypeVar("R")
T = TypeVar("T")
P = ParamSpec("P")


def display(fn: Callable[Concatenate[R, P], T]) -> Callable[Concatenate[R | Empty, P], T | None]:
    """A report module's display function (a table, plot or text of one report): None for an Empty report."""
    @functools.wraps(fn)
    def shown(rep: R | Empty, /, *args: P.args, **kwargs: P.kwargs) -> T | None:
        return None if isinstance(rep, Empty) else fn(rep, *args, **kwargs)
    return shown


def document(report: Report) -> dict[str, Any]:
    """The `--json` document of a stage: its payload plus its findings, the same for every verb."""
    if isinstance(report, Outcome) and not report.listed:
        return report.data()
    return dict(report.data(), findings=[f.to_dict() for f in report.findings])


@dataclass(frozen=True)
class Stage:
    number: int
    name: str                       # the notebook's stem without its number; `runbook run --only NAME`
    verb: str                       # `python -m runbook VERB`
    summary: str                    # one line: the CLI's help and the docs' table
    options: type[Options]          # every setting: type, bound, default and help, declared once
    evaluate: Callable[[Deployment, Any], Report]
    # The figures a run summary takes from this stage's results data (runner/figures.py) and the
    # ones the fleet index trends.
    figures: Callable[[dict[str, Any], SLO | None], dict[str, Any]] | None = None
    trends: tuple[str, ...] = ()
    # False: `runbook run` leaves the stage out unless `--only` names it (tune takes the server down).
    in_default_run: bool = True
    # What the verb prints above the findings without --json (the notebook's first table); "" prints nothing.
    text: Callable[[Any], str] | None = None
    # The verb's other actions, picked by the value of the options field `action_field` (service's render, check,
    # ...; accuracy's probes): each takes (spec, options) and returns an Outcome. Any other value runs `evaluate`.
    actions: dict[str, Callable[[Deployment, Any], Outcome]] = field(default_factory=dict)
    action_field: str = ""
    # Settings whose CLI default is read when the verb runs (bench's progress bars: on when stderr is a terminal).
    cli_defaults: Callable[[], dict[str, Any]] | None = None

    @property
    def package(self) -> str:
        """The stage's package under runbook (kv for runbook.kv)."""
        return self.evaluate.__module__.split(".")[1]

    @property
    def notebook(self) -> str:
        """The notebook's stem, e.g. 20_kv_memory: results files are `<notebook>.results.json`."""
        return f"{self.number:02d}_{self.name}"

    def entry(self, options: Any) -> Callable[[Any, Any], Report]:
        """The action the options name (`actions`), else `evaluate`: what the verb runs."""
        return self.actions.get(getattr(options, self.action_field, "") if self.action_field else "", self.evaluate)

    def input_finding(self, err: RunbookError, cli: bool = False) -> Finding:
        """The one finding an input the stage could not use becomes (a missing file, a bad value), `<verb>.input`:
        the notebook records it and completes; the CLI prints its detail as its error line. A `{field}` the error names
        is the flag on the command line (`cli`), else the notebook's parameter (core/options.py `located`)."""
        detail = located(self.options, " ".join(err.template.split()), cli)
        return Finding(f"{self.verb}.input", "fail", f"could not run the {self.verb} checks", detail=detail,
                       remedy="Fix the file or field named above and run the notebook again.")


_STAGES: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    """Add a stage; a second stage with the same name, number or verb is a programming error."""
    for s in _STAGES.values():
        if s.name != stage.name and (s.number == stage.number or s.verb == stage.verb):
            raise ValueError(f"stage {stage.name}: number {stage.number} or verb {stage.verb!r} already taken by {s.name}")
    _STAGES[stage.name] = stage
    return stage


def _discover() -> None:
    for mod in pkgutil.iter_modules(runbook.__path__):
        where = getattr(mod.module_finder, "path", None)
        if mod.ispkg and where and (Path(where) / mod.name / "stage.py").is_file():   # without importing the others
            importlib.import_module(f"runbook.{mod.name}")


def stages() -> list[Stage]:
    """Every registered stage in reading order (its number)."""
    _discover()
    return sorted(_STAGES.values(), key=lambda s: s.number)


def get(key: str) -> Stage:
    """A stage by name (kv_memory), notebook stem (20_kv_memory) or verb (kv)."""
    for s in stages():
        if key in (s.name, s.notebook, s.verb):
            return s
    raise KeyError(key)


def notebook(name: str) -> str:
    """A stage's notebook stem by its name, for messages that point the reader at another stage."""
    return get(name).notebook


def trend_keys() -> tuple[str, ...]:
    """The run-summary figures the fleet index trends, in stage order."""
    return tuple(k for s in stages() for k in s.trends)
