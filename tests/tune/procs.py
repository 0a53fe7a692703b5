"""Small real processes for the tune tests: an HTTP server with /health, is a pid gone."""
import signal
import sys
from pathlib import Path


def http_server(directory: Path, port: int) -> list[str]:
    """A real HTTP server answering GET /health with 200 (a file named `health` in `directory`)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "health").write_text("ok\n")
    return [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(directory), str(port)]


def pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"Z", b"X")


def sigint_default() -> None:
    """preexec_fn for a child that must feel Ctrl-C: a job started in the background by a non-interactive shell
    (cron, `make test &`) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
