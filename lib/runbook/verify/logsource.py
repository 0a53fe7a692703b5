"""Where the server's log comes from: a saved file (`--log FILE`) or systemd's journal (`--unit NAME`).

Both are read as a stream of text lines (bytes decoded leniently, each line cut at a bounded length),
so a huge or binary log never holds more than one line in memory here; the parser keeps only the
last start's facts. journalctl runs under a deadline and is killed when it passes it.
"""
from __future__ import annotations

import datetime as dt
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runbook.core import oscalls
from runbook.core.findings import Finding
from runbook.core.oscalls import CommandFailed
from runbook.verify.logparse import MAX_LINE

READ_LIMIT = MAX_LINE * 4      # bytes read per line before the rest of the line is skipped
JOURNAL_TIMEOUT_S = 120.0
_TS = re.compile(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d(?::\d\d)?)")


def parse_since(text: str) -> dt.datetime:
    """--since TIME: 'YYYY-MM-DD', 'YYYY-MM-DD HH:MM[:SS]' or ISO 8601 (a zone is dropped: log times are local)."""
    s = text.strip()
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)(?:[T ](\d\d:\d\d(?::\d\d)?)(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)?", s)
    if not m:
        raise ValueError(f"{text!r} is not a time like 2026-01-05 or '2026-01-05 10:30:00'")
    t = m.group(2) or "00:00:00"
    if len(t) == 5:
        t += ":00"
    return dt.datetime.fromisoformat(f"{m.group(1)} {t}")


def line_time(line: str) -> dt.datetime | None:
    m = _TS.search(line[:64])
    if not m:
        return None
    t = m.group(2) if len(m.group(2)) == 8 else m.group(2) + ":00"
    try:
        return dt.datetime.fromisoformat(f"{m.group(1)} {t}")
    except ValueError:
        return None


def _lines(stream, limit: int = READ_LIMIT) -> Iterator[str]:
    """Text lines from a binary stream; a line longer than `limit` bytes keeps its first `limit`."""
    while True:
        chunk = stream.readline(limit)
        if not chunk:
            return
        if not chunk.endswith(b"\n"):
            rest = chunk
            while rest and not rest.endswith(b"\n"):   # skip the remainder of an over-long line
                rest = stream.readline(limit)
        yield chunk.decode("utf-8", errors="replace")


@dataclass
class LogSource:
    source: str                                  # "file:PATH", "journal:UNIT" or "" (none)
    lines: Iterator[str] = field(default_factory=lambda: iter(()))
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # filled while `lines` is consumed (journalctl's exit)


def _since_filter(lines: Iterator[str], since: dt.datetime | None) -> Iterator[str]:
    if since is None:
        yield from lines
        return
    started = False
    for ln in lines:
        if not started:
            t = line_time(ln)
            if t is None or t < since:
                continue
            started = True
        yield ln


def from_file(path: str | Path, since: dt.datetime | None = None) -> LogSource:
    p = Path(path)
    src = f"file:{p}"
    if not p.is_file():
        what = "a directory" if p.is_dir() else "not there"
        return LogSource(src, findings=[Finding("verify.log", "skip", f"no server log read: {p} is {what}",
                                                remedy="Give a saved SGLang log with --log FILE, or the unit with --unit NAME.")])
    try:
        fh = open(p, "rb")  # noqa: SIM115 - opened here so a read error is a finding now; the generator below closes it
    except OSError as e:
        return LogSource(src, findings=[Finding("verify.log", "skip", f"cannot read {p}", evidence=str(e),
                                                remedy="Check the file's permissions.")])

    def gen() -> Iterator[str]:
        with fh:
            yield from _lines(fh)

    return LogSource(src, _since_filter(gen(), since))


def unit_start(unit: str, systemctl: str = "systemctl", timeout: float = 15.0) -> str | None:
    """The unit's last start time as systemd reports it (ExecMainStartTimestamp), or None."""
    exe = shutil.which(systemctl)
    if not exe:
        return None
    try:
        cp = oscalls.call([exe, "show", "-p", "ExecMainStartTimestamp", "--value", "--", unit], timeout=timeout, check=True)
    except CommandFailed:
        return None     # no start time: the whole journal of this boot is read instead
    v = cp.stdout.strip()
    return v if v and v != "n/a" else None


def journal_argv(unit: str, since: str | None, journalctl: str = "journalctl") -> list[str]:
    argv = [journalctl, "-u", unit, "-b", "-o", "short-iso", "--no-pager"]
    if since:
        argv += ["--since", since]
    return argv


def from_journal(unit: str, since: str | None = None, journalctl: Sequence[str] | str = "journalctl",
                 systemctl: str = "systemctl", timeout: float = JOURNAL_TIMEOUT_S) -> LogSource:
    """journalctl -u UNIT -b -o short-iso --no-pager [--since the unit's last start]."""
    src = f"journal:{unit}"
    cmd = [journalctl] if isinstance(journalctl, str) else list(journalctl)
    exe = shutil.which(cmd[0])
    if not exe:
        return LogSource(src, findings=[Finding("verify.log", "skip", f"journalctl not installed: the journal of {unit} was not read",
                                                remedy="Give a saved server log with --log FILE.")])
    start = since or unit_start(unit, systemctl)
    try:
        stream = oscalls.journal([exe, *cmd[1:], *journal_argv(unit, start)[1:]], timeout, READ_LIMIT)
    except CommandFailed as e:
        return LogSource(src, findings=[Finding("verify.log", "skip", "journalctl could not run", evidence=e.reason,
                                                remedy="Give a saved server log with --log FILE.")])
    out = LogSource(src)

    def gen() -> Iterator[str]:
        try:
            for chunk in stream.lines:
                yield chunk.decode("utf-8", errors="replace")
        finally:
            stream.close()                # a reader that stopped early: journalctl is stopped now
            if stream.failure is not None:
                out.errors.append(f"journalctl {stream.failure.reason}")

    out.lines = gen()
    return out
