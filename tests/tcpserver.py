"""A real TCP server on loopback that hands each accepted connection to `serve(conn)` on its own thread.

The raw-bytes tests (bounded reads, the h1 transport) write whatever they like on the socket; this holds the
accept loop and the shutdown they share."""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress


@contextmanager
def tcp_server(serve: Callable[[socket.socket], None], backlog: int = 64) -> Iterator[str]:
    """Yields the server's base URL; every connection is closed after `serve` returns or raises OSError."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(backlog)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            serve(conn)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                conn.close()

    def loop() -> None:
        srv.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(2)
        srv.close()
