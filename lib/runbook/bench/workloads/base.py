"""The workload contract. A workload is one module in this package defining `WORKLOAD`, an instance of a
`WorkloadType` subclass that declares, in one place: how `--workload` selects it, a one-line description
(CLI help, docs), the settings (bench/settings.py) it reads and its checks of them, its regression key, what the
sweep may do with it (rate levels, the SLO search, worker processes, A/B), and either a request source
(`build`) or a session driver (`sessions`). The run (bench/run.py) asks the workload and runs levels."""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.endpoint.records import RequestRecord, RequestSpec

if TYPE_CHECKING:
    from runbook.bench.sweep import Level, LevelResult


class LazyRequests(Sequence):
    """A workload's requests, built on first use and in order (so a `--duration` level planned for
    100,000 requests builds only those it sends); byte-identical to building them all up front."""

    def __init__(self, n: int, gen: Iterator[RequestSpec] | Callable[[int], RequestSpec]):
        self._n = n
        self._gen = gen
        self._memo: list[RequestSpec] = []

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestSpec]: ...

    def __getitem__(self, i: int | slice) -> RequestSpec | list[RequestSpec]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        if callable(self._gen):
            return self._gen(i)
        while len(self._memo) <= i:
            self._memo.append(next(self._gen))
        return self._memo[i]

    def __iter__(self) -> Iterator[RequestSpec]:
        for i in range(self._n):
            yield self[i]

    @property
    def built(self) -> int:
        return len(self._memo)


@dataclass
class Workload:
    """One run's workload as built: its requests (a source workload) and what the summary says of it."""
    name: str
    requests: Sequence[RequestSpec]
    exact_lengths: bool
    description: str
    corpus_version: str = ""   # what the prompts were built from; the regression check compares only equal ones
    schedule: list[float] | None = None   # trace replay: each request's send offset (s) from the start
    context: Any = None        # a session workload's per-run state (agentic: the chat-template counter)


@dataclass(frozen=True)
class BuildContext:
    """What a request source builds with besides the settings: the loaded tokenizer (None: lengths approximated),
    the server's vocabulary size (random token ids), and whether the requests ask the server to ignore EOS."""
    tokenizer: Any = None
    vocab_size: int | None = None
    ignore_eos: bool = True


Send = Callable[[RequestSpec], Awaitable[RequestRecord]]
Driver = Callable[[Send, float | None], Awaitable[None]]   # sweep.run_level's driver(send, deadline)


@dataclass
class LevelLoad:
    """What one level sends: a request list, or a driver making requests as it goes (then `requests`
    serve only the warm-up); `chat`: over the chat API."""
    requests: Sequence[RequestSpec]
    chat: bool
    driver: Driver | None = None


# The summary fields every workload's runs must share to be compared (bench.regression.compare_previous).
BASE_KEY = ("workload", "corpus_version", "input_len", "output_len", "chat", "range_ratio")


class WorkloadType:
    """A workload plug-in; subclass it in a module of this package and set `WORKLOAD = YourType()`."""
    name: str = ""                 # the registry key; `--workload NAME` selects it unless `prefix` is set
    prefix: str | None = None   # selected by `--workload PREFIX…` (trace: "trace:")
    fallback: bool = False         # selected by any value no other workload takes (a file path)
    usage: str = ""                # how it is written in the --workload help; default: the name
    hint: str = ""                 # said after the usage in the help line, in parentheses
    description: str = ""          # one line: what it sends (help, docs)
    options: tuple[str, ...] = ()  # the BenchSettings fields it reads and checks
    regression_key: tuple[str, ...] = BASE_KEY   # summary fields that must match for a regression comparison
    order: int = 100               # place in the help line and the docs
    own_load: str = ""             # it sets its own load ("a trace replays its own"): no --find-max slo
    one_process: str = ""          # it runs in one process ("traces"): no --workers; the phrase names it in the refusal
    paired: bool = True            # the A/B comparison (--compare-url) can send its requests

    def matches(self, ref: str) -> bool:
        return self.fallback or (ref.startswith(self.prefix) if self.prefix else ref == self.name)

    @property
    def is_source(self) -> bool:
        return type(self).build is not WorkloadType.build

    @property
    def is_driver(self) -> bool:
        return type(self).sessions is not WorkloadType.sessions

    def check(self, o: BenchSettings) -> None:
        """Refuse option combinations this workload cannot measure (InputError with the fix)."""

    # A request source:
    def build(self, o: BenchSettings, n: int, ctx: BuildContext) -> Workload:
        """`n` requests of the workload `o.workload` selects."""
        raise InputError(f"{{workload}} {o.workload}: runs sessions as they go; it has no fixed list of requests to build")

    # A session driver:
    def sessions(self, o: BenchSettings, run: Workload, lv: Level, tokenizer: Any) -> LevelLoad:
        raise NotImplementedError(f"{self.name}: a request source has no session driver")

    def start(self, o: BenchSettings, ctx: BuildContext) -> Workload:
        """The run's workload: described in the summary, and for a source the first requests."""
        if self.is_driver:
            return Workload(self.name, [], False, self.description)
        return self.build(o, o.requests or 1, ctx)

    def level(self, o: BenchSettings, run: Workload, lv: Level, n: int, ctx: BuildContext) -> LevelLoad:
        """One level's load; `n`: the requests the sweep plans for it (a source's)."""
        if self.is_driver:
            return self.sessions(o, run, lv, ctx.tokenizer)
        return LevelLoad(self.build(o, n, ctx).requests, bool(o.chat))

    def levels(self, o: BenchSettings, run: Workload) -> list[Level] | None:
        """Levels of its own (a trace: one at its recorded times); None: the sweep's --concurrency/--rate levels."""
        return None

    def summary(self, o: BenchSettings, run: Workload) -> dict[str, Any]:
        """Fields it adds to the run's summary (those in its regression key)."""
        return {}

    def level_summary(self, lr: LevelResult) -> dict[str, Any]:
        """Fields it adds to each level's summary."""
        return {}

    def findings(self, summary_levels: list[dict[str, Any]]) -> list[Finding]:
        """What its levels' numbers cannot be used for."""
        return []
