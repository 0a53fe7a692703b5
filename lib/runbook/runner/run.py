"""`python -m runbook run`: execute notebooks/ in order with papermill and archive the run.

Each notebook runs in its own papermill process, in a session of its own under a reaper process
(runner/execute.py, runner/reaper.py), so a per-notebook bound, a SIGTERM/SIGINT of the runner (handled: the notebook's
processes are killed, exit 128+signal) and a SIGKILL of the runner (the reaper sees it) all end the
notebook and its kernel. Each notebook writes its results JSON and is archived with an HTML copy.
The run is built in a hidden folder `.inprogress-<run id>` (mode 0700, its files 0600 whatever the
umask: it may hold unscrubbed output) and renamed into place once secrets are scrubbed, so an
interrupted run leaves nothing the index lists and nothing others can read; the next run of the same
deployment removes it. What the run's summary says to a reader: runner/summary.py.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TextIO

from pydantic import AfterValidator, Field

from runbook import alerts
from runbook.core import oscalls, paths, registry, secrets
from runbook.core import spec as spec_mod
from runbook.core.errors import LockHeld, SpecError
from runbook.core.findings import STATUSES, counts, exit_code_for
from runbook.core.fsutil import atomic_write_json, atomic_write_text, current_umask, output_dir
from runbook.core.options import Options, PosFloat, PosInt
from runbook.core.settings import Settings, options_view
from runbook.runner import archive, figures, results, upload
from runbook.runner import params as params_mod
from runbook.runner.execute import execute, kernel_for, on_signal
from runbook.runner.summary import attention, one_screen, summary_md

NOTEBOOKS = paths.notebooks_dir()
OUTPUTS = paths.outputs_dir()
DEPLOYMENT_NAME = re.compile(spec_mod.DEPLOYMENT_NAME)   # a name a spec accepts is a safe lock file name


def _names(chunk: str) -> str:
    if not any(x.strip() for x in chunk.split(",")):
        raise ValueError("must name at least one notebook (e.g. environment,kv_memory; leave --only out to run every notebook)")
    return chunk


def _flat(chunks: list[str]) -> list[str]:
    """--only environment,kv_memory --only tune: the names, in order."""
    return [n.strip() for chunk in chunks for n in chunk.split(",") if n.strip()]


class RunSettings(Settings):
    """The `run` verb's settings, declared once with their defaults: its options (`RunOptions`, None unset) are the
    flags cli.py builds from these fields (flag, metavar, help, the per-value check; a default shown in its help),
    and a caller of `run` cannot pass a bad one."""

    deployment: str | None = Field(None, json_schema_extra={"shared": True})   # --deployment: a flag of every verb (cli.py)
    only: Annotated[list[Annotated[str, AfterValidator(_names)]], AfterValidator(_flat)] = Field(
        default_factory=list, description="run only these notebooks (e.g. environment,kv_memory)",
        json_schema_extra={"metavar": "NAME[,NAME]", "each": True})
    params: list[str] = Field(default_factory=list, alias="param", description="set a notebook parameter, typed by its "
                              "parameters cell; NOTEBOOK.KEY=VALUE sets one notebook's (e.g. bench.concurrency=1,2,4)",
                              json_schema_extra={"metavar": "KEY=VALUE", "each": True})
    out: Path = Field(OUTPUTS, description="archive root (default: outputs/)", json_schema_extra={"metavar": "DIR"})
    timeout: PosFloat = Field(1800.0, description="bound per notebook", json_schema_extra={"metavar": "SECONDS"})
    run_timeout: PosFloat = Field(7200.0, description="bound for the whole run", json_schema_extra={"metavar": "SECONDS"})
    keep: PosInt | None = Field(None, description="keep only this deployment's N newest runs", json_schema_extra={"metavar": "N"})
    strict: bool = Field(False, description="warn and skip findings also give exit 1", json_schema_extra={"switch": True})
    notebooks_dir: Path = Field(NOTEBOOKS, alias="notebooks", json_schema_extra={"metavar": "DIR"})   # tests: no help
    kernel: str | None = Field(None, description="Jupyter kernel name (default: the notebook's, run in this venv)",
                               json_schema_extra={"metavar": "KERNEL"})
    archive_url: upload.ArchiveUrl | None = Field(None, description="also upload the run to s3://BUCKET/PREFIX/<host>/<run id>/ "
                                           "(default: $RUNBOOK_ARCHIVE_URL, else the spec's archive.url)",
                                           json_schema_extra={"metavar": "URL", "echo": False})   # may hold credentials
    # --textfile-dir, else $RUNBOOK_TEXTFILE_DIR, else the spec's alerts.textfile_dir: a flag every stage verb has too (cli.py)
    textfile_dir: str | None = Field(None, json_schema_extra={"shared": True})


# The flags of `runbook run` and what a caller passes to `run`: every setting, None meaning its default.
RunOptions = options_view(RunSettings, "RunOptions")


@dataclass
class NotebookResult:
    name: str
    status: str                    # ok | failed | skipped
    duration_s: float = 0.0
    findings: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STATUSES})
    papermill_exit: int | None = None
    error: str | None = None
    ipynb: str | None = None
    html: str | None = None
    results: str | None = None
    log: str | None = None
    failed_findings: list[dict[str, str]] = field(default_factory=list)


class Log:
    """Timestamped lines on stderr; colour only on a terminal."""

    def __init__(self, stream: TextIO = sys.stderr, secrets_: Iterable[str] = ()):
        self.stream = stream
        self.tty = stream.isatty()
        self.secrets: set[str] = set(secrets_)  # scrubbed from every line (cron mails this log)

    def __call__(self, msg: str) -> None:
        ts = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{ts} runbook: {secrets.redact_text(msg, self.secrets)}", file=self.stream, flush=True)


def discover(notebooks_dir: Path, only: list[str]) -> list[Path]:
    """Notebooks in reading order; --only takes stems with or without the number. The runbook's own
    notebooks are the registry's stages (a missing one is an error, not a silently shorter run); another
    directory (--notebooks) runs whatever notebooks it holds, in file name order."""
    if notebooks_dir.resolve() == NOTEBOOKS.resolve():
        nbs = [notebooks_dir / f"{s.notebook}.ipynb" for s in registry.stages()]
        missing = [p.name for p in nbs if not p.is_file()]
        if missing:
            raise SpecError(f"{notebooks_dir}: the registered stages' notebooks {', '.join(missing)} are missing")
        if not only:   # a stage with side effects (tune stops the server) runs only when --only names it
            return [notebooks_dir / f"{s.notebook}.ipynb" for s in registry.stages() if s.in_default_run]
    else:
        nbs = sorted(p for p in notebooks_dir.glob("*.ipynb") if not p.name.startswith("."))
    if not nbs:
        raise SpecError(f"{notebooks_dir}: no notebooks found")
    if not only:
        return nbs
    by_name: dict[str, Path] = {}
    for p in nbs:
        by_name[p.stem] = p
        by_name[re.sub(r"^\d+[_-]", "", p.stem)] = p
    picked = []
    for name in only:
        if name not in by_name:
            known = ", ".join(re.sub(r"^\d+[_-]", "", p.stem) for p in nbs)
            raise SpecError(f"--only {name}: no such notebook (known: {known})")
        if by_name[name] not in picked:
            picked.append(by_name[name])
    return sorted(picked)


class DeploymentLock:
    """An flock per deployment under <out>/.locks; released by the kernel when the process ends."""

    def __init__(self, out_dir: Path, name: str):
        self.path = out_dir / ".locks" / f"{name}.lock"
        self.fd: int | None = None

    def __enter__(self) -> DeploymentLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # not inherited by kernels
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise LockHeld(f"another run of this deployment is in progress (lock {self.path}, held by pid {holder or '?'}); "
                           "wait for it or remove nothing: the lock frees itself when that run ends") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def git_commit() -> str | None:
    """The checkout's commit (with -dirty); None for an installed wheel or without git."""
    root = paths.repo_root()
    if root is None:
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _stamp_notebook(path: Path, res: NotebookResult) -> None:
    """Record the runner's verdict inside the archived notebook: papermill marks timed-out and
    dead-kernel notebooks as completed, so its own metadata cannot be trusted for that."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    doc.setdefault("metadata", {})["runbook"] = {"status": res.status, "papermill_exit": res.papermill_exit, "error": res.error}
    atomic_write_text(path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def _run_one(nb: Path, run_dir: Path, spec: spec_mod.Deployment, user_params: dict[str, Any], budget: float,
             opts: RunSettings, log: Log) -> NotebookResult:
    stem = nb.stem
    res = NotebookResult(name=stem, status="ok")
    out_nb, res_json, log_path = run_dir / f"{stem}.ipynb", run_dir / f"{stem}.results.json", run_dir / f"{stem}.log"
    # The runner-notebook contract (params.RESERVED): what a notebook needs from the run it is part of.
    parameters = {"deployment": spec.source, "results_path": str(res_json), "artifact_dir": str(run_dir / f"{stem}-raw"),
                  "archive_root": str(run_dir.parent), "interactive": False, **user_params}
    t0 = time.monotonic()
    log(f"{stem}: running (bound {budget:.0f} s)")
    rc, err, _ = execute(nb, out_nb, parameters, nb.parent, budget, log_path, kernel_for(nb, opts.kernel, log))
    res.duration_s = round(time.monotonic() - t0, 2)
    res.papermill_exit, res.error = rc, err
    res.log = log_path.name
    if rc != 0:
        res.status = "failed"
    if res_json.exists():
        try:
            doc = results.load(res_json)
            res.findings = counts(doc["findings"])
            res.failed_findings = [f.to_dict() for f in doc["findings"] if f.status in ("fail", "warn")]
            res.results = res_json.name
        except (OSError, ValueError, TypeError) as e:
            res.status, res.error = "failed", f"unreadable results file: {e}"
    if out_nb.exists():
        res.ipynb = out_nb.name
        _stamp_notebook(out_nb, res)
        try:
            archive.export_html(out_nb, run_dir / f"{stem}.html",
                                banner=None if res.status == "ok" else f"This notebook did not complete: {res.error}")
            res.html = f"{stem}.html"
        except Exception as e:  # an HTML failure must not lose the run
            log(f"{stem}: HTML export failed: {e}")
    log(f"{stem}: {res.status} in {res.duration_s:.1f} s" + (f" — {res.error}" if res.error else ""))
    return res


def _run_secrets(spec: spec_mod.Deployment) -> set[str]:
    """Secret values to scrub (core/secrets.of_spec: the environment's, the API key's, serving.env_file's)."""
    return secrets.of_spec(spec)


def _make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)  # whatever the umask


