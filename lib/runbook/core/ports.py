"""Ports on a busy host: pick a free one, name the processes that hold one, and start a server again on another
port when its own was taken while it started.

A server is given a port, then binds it only when its start-up ends (SGLang: ~15-60 s on CPU, far longer on a GPU
host). Meanwhile another process can take it — another server, or a client connection the kernel gave that
ephemeral port as its local end — and the server dies with "[Errno 98] ... address already in use". That is not
a failed configuration: `relaunching` starts it again on a free port, a bounded number of times, and returns each
collision with the process that held the port (pid, command line; psutil reads /proc/net/tcp{,6} and /proc/*/fd).
tune (launch.py), the demo servers (demo/sglang.py, demo/llama.py) and the test fixtures all go through it.
"""
from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

from runbook.core.errors import RunbookError
from runbook.core.secrets import MASK, is_secret_key

T = TypeVar("T")
RELAUNCHES = 3            # more collisions than this in one start is not a race: something keeps taking ports
COMMAND_CHARS = 200       # a holder's command line as shown

# A server's own words for a bind that failed: uvicorn's (SGLang) "[Errno 98] error while attempting to bind on
# address ...: address already in use", Python's OSError, ZMQ's "Address already in use", llama.cpp's
# "couldn't bind HTTP server socket, hostname: ..., port: N".
BIND_FAILED = re.compile(r"\[Errno 98\]|\bEADDRINUSE\b|address already in use|couldn't bind HTTP server socket", re.I)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, from the kernel's ephemeral range (it can be taken again at once: see
    `relaunching`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Holder:
    """A process with a TCP socket on the port (listening, or a connection's local end)."""
    pid: int | None           # None: the socket's owner is not visible to us (another user's process, not root)
    command: str              # its command line, shortened, secret-looking values masked; "" when unreadable
    state: str                # psutil's: LISTEN, ESTABLISHED, SYN_SENT, ...

    def text(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a process we cannot see (another user's)"
        return f"{who} ({self.command})" if self.command else who

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command, "state": self.state}


def command_line(pid: int) -> str:
    """`pid`'s command line on one line, values after secret-looking flags masked (--api-key X, TOKEN=X)."""
    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return ""
    out: list[str] = []
    for i, a in enumerate(argv):
        key, eq, _ = a.partition("=")
        if eq and is_secret_key(key.lstrip("-")):
            a = f"{key}={MASK}"
        elif i and argv[i - 1].startswith("-") and is_secret_key(argv[i - 1].lstrip("-")):
            a = MASK
        out.append(a)
    text = " ".join(" ".join(out).split())
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 1] + "…"


def holders(port: int, exclude: Iterable[int] = ()) -> list[Holder]:
    """Every process with a TCP socket whose local port is `port` (any address: 0.0.0.0:P blocks 127.0.0.1:P),
    listening ones first; sockets in TIME_WAIT belong to no process and block nothing a server binds with
    SO_REUSEADDR, so they are left out."""
    skip = set(exclude)
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    seen: dict[tuple[int | None, str], Holder] = {}
    for c in conns:
        if not c.laddr or c.laddr.port != port or c.status in (psutil.CONN_TIME_WAIT, psutil.CONN_CLOSE):
            continue
        if c.pid is not None and c.pid in skip:
            continue
        key = (c.pid, c.status)
        if key not in seen:
            seen[key] = Holder(c.pid, command_line(c.pid) if c.pid is not None else "", c.status)
    return sorted(seen.values(), key=lambda h: (h.state != psutil.CONN_LISTEN, h.pid or 0))


def bind_line(text: str) -> str | None:
    """The last line of a server's log that says its bind failed, or None."""
    hits = [ln.strip() for ln in text.splitlines() if BIND_FAILED.search(ln)]
    return hits[-1][:300] if hits else None


def held_by(port: int, exclude: Iterable[int] = ()) -> str:
    """Who holds `port`, in words: "pid 12 (python -m x), pid 40 (curl ...)", or "" when no process does."""
    return ", ".join(h.text() for h in holders(port, exclude))


@dataclass(frozen=True)
class Collision:
    """One start-up that lost its port to another process."""
    port: int
    holders: tuple[Holder, ...]
    relaunched_on: int | None     # None: the relaunches were spent
    evidence: str                 # the server's log line that says its bind failed ("" when only a holder says so)

    def text(self) -> str:
        who = ", ".join(h.text() for h in self.holders) or "a process that was gone when we looked"
        then = f"relaunched on {self.relaunched_on}" if self.relaunched_on is not None else "not relaunched again"
        return f"port {self.port} taken by {who} during start-up; {then}"

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port, "holders": [h.to_dict() for h in self.holders], "relaunched_on": self.relaunched_on,
                "evidence": self.evidence, "text": self.text()}


class PortsTaken(RunbookError):
    """Every start lost its port (RELAUNCHES + 1 of them): one line naming the ports and who took them."""

    def __init__(self, collisions: list[Collision]) -> None:
        last = collisions[-1]
        n = len(collisions)
        super().__init__(f"{last.text()}" + (f" ({n} start-ups in a row lost their port)" if n > 1 else "") +
                         ": find what takes ports on this host, then start it again")
        self.collisions = collisions


def relaunching(start: Callable[[int], T], port: int, *, failed_log: Callable[[BaseException], str | None],
                host: str = "127.0.0.1", attempts: int = RELAUNCHES,
                on_collision: Callable[[Collision], None] | None = None) -> tuple[T, list[Collision]]:
    """`start(port)`, and its collisions. A start that raised, when `failed_log(error)` gives the log of a server that
    exited during start-up (None for any other failure: re-raised as it is) and that log says its bind failed or
    another process now listens on the port, is a collision: `start` runs again on a free port, at most `attempts`
    more times (then PortsTaken). `on_collision` sees each one before the next start (e.g. to keep the log)."""
    collisions: list[Collision] = []
    while True:
        try:
            return start(port), collisions
        except Exception as e:
            text = failed_log(e)
            if text is None:
                raise
            line = bind_line(text)
            held = tuple(holders(port))
            if line is None and not any(h.state == psutil.CONN_LISTEN for h in held):
                raise          # it died of something else: a failed configuration, as the caller reports it
            last = len(collisions) >= attempts
            c = Collision(port, held, None if last else free_port(host), line or "")
            collisions.append(c)
            if on_collision is not None:
                on_collision(c)
            if last:
                raise PortsTaken(collisions) from e
            assert c.relaunched_on is not None
            port = c.relaunched_on
