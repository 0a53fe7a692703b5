"""Finished runs to object storage through fsspec: `PREFIX/<host>/<run id>/…`, then `_COMPLETE` last.

A reader that sees `_COMPLETE` sees every object of the run (it is written after the last data object
has been acknowledged, and removed first when a run is uploaded again). The storage client's own
settings give the endpoint, region and credentials (AWS_ENDPOINT_URL, AWS_PROFILE, ~/.aws/credentials,
FSSPEC_S3_ENDPOINT_URL, …): the URL carries none (core.spec.archive_url_problem refuses them).

Every object is scrubbed again on the way out with the secrets known now (the run was scrubbed with the
secrets known then), and a file whose *name* holds a secret is not uploaded. The local archive is never
touched by a failure: the run's state under `<out>/.uploads/` says `pending` and the next run of the
same deployment, or `runbook push`, uploads it again.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from runbook.core import secrets
from runbook.core.archive import list_runs
from runbook.core.errors import RunbookError, SpecError
from runbook.core.fsutil import atomic_write_json
from runbook.core.spec import archive_url_problem

MARKER = "_COMPLETE"
STATE_DIR = ".uploads"
ENV_URL = "RUNBOOK_ARCHIVE_URL"
ENV_HOST = "RUNBOOK_HOST"
BATCH_BYTES = 32 << 20          # objects sent concurrently per batch, by size
MARKER_SCHEMA = "runbook.complete/1"


def _archive_url(url: str) -> str:
    problem = archive_url_problem(url)
    if problem:
        raise ValueError(problem)
    return url


# An archive store's URL as an option's type (run's and push's --archive-url, fleet's --from): the spec's rule.
ArchiveUrl = Annotated[str, AfterValidator(_archive_url)]


def host_name() -> str:
    """This host's name in the store: $RUNBOOK_HOST, else the short hostname; only [A-Za-z0-9._-]."""
    raw = os.environ.get(ENV_HOST) or socket.gethostname().split(".")[0]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", raw).strip(".-")
    return name[:128] or "host"


def resolve_url(cli_url: str | None, spec_url: str | None) -> str | None:
    """--archive-url, else $RUNBOOK_ARCHIVE_URL, else the spec's archive.url; refused with a one-line SpecError."""
    for where, url in (("--archive-url", cli_url), (ENV_URL, os.environ.get(ENV_URL)), ("archive.url", spec_url)):
        if url:
            problem = archive_url_problem(url)
            if problem:
                raise SpecError(f"{where}: {problem}")
            return url.rstrip("/")
    return None


