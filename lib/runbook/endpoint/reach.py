"""Is an OpenAI-compatible server there, which model does it serve, and running async code from notebooks.

Small probes go through one bounded GET, `get` (readiness, /health) and `fetch_json` on it (/server_info,
/v1/models, /get_model_info, …): the body is read up to `max_bytes` and the whole exchange (connect, headers,
body) is bounded by one deadline, so a server that sends gigabytes or trickles a byte a second cannot hang
or exhaust the runbook, and an API key never appears in an error. What comes back is told apart honestly:

- no server (refused, unreachable, nothing within the deadline before the headers): OSError / URLError;
- an HTTP error status: urllib.error.HTTPError (as urllib raises it, so callers keep their handling);
- a server that answered, but not with SGLang's JSON (HTML, garbage, a body too large or never
  finished, JSON of the wrong shape): `BadResponse`, whose message says what came back.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.error
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from runbook.core import oscalls
from runbook.core.errors import RunbookError
from runbook.core.findings import Finding, Status
from runbook.core.secrets import redact_text

if TYPE_CHECKING:
    import aiohttp

MAX_JSON_BYTES = 4 << 20     # /server_info is a few KiB, /v1/models less: 4 MiB is generous, not unbounded
MAX_JSON_DEPTH = 64          # SGLang's answers are 2-3 levels deep
_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
               bool: "true/false", type(None): "null"}
NOT_SGLANG = "server answered but not with SGLang's JSON"


class BadResponse(RunbookError, ValueError):
    """The server answered, but not with the JSON asked for (a ValueError, as json.loads' errors were)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {NOT_SGLANG}: {reason}")
        self.url, self.reason = url, reason


def _kind(v: Any) -> str:
    return _JSON_TYPES.get(type(v), type(v).__name__)


def _depth_ok(doc: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return False
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def decode_json(url: str, body: bytes, expect: type | None = dict, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Bytes of an answer -> JSON, or BadResponse saying what the bytes are instead."""
    head = body[:40]
    try:
        doc = json.loads(body)
    except UnicodeDecodeError as e:
        raise BadResponse(url, f"not UTF-8 text (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        what = "an HTML page" if body.lstrip()[:1] == b"<" else "not JSON"
        raise BadResponse(url, f"{what} ({e.msg} at byte {e.pos}; starts {head!r})") from None
    except RecursionError:
        raise BadResponse(url, "JSON nested too deeply") from None
    except ValueError as e:   # e.g. an integer with more digits than Python converts
        raise BadResponse(url, f"unreadable JSON ({' '.join(str(e).split())[:120]})") from None
    if not _depth_ok(doc, max_depth):
        raise BadResponse(url, f"JSON nested more than {max_depth} levels deep")
    if expect is not None and not isinstance(doc, expect):
        raise BadResponse(url, f"expected {_JSON_TYPES.get(expect, expect.__name__)}, got {_kind(doc)}")
    return doc


def fetch_json(url: str, api_key: str | None = None, timeout: float = 10.0, max_bytes: int = MAX_JSON_BYTES,
               expect: type | None = dict) -> Any:
    """GET url -> parsed JSON, bounded: at most `max_bytes` of body, everything within `timeout` seconds.

    Raises OSError (URLError for a URL that is not http(s)) when nothing usable answered before the headers,
    urllib.error.HTTPError for a status ≥ 400, BadResponse when the answer is not the JSON expected. The API key
    never appears in a message, even when the server echoes it back."""
    with _redacted(url, api_key):
        return decode_json(url, _get(url, api_key, timeout, max_bytes, "application/json")[1], expect)


def get(url: str, api_key: str | None = None, timeout: float = 10.0, max_bytes: int = MAX_JSON_BYTES,
        accept: str = "*/*") -> tuple[int, bytes]:
    """GET url -> (status, body) for a status below 400, bounded and raising as `fetch_json` does (redirects
    are not followed: a 3xx comes back as it is)."""
    with _redacted(url, api_key):
        return _get(url, api_key, timeout, max_bytes, accept)


@contextlib.contextmanager
def _redacted(url: str, api_key: str | None) -> Iterator[None]:
    """Errors without the API key, even when the server echoes it back."""
    try:
        yield
    except BadResponse as e:
        if api_key:
            raise BadResponse(url, redact_text(e.reason, [api_key])) from None
        raise
    except urllib.error.HTTPError as e:
        if api_key:
            raise urllib.error.HTTPError(url, e.code, redact_text(str(e.reason), [api_key]), e.headers, None) from None
        raise


def _get(url: str, api_key: str | None, timeout: float, max_bytes: int, accept: str) -> tuple[int, bytes]:
    conn, path = _connection(url, timeout)
    deadline = time.monotonic() + timeout
    expired = threading.Event()

    def cut() -> None:   # the hard bound: a blocked recv returns once its socket is shut down
        expired.set()
        s = conn.sock
        if s is not None:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    got_headers = False
    try:
        resp = _send(conn, path, url, api_key, accept, timeout, expired)
        got_headers = True
        _check_head(resp, url, max_bytes)
        return resp.status, _read_body(conn, resp, url, timeout, max_bytes, deadline, expired)
    except TimeoutError:
        if got_headers:
            raise BadResponse(url, f"the answer did not finish within {timeout:g} s (0 bytes so far)") from None
        raise
    finally:
        watchdog.cancel()
        conn.close()


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An (unopened) connection to the URL's host and the path to ask for; URLError for a URL that is not http(s)."""
    u = urlsplit(url)
    try:
        port = u.port
    except ValueError:
        raise urllib.error.URLError(f"not a valid URL: {url!r}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise urllib.error.URLError(f"not an http(s) URL with a host: {url!r}")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(u.hostname, port, timeout=timeout)
    return conn, path


def _send(conn: http.client.HTTPConnection, path: str, url: str, api_key: str | None, accept: str, timeout: float,
          expired: threading.Event) -> http.client.HTTPResponse:
    """Send the GET and read the status line and headers; a cut by the watchdog is a TimeoutError."""
    headers = {"Accept": accept}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse()
    except http.client.HTTPException as e:   # a status line or headers that are not HTTP
        if expired.is_set():
            raise TimeoutError(f"no answer within {timeout:g} s") from None
        raise BadResponse(url, f"not an HTTP answer ({type(e).__name__})") from None
    except OSError:
        if expired.is_set():
            raise TimeoutError(f"no answer within {timeout:g} s") from None
        raise


def _check_head(resp: http.client.HTTPResponse, url: str, max_bytes: int) -> None:
    """An error status is an HTTPError; a declared length over the limit is refused before reading the body."""
    if resp.status >= 400:
        with contextlib.suppress(OSError, http.client.HTTPException):
            resp.read1(4096)
        raise urllib.error.HTTPError(url, resp.status, resp.reason or "", resp.msg, None)
    length = resp.getheader("Content-Length")
    if length and length.strip().isdigit() and int(length) > max_bytes:
        raise BadResponse(url, f"body of {int(length):,} bytes is larger than the {max_bytes:,} allowed")


def _read_body(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, url: str, timeout: float, max_bytes: int,
               deadline: float, expired: threading.Event) -> bytes:
    """The body, within the deadline and the size limit; anything else is a BadResponse saying how far it got."""
    chunks: list[bytes] = []
    got = 0
    late = f"the answer did not finish within {timeout:g} s"
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or expired.is_set():
                raise BadResponse(url, f"{late} ({got:,} bytes so far)")
            if conn.sock is not None:
                conn.sock.settimeout(max(0.01, left))
            try:
                chunk = resp.read1(min(65536, max_bytes + 1 - got))
            except TimeoutError:
                raise
            except (OSError, http.client.HTTPException) as e:
                if expired.is_set():
                    raise BadResponse(url, f"{late} ({got:,} bytes so far)") from None
                raise BadResponse(url, f"the answer was cut off after {got:,} bytes ({type(e).__name__})") from None
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            got += len(chunk)
            if got > max_bytes:
                raise BadResponse(url, f"body larger than the {max_bytes:,} bytes allowed (stopped reading)")
    except TimeoutError:
        raise BadResponse(url, f"{late} ({got:,} bytes so far)") from None


def served_models(data: Any, url: str = "/v1/models") -> list[str]:
    """The model ids of a /v1/models answer; BadResponse when it is not {"data": [{"id": "..."}, ...]}."""
    if not isinstance(data, dict):
        raise BadResponse(url, f"expected an object with \"data\", got {_kind(data)}")
    items = data.get("data")
    if not isinstance(items, list):
        raise BadResponse(url, f"\"data\" should be a list of models, got {_kind(items)}")
    ids = []
    for i, m in enumerate(items):
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            raise BadResponse(url, f"data[{i}] should be an object with a string \"id\", got "
                              + (f"id {_kind(m.get('id'))}" if isinstance(m, dict) else _kind(m)))
        ids.append(m["id"])
    return ids


def model_info(data: Any, url: str = "/get_model_info") -> dict[str, Any]:
    """A /get_model_info answer: an object whose model_path (when present) is a string."""
    if not isinstance(data, dict):
        raise BadResponse(url, f"expected an object, got {_kind(data)}")
    for key in ("model_path", "tokenizer_path"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise BadResponse(url, f"\"{key}\" should be a string, got {_kind(data[key])}")
    return data


def failure_finding(finding_id: str, url: str, e: BaseException, no_server_status: Status = "skip") -> Finding:
    """One honest finding for a JSON probe that did not give its JSON: not SGLang's JSON, an HTTP status, or no server."""
    if isinstance(e, BadResponse):
        return Finding(finding_id, "fail", f"{url}: {NOT_SGLANG}", detail=e.reason,
                       remedy="Check that the URL points at the SGLang server (not a proxy, a login page or another service).")
    if isinstance(e, urllib.error.HTTPError):
        return Finding(finding_id, "fail", f"{url}: {NOT_SGLANG} (HTTP {e.code})", detail=str(e.reason)[:200],
                       remedy="401/403: export the API key; 404: not an SGLang endpoint; 5xx: see the server's log.")
    reason = getattr(e, "reason", None) or e
    return Finding(finding_id, no_server_status, f"no server reachable at {url}", evidence=" ".join(str(reason).split())[:200],
                   remedy="Start the service, or give the server's URL.")


async def probe(base: str, timeout: float = 5.0) -> str | None:
    """None when an OpenAI-compatible server (SGLang, llama-server, …) answers /v1/models: its model list, or
    401/403 (it wants the API key); else why not. Another web server's 404, HTML or other JSON is no server."""
    url = base.rstrip("/") + "/v1/models"
    try:
        _, body = await asyncio.to_thread(get, url, None, timeout)
        served_models(decode_json(url, body, expect=None), url)
    except urllib.error.HTTPError as e:
        return None if e.code in (401, 403) else f"{url} answered HTTP {e.code}: not an OpenAI-compatible server"
    except BadResponse as e:
        return str(e)
    except (OSError, ValueError) as e:
        return str(e) or type(e).__name__
    return None


async def read_bounded(r: aiohttp.ClientResponse, url: str, max_bytes: int) -> bytes:
    """The body, refused (BadResponse) past max_bytes without reading further."""
    chunks: list[bytes] = []
    got = 0
    while True:
        chunk = await r.content.read(65536)
        if not chunk:
            return b"".join(chunks)
        got += len(chunk)
        if got > max_bytes:
            raise BadResponse(url, f"body larger than the {max_bytes:,} bytes allowed (stopped reading)")
        chunks.append(chunk)


async def model_name(url: str, api_key: str | None, timeout: float = 10.0, max_bytes: int = MAX_JSON_BYTES) -> str | None:
    """The first model id /v1/models lists; None when there is none or the answer is not SGLang's JSON."""
    target = url.rstrip("/") + "/v1/models"
    try:
        ids = served_models(await asyncio.to_thread(fetch_json, target, api_key, timeout, max_bytes), target)
        return ids[0] if ids else None
    except Exception:  # any failure means "no name known": the caller falls back
        return None


def run_sync(coro: Any, fast_loop: bool = False) -> Any:
    """asyncio.run, also from inside Jupyter (whose kernel already runs a loop): then in a thread.
    `fast_loop`: on uvloop where it is installed (the benchmark's load generator; see
    benchmarks/client_ceiling.py for what it buys), else the standard loop."""
    run: Any = asyncio.run
    if fast_loop:
        try:
            import uvloop  # lazy: optional (~25 ms), only for the benchmark's load generator
            run = uvloop.run
        except ImportError:
            pass

    def go() -> Any:
        return run(oscalls.interruptible(coro))     # inside tune's run, a signal cancels it through its own loop

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return go()
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(go).result()