class _UmaskRestored:
    """The run's folder is built under umask 0077 (see `run`); whatever happens, the caller's umask comes back."""

    def __enter__(self) -> int:
        self.mask = current_umask()
        return self.mask

    def __exit__(self, *exc: Any) -> None:
        os.umask(self.mask)


def publish_modes(root: Path, umask: int | None = None) -> None:
    """Set `umask` back (when given), then give the folder and everything in it the modes a plain mkdir and
    open give here (0777 / 0666 less the umask): a finished run keeps the usual policy."""
    if umask is not None:
        os.umask(umask)
    mask = current_umask()
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def _record_upload(run_dir: Path, summary: dict[str, Any], fnd: dict[str, str], url: str, scrub: set[str]) -> None:
    """Put the upload's finding in a finished run's summary (replacing an earlier one) and rewrite it, scrubbed."""
    fnd = {k: secrets.redact_text(v, scrub) for k, v in fnd.items()}
    old = (summary.get("archive") or {}).get("finding")
    if old and old.get("status") in summary["findings"]:
        summary["findings"][old["status"]] -= 1
    summary["findings"][fnd["status"]] += 1
    summary["archive"] = {"url": secrets.redact_text(url, scrub), "status": fnd["status"], "finding": fnd}
    atomic_write_json(run_dir / "summary.json", summary)
    atomic_write_text(run_dir / "summary.md", summary_md(summary))
    archive.write_summary_html(run_dir, summary, attention(summary["notebooks"]))