def open_store(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, root path without a trailing slash) for an archive URL."""
    try:
        from fsspec.core import url_to_fs  # lazy: fsspec (~20 ms) only when an archive URL is set
    except ImportError as e:  # pragma: no cover - a requirement
        raise RunbookError(f"archive {url}: fsspec is not installed ({e}); pip install -r requirements.txt") from None
    scheme = url.split("://", 1)[0]
    try:
        fs, root = url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise RunbookError(f"archive {url}: no fsspec filesystem for {scheme}:// ({e}); install its package "
                           "(s3: s3fs, gs: gcsfs, az: adlfs)") from None
    return fs, str(root).rstrip("/")


def run_url(url: str, host: str, run_id: str) -> str:
    return f"{url.rstrip('/')}/{host}/{run_id}/"


@dataclass
class UploadResult:
    run_id: str
    url: str
    ok: bool
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    withheld: list[str] = field(default_factory=list)   # files not uploaded: a secret in their name


def _files(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink())


def _scrub(data: bytes, encoded: list[bytes], mask: bytes) -> bytes:
    for e in encoded:
        if e in data:
            data = data.replace(e, mask)
    return data


def _error_text(e: BaseException, scrub: Iterable[str]) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    return secrets.redact_text(" ".join(msg.split())[:400], scrub)


def upload_run(run_dir: Path, url: str, host: str, scrub: Iterable[str] = (), fs: Any = None, root: str | None = None) -> UploadResult:
    """Upload one finished run folder; `_COMPLETE` is written only after every other object succeeded."""
    run_dir = Path(run_dir)
    scrub = set(scrub)
    res = UploadResult(run_id=run_dir.name, url=run_url(url, host, run_dir.name), ok=False)
    t0 = time.monotonic()
    forms = secrets.expand(scrub)
    encoded, mask = [f.encode() for f in forms], secrets.MASK.encode()
    try:
        if fs is None or root is None:
            fs, root = open_store(url)
        dest = f"{root}/{host}/{run_dir.name}"
        marker = f"{dest}/{MARKER}"
        if fs.exists(marker):          # an upload again: readers must not see the old marker over new objects
            fs.rm_file(marker)
        batch: dict[str, bytes] = {}
        size = 0
        for p in _files(run_dir):
            rel = p.relative_to(run_dir).as_posix()
            if any(f in rel for f in forms) or rel == MARKER:
                res.withheld.append(secrets.redact_text(rel, scrub))
                continue
            data = _scrub(p.read_bytes(), encoded, mask)
            batch[f"{dest}/{rel}"] = data
            size += len(data)
            res.files += 1
            res.bytes += len(data)
            if size >= BATCH_BYTES:
                fs.pipe(batch)
                batch, size = {}, 0
        if batch:
            fs.pipe(batch)
        doc = {"schema": MARKER_SCHEMA, "run_id": run_dir.name, "host": host, "files": res.files, "bytes": res.bytes,
               "uploaded": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        fs.pipe_file(marker, _scrub(json.dumps(doc).encode(), encoded, mask))
        res.ok = True
    except Exception as e:  # any storage failure is a warn, never a lost run
        res.error = _error_text(e, scrub)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


# --- upload state, per run, under <out>/.uploads/ (hidden: the index never lists it) -----------------

def _state_path(out_dir: Path, run_id: str) -> Path:
    return Path(out_dir) / STATE_DIR / f"{run_id}.json"


def read_state(out_dir: Path, run_id: str) -> dict[str, Any]:
    try:
        doc = json.loads(_state_path(out_dir, run_id).read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def write_state(out_dir: Path, res: UploadResult, url: str) -> None:
    atomic_write_json(_state_path(out_dir, res.run_id), {
        "run_id": res.run_id, "archive_url": url, "dest": res.url, "state": "done" if res.ok else "pending",
        "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "error": res.error,
        "files": res.files, "bytes": res.bytes, "withheld": res.withheld})


def mark_pending(out_dir: Path, run_id: str, url: str) -> None:
    """Recorded before the first attempt, so a runner killed mid-upload leaves the run to retry."""
    write_state(out_dir, UploadResult(run_id=run_id, url="", ok=False, error="upload started, not finished"), url)


def pending_runs(out_dir: Path, url: str, deployment: str | None = None, everything: bool = False) -> list[str]:
    """Run ids to (re)upload to `url`, oldest first: those whose last attempt did not finish; with
    `everything`, also those never uploaded there (what `runbook push` does by hand)."""
    out: list[str] = []
    for r in reversed(list_runs(Path(out_dir))):
        if deployment is not None and r.get("deployment") != deployment:
            continue
        st = read_state(out_dir, r["_dir"])
        same = st.get("archive_url") == url
        if same and st.get("state") == "done":
            continue
        if st.get("state") == "pending" or everything:
            out.append(r["_dir"])
    return out


def prune_state(out_dir: Path) -> None:
    """Forget the upload state of runs that retention removed."""
    d = Path(out_dir) / STATE_DIR
    if not d.is_dir():
        return
    for p in d.glob("*.json"):
        if not (Path(out_dir) / p.stem).is_dir():
            p.unlink(missing_ok=True)


def finding(res: UploadResult, retried_by: str | None = None) -> dict[str, str]:
    """The run summary's record of its upload, in the findings' shape."""
    if res.ok:
        how = f" (retried by run {retried_by})" if retried_by else ""
        return {"id": "archive.upload", "status": "pass", "title": f"run uploaded to {res.url}{how}",
                "detail": f"{res.files} objects, {res.bytes:,} bytes in {res.seconds:.1f} s, then {MARKER}"
                          + (f"; not uploaded (a secret in the name): {', '.join(res.withheld)}" if res.withheld else ""),
                "evidence": "", "remedy": ""}
    return {"id": "archive.upload", "status": "warn", "title": f"upload to {res.url} failed; the local archive is intact",
            "detail": res.error or "", "evidence": "",
            "remedy": "The next run of this deployment retries it; or run `python -m runbook push` once the store is reachable "
                      "(endpoint and credentials: AWS_ENDPOINT_URL, AWS_PROFILE / ~/.aws/credentials)."}
