"""`python -m runbook tune` as the signal tests run it, with each phase marked as it starts:

    python tune_child.py MARKS VARIANT -- TUNE ARGS...

Appends one line per phase to MARKS (precheck, launch, ready, bench, guard, archive; loop:NAME when the
benchmark runs, pool once its worker processes are up) so that a test can send its signal inside the phase it means. Phases that are over in
microseconds (launch, archive) and the pre-check of the tiny model are held HOLD_S seconds, as a slow host would
hold them, so the signal lands inside them. VARIANT picks the benchmark's event loop (`asyncio` or `uvloop`),
its worker processes (`w2`: two) and `slow-start` (the candidate takes seconds before it listens: the
readiness wait); the test sets `unit` (tune.systemd_run: candidates as transient units) in the spec. Nothing
here changes what tune does with a signal."""
import asyncio
import os
import sys
import time
from pathlib import Path

HOLD_S = 3.0


def mark(marks: Path, phase: str) -> None:
    with open(marks, "a", encoding="utf-8") as fh:
        fh.write(phase + "\n")


def wrap(marks: Path, owner, name: str, phase: str, hold: float = 0.0, when_done: bool = False) -> None:
    orig = getattr(owner, name)

    def marked(*a, **k):
        if not when_done:
            mark(marks, phase)
        time.sleep(hold)       # not interrupted: tune only records the signal, as it does in any step
        out = orig(*a, **k)
        if when_done:
            mark(marks, phase)
        return out

    setattr(owner, name, marked)


def main() -> int:
    marks, variant = Path(sys.argv[1]), sys.argv[2].split(",")
    args = sys.argv[sys.argv.index("--") + 1:]
    if "asyncio" in variant:
        sys.modules["uvloop"] = None       # type: ignore[assignment]  # its import fails: the standard loop runs

    from runbook import cli
    from runbook.bench import workers
    from runbook.core import oscalls
    from runbook.tune import launch, measure
    from runbook.tune import trials as tune_run
    from runbook.tune.engines import llama

    wrap(marks, llama.Llama, "precheck", "precheck", HOLD_S)
    wrap(marks, launch._Child, "__init__", "launch", HOLD_S)
    wrap(marks, launch._Unit, "__init__", "launch", HOLD_S)      # tune.systemd_run: the transient unit
    wrap(marks, launch, "_wait_ready", "ready")
    wrap(marks, measure, "run", "bench")
    wrap(marks, tune_run, "_guard", "guard")
    wrap(marks, tune_run, "archive_candidate", "archive", HOLD_S)
    wrap(marks, workers, "pool", "pool", when_done=True)      # the worker processes are up: the level starts
    interruptible = oscalls.interruptible

    async def marked_loop(aw):
        mark(marks, "loop:" + ("uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"))
        return await interruptible(aw)

    oscalls.interruptible = marked_loop
    if "w2" in variant:
        settings = measure._settings

        def two_workers(*a, **k):
            return settings(*a, **k, workers=2)

        measure._settings = two_workers
    if "slow-start" in variant:
        executable = launch._executable

        def slow(argv, env, extra):
            exe = executable(argv, env, extra)
            shim = marks.with_name("slow-start.sh")
            shim.write_text(f'#!/bin/sh\nsleep {HOLD_S * 2}\nexec "{exe}" "$@"\n')
            shim.chmod(0o755)
            return str(shim)

        launch._executable = slow
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return cli.main(args)


if __name__ == "__main__":      # the benchmark's worker processes are spawned: they import this file again
    sys.exit(main())