def _upload(out_dir: Path, run_ids: list[str], url: str, scrub: set[str], log: Log, by: str | None = None,
            current: dict[str, Any] | None = None) -> list[upload.UploadResult]:
    """Upload finished runs (oldest first) and record each outcome in its summary; never raises.

    `by`: the run doing it (retries are marked "retried by"); `current`: that run's summary, in memory."""
    out: list[upload.UploadResult] = []
    try:
        fs, root = upload.open_store(url)
    except Exception as e:
        fs, root, problem = None, None, secrets.redact_text(str(e), scrub)
        log(f"archive: {problem}")
    for run_id in run_ids:
        d = out_dir / run_id
        try:
            s = current if current and current["run_id"] == run_id else json.loads((d / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            log(f"archive: {run_id}: unreadable summary, not uploaded: {e}")
            continue
        host = s.get("host") or upload.host_name()
        dest = upload.run_url(url, host, run_id)
        upload.mark_pending(out_dir, run_id, url)
        # recorded before the upload so the stored summary says where it is; replaced below on failure
        _record_upload(d, s, upload.finding(upload.UploadResult(run_id, dest, ok=True), None if run_id == by else by), dest, scrub)
        res = upload.upload_run(d, url, host, scrub, fs, root) if fs is not None else \
            upload.UploadResult(run_id, dest, ok=False, error=problem)
        if not res.ok:
            _record_upload(d, s, upload.finding(res), dest, scrub)
        upload.write_state(out_dir, res, url)
        log(f"archive: {run_id} " + (f"uploaded to {res.url} ({res.files} objects, {res.seconds:.1f} s)" if res.ok
                                      else f"not uploaded to {res.url}: {res.error}; the local archive is intact"))
        out.append(res)
    return out


class PushOptions(Options):
    """The `push` verb's settings, declared once: cli.py builds its flags from these fields, as for `run`."""

    deployment: str | None = Field(None, json_schema_extra={"shared": True})   # --deployment: a flag of every verb (cli.py)
    out: Path = Field(OUTPUTS, description="archive root (default: outputs/)", json_schema_extra={"metavar": "DIR"})
    archive_url: upload.ArchiveUrl | None = Field(None, description="s3://BUCKET/PREFIX (default: $RUNBOOK_ARCHIVE_URL, else "
                                                  "the spec's archive.url)", json_schema_extra={"metavar": "URL", "echo": False})
    runs: list[str] = Field(default_factory=list, alias="run", description="upload exactly this run (again); repeatable",
                            json_schema_extra={"metavar": "RUN_ID", "each": True})


def push(opts: PushOptions, everything: bool = True, log: Log | None = None) -> list[upload.UploadResult]:
    """`runbook push`: upload local runs not yet in the store at `archive_url` (or exactly `runs`)."""
    log = log or Log()
    spec = spec_mod.load(opts.deployment) if opts.deployment else None
    url = upload.resolve_url(opts.archive_url, spec.archive.url if spec else None)
    if not url:
        raise SpecError("push: no archive URL: give --archive-url s3://BUCKET/PREFIX, set RUNBOOK_ARCHIVE_URL or archive.url in the spec")
    out_dir = opts.out.resolve()
    scrub = _run_secrets(spec) if spec else secrets.secret_values()
    log.secrets |= scrub
    name = spec.name if spec else None
    ids = list(opts.runs)
    known = {r["_dir"]: r.get("deployment") for r in archive.list_runs(out_dir)}
    missing = [i for i in ids if i not in known]
    if missing:
        raise SpecError(f"push: no finished run {', '.join(missing)} under {out_dir}")
    ids = ids or upload.pending_runs(out_dir, url, name, everything=everything)
    # A run uploads its own and retries the pending: hold each deployment's lock (LockHeld, exit 75, while one runs).
    names = {n for n in (*(known.get(i) for i in ids), name) if isinstance(n, str) and DEPLOYMENT_NAME.fullmatch(n)}
    if names:
        output_dir(out_dir)   # the locks are files in it: one line when this user cannot write there
    with contextlib.ExitStack() as held:
        for n in sorted(names):
            held.enter_context(DeploymentLock(out_dir, n))
        return _upload(out_dir, ids, url, scrub, log)


def run(options: Options, log: Log | None = None) -> tuple[int, Path | None]:
    """Execute and archive under the options (`RunOptions`; unset: the defaults); returns (exit code, run directory)."""
    opts = RunSettings.resolve(None, options)
    log = log or Log()
    spec = spec_mod.load(opts.deployment)
    archive_url = upload.resolve_url(opts.archive_url, spec.archive.url)
    textfile_dir, where = alerts.textfile.resolve_dir(opts.textfile_dir, spec.alerts.textfile_dir)
    if textfile_dir:
        alerts.textfile.check_dir(textfile_dir, where)
    nbs = discover(opts.notebooks_dir, opts.only)
    scrub = _run_secrets(spec)
    log.secrets |= scrub
    per_nb = params_mod.resolve(opts.params, nbs, scrub)
    # The runner's own parameters are paths: one that holds a secret would be written into every notebook too.
    params_mod.refuse_secrets({"--deployment": spec.source, "--out": str(Path(opts.out).resolve())}, scrub)
    out_dir = output_dir(Path(opts.out).resolve())
    with DeploymentLock(out_dir, spec.name), oscalls.handling(on_signal), _UmaskRestored() as umask:
        archive.clean_stale(out_dir, spec.name)
        started = dt.datetime.now(dt.timezone.utc)
        stamp = f"{started:%Y%m%dT%H%M%SZ}"
        run_id, n = f"{stamp}-{spec.name}", 2
        while (out_dir / run_id).exists() or (out_dir / f"{archive.INPROGRESS}{run_id}").exists():
            run_id, n = f"{stamp}-{n}-{spec.name}", n + 1
        tmp = out_dir / f"{archive.INPROGRESS}{run_id}"
        os.umask(0o077)   # until published, every file in it (the notebooks' too) is the owner's only, even after a SIGKILL
        _make_private_dir(tmp)
        archive.mark_inprogress(tmp, spec.name)
        log(f"run {run_id}: {len(nbs)} notebook(s), deployment {spec.name}")
        t_start = time.monotonic()
        nb_results: list[NotebookResult] = []
        for nb in nbs:
            left = opts.run_timeout - (time.monotonic() - t_start)
            if left <= 1:
                nb_results.append(NotebookResult(nb.stem, "skipped", error=f"whole-run bound of {opts.run_timeout:.0f} s reached"))
                log(f"{nb.stem}: skipped (whole-run bound reached)")
                continue
            nb_results.append(_run_one(nb, tmp, spec, per_nb[nb], min(opts.timeout, left), opts, log))
        tally = {s: sum(r.findings[s] for r in nb_results) for s in STATUSES}
        code = 2 if any(r.status == "failed" for r in nb_results) else exit_code_for(tally, opts.strict)
        verdict = {0: "all notebooks ran, no check failed", 1: "checks failed", 2: "a notebook could not run"}[code]
        summary: dict[str, Any] = {
            "run_id": run_id, "deployment": spec.name, "deployment_file": spec.source, "git_commit": git_commit(),
            "host": upload.host_name(),
            "started": started.isoformat(timespec="seconds"), "duration_s": round(time.monotonic() - t_start, 2),
            "exit_code": code, "verdict": verdict, "strict": opts.strict, "findings": tally,
            "notebooks": [r.__dict__ for r in nb_results],
            "metrics": figures.figures(tmp, spec.slo),
        }
        atomic_write_json(tmp / "summary.json", summary)
        atomic_write_text(tmp / "summary.md", summary_md(summary))
        archive.write_summary_html(tmp, summary, attention(summary["notebooks"]))
        # Scrub secret values the notebooks may have printed before anything becomes visible.
        secrets.redact_tree(tmp, scrub)
        archive.unmark_inprogress(tmp)
        publish_modes(tmp, umask)
        final = out_dir / run_id
        os.replace(tmp, final)
        archive.point_latest(out_dir, run_id)
        removed = archive.apply_retention(out_dir, spec.name, opts.keep)
        if removed:
            log(f"retention: removed {len(removed)} old run(s)")
        archive.write_index(out_dir)
        if archive_url:
            upload.prune_state(out_dir)
            retry = [r for r in upload.pending_runs(out_dir, archive_url, spec.name) if r != run_id]
            _upload(out_dir, [run_id] + retry, archive_url, scrub, log, by=run_id, current=summary)
            if code == 0 and summary["findings"]["warn"] and opts.strict:
                code = summary["exit_code"] = 1
                verdict = summary["verdict"] = "checks failed"
                up: dict[str, Any] = summary["archive"]
                _record_upload(final, summary, up["finding"], up["url"], scrub)
            archive.write_index(out_dir)
        if textfile_dir:
            alerts.publish(textfile_dir, summary, final, spec, scrub, log)
        log(f"run {run_id}: exit {code} ({verdict})")
    print(secrets.redact_text(one_screen(summary, final), scrub))
    return code, final
