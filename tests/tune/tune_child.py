"""`python -m runbook tune` as the signal tests run it, with each phase marked as it starts:

    python tune_child.py MARKS VARIANT -- TUNE ARGS...

Appends one line per phase to MARKS (precheck, launch, ready, bench, guard, archive; loop:NAME and pool when the
benchmark runs) so that a test can send its signal inside the phase it means. Phases that are over in
microseconds (launch, archive) and the pre-check of the tiny model are held HOLD_S seconds, as a slow host would
hold them, so the signal lands inside them. VARIANT picks the benchmark's event loop (`asyncio` or `uvloop`),
its worker processes (`w2`: two) and `slow-start` (the candidate takes seconds before it listens: the
readiness wait). Nothing here changes what tune does with a signal."""
import asyncio
import os
import sys
import time
from pathlib import Path

HOLD_S = 3.0
marks, variant = Path(sys.argv[1]), sys.argv[2].split(",")
args = sys.argv[sys.argv.index("--") + 1:]
if "asyncio" in variant:
    sys.modules["uvloop"] = None          # type: ignore[assignment]  # its import fails: the standard loop runs

from runbook import cli  # noqa: E402
from runbook.bench import workers  # noqa: E402
from runbook.core import oscalls  # noqa: E402
from runbook.tune import launch, measure  # noqa: E402
from runbook.tune import run as tune_run  # noqa: E402
from runbook.tune.engines import llama  # noqa: E402


def mark(phase: str) -> None:
    with open(marks, "a", encoding="utf-8") as fh:
        fh.write(phase + "\n")


def wrap(owner, name: str, phase: str, hold: float = 0.0) -> None:
    orig = getattr(owner, name)

    def marked(*a, **k):
        mark(phase)
        time.sleep(hold)       # not interrupted: tune only records the signal, as it does in any step
        return orig(*a, **k)

    setattr(owner, name, marked)


wrap(llama.Llama, "precheck", "precheck", HOLD_S)
wrap(launch._Child, "__init__", "launch", HOLD_S)
wrap(launch, "_wait_ready", "ready")
wrap(measure, "run", "bench")
wrap(tune_run, "_guard", "guard")
wrap(tune_run, "archive_candidate", "archive", HOLD_S)
wrap(workers, "pool", "pool")

_interruptible = oscalls.interruptible


async def _marked_loop(aw):
    mark("loop:" + ("uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"))
    return await _interruptible(aw)

oscalls.interruptible = _marked_loop

if "w2" in variant:
    _options = measure._options

    def _two_workers(*a, **k):
        o = _options(*a, **k)
        o.workers = 2
        return o

    measure._options = _two_workers

if "slow-start" in variant:
    _executable = launch._executable

    def _slow(argv, env, extra):
        exe = _executable(argv, env, extra)
        shim = marks.with_name("slow-start.sh")
        shim.write_text(f'#!/bin/sh\nsleep {HOLD_S * 2}\nexec "{exe}" "$@"\n')
        shim.chmod(0o755)
        return str(shim)

    launch._executable = _slow

os.environ.setdefault("PYTHONUNBUFFERED", "1")
sys.exit(cli.main(args))
