"""The textfile node_exporter's textfile collector serves: where it goes (one setting, three spellings) and
writing it so that a scrape never sees half of it.

node_exporter reads every `*.prom` file in its --collector.textfile.directory on each scrape, so the file is
written next to its final name under a name that does not end in .prom, fsynced and renamed over the old
one (core/fsutil.atomic_write_text): a run killed at any point leaves the previous run's file whole.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from runbook.core import secrets
from runbook.core.errors import SpecError
from runbook.core.fsutil import atomic_write_text

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

ENV = "RUNBOOK_TEXTFILE_DIR"


def resolve_dir(flag: str | None, spec_value: str | None, env: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """The textfile directory and which setting gave it: --textfile-dir, else $RUNBOOK_TEXTFILE_DIR, else the
    spec's alerts.textfile_dir; (None, "") when none is set (no textfile is written)."""
    env = os.environ if env is None else env
    for value, where in ((flag, f"--textfile-dir {flag}"), (env.get(ENV), f"{ENV}={env.get(ENV)}"),
                         (spec_value, f"alerts.textfile_dir {spec_value}")):
        if value:
            return Path(value), where
    return None, ""


def check_dir(path: Path, where: str) -> None:
    """Refuse a directory the run could not write its textfile into, before the run starts (exit 2)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
        raise SpecError(f"{where!r}: control characters in a directory name; give the textfile directory's plain path")
    if not path.is_dir():
        raise SpecError(f"{where}: not a directory; create it (node_exporter's --collector.textfile.directory) "
                        "or point the setting at that directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError(f"{where}: not writable by this user; give the runbook's user write access "
                        "(deploy/ansible/runbook.yml sets the directory's group) or choose another directory")


def path_for(directory: Path, deployment: str, stage: str | None = None) -> Path:
    """runbook_<deployment>.prom for a run; runbook_<deployment>.<stage>.prom for a stage verb's report."""
    return directory / (f"runbook_{deployment}.{stage}.prom" if stage else f"runbook_{deployment}.prom")


def render(reg: CollectorRegistry, scrub: Iterable[str] = ()) -> str:
    """The exposition format, by prometheus_client; secret values masked as a last guard (labels are ids already)."""
    from prometheus_client import generate_latest  # lazy: prometheus_client (~15 ms) only when metrics are written

    return secrets.redact_text(generate_latest(reg).decode("utf-8"), scrub)


def write(directory: Path, deployment: str, reg: CollectorRegistry, scrub: Iterable[str] = (), stage: str | None = None) -> Path:
    """Replace runbook_<deployment>.prom in `directory` atomically (mode 0644: node_exporter's user reads it).
    The directory is node_exporter's: one that has gone is not created anew where nothing reads it."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory")
    return atomic_write_text(path_for(directory, deployment, stage), render(reg, scrub), mode=0o644)
