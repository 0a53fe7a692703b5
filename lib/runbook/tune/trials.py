"""A tune run: pre-check every candidate (nothing launched), then — unless plan-only — launch the ones that
passed, one at a time on the deployment's port (a gateway deployment's policies: the gateway alone, on a free port,
in front of the running replicas; engines/gateway.py), with the production unit paused around them (production.py);
read each one's start-up log, benchmark it, guard its accuracy against the reference, take it down, check the
GPU memory is free, and archive its result before the next one starts. The reference is launched again among the
others (`tune.reference_runs`, benchmarked only): its launch-to-launch spread is the noise a gain must clear.
`resume` continues an archived run, skipping the candidates (and the reference's runs) it finished.

SIGINT, SIGTERM and SIGHUP are recorded for the whole run (core/oscalls.on_signals), never raised into whatever
frame runs: each step checks for one (the readiness wait and every sleep at once, the benchmark and the guard
through their event loop, which cancels them), and the run unwinds with `oscalls.Interrupted` — the candidate
taken down, production restored — carrying the run id and the production findings for the CLI to report."""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.core import oscalls, paths
from runbook.core.errors import InputError, RunbookError
from runbook.core.findings import Finding
from runbook.core.fsutil import atomic_write_json
from runbook.core.spec import Deployment
from runbook.tune import candidates as cands_mod
from runbook.tune import energy, engines, guard, launch, measure, production, routing
from runbook.tune.candidates import Candidate
from runbook.tune.engines import Engine, PreCheck
from runbook.tune.recommend import recommend
from runbook.tune.settings import TuneSettings

DONE = ("done", "failed", "skipped")     # a candidate in one of these states is not run again on --resume


class Stopped(oscalls.Interrupted):
    """A signal stopped the run after the candidate was taken down and production restored: `run_id` (None when
    no run folder was made yet) continues it with --resume; `findings` say how production was left."""

    def __init__(self, signum: int, run_id: str | None, findings: list[Finding]) -> None:
        super().__init__(signum)
        self.run_id = run_id
        self.findings = findings


@dataclass
class Ctx:
    spec: Deployment
    engine: Engine
    run_dir: Path | None
    settings: TuneSettings
    systemctl: Sequence[str] = ("systemctl",)     # the hooks tests and the notebook give evaluate
    nvml: Any = None
    log: Any = None
    t0: float = field(default_factory=time.monotonic)
    baseline_gpu: list[float] | None = None
    reference: dict[str, Any] | None = None     # the reference's recorded guard outputs
    kld: Any = None                             # the reference's KL-divergence scores and floor (guard.KLD_RECORD on
    #                                             disk), or the accuracy.Record given with --record
    gpu_held: bool = False                      # a candidate's GPU memory was not given back: launch no more
    pause: Any = None                           # production.Pause while the production unit is paused
    seq: int = 0                                # launches so far: each run's `seq` orders it among the reference's runs


def tune_dir(archive: str) -> Path:
    return Path(archive) / "tune"


def _new_run(root: Path, spec: Deployment) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_id, n = f"{stamp}-{spec.name}", 2
    while (root / run_id).exists():
        run_id, n = f"{stamp}-{n}-{spec.name}", n + 1
    (root / run_id / "candidates").mkdir(parents=True)
    return root / run_id


def _resumed(root: Path, run: str, spec: Deployment) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The archived run's folder and its finished candidates; a one-line InputError when it is not one."""
    d = root / run
    try:
        meta = json.loads((d / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = sorted(p.name for p in root.iterdir() if (p / "run.json").is_file()) if root.is_dir() else []
        raise InputError(f"{{resume}} {run}: no tune run there ({d}); runs: {', '.join(known[-5:]) or 'none yet'}") from None
    if meta.get("deployment") != spec.name:
        raise InputError(f"{{resume}} {run}: that run tuned {meta.get('deployment')!r}, not {spec.name!r}; give its deployment")
    done: dict[str, dict[str, Any]] = {}
    for p in sorted((d / "candidates").glob("*.json")):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue                      # cut short by the kill: run it again
        if isinstance(doc, dict) and doc.get("status") in DONE:
            done[str(doc.get("name"))] = doc
    return d, done


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", name)[:120] + ".json"


def archive_candidate(ctx: Ctx, row: dict[str, Any]) -> None:
    if ctx.run_dir is not None:
        atomic_write_json(ctx.run_dir / "candidates" / _file_name(row["name"]), row)


def _row(c: Candidate, pre: PreCheck) -> dict[str, Any]:
    return {"name": c.name, "overlay": c.overlay, "python": c.python, "description": c.description,
            **({"policy": c.policy} if c.policy else {}), "precheck": pre.status, "reason": pre.reason,
            "predicted": pre.predicted, "argv": pre.argv,
            "precheck_details": pre.details, "status": "skipped" if pre.status == "skipped" else "planned"}


def precheck_all(ctx: Ctx, cands: list[Candidate]) -> list[tuple[Candidate, PreCheck, dict[str, Any]]]:
    """Every candidate checked together (the engine's precheck_many: one SGLang parser run per interpreter, not per
    candidate); each row's `precheck_s` is its share of that time."""
    t = ctx.spec.tune
    longest = t.longest_context or max(t.buckets)
    oscalls.current().check()
    t0 = time.monotonic()
    pres: dict[str, PreCheck] = {}
    todo = []
    for c in cands:
        if c.python and not (os.path.isfile(c.python) and os.access(c.python, os.X_OK)):
            # an upgrade canary's interpreter must be here: its parser is the check, and tune launches it here
            pres[c.name] = PreCheck("skipped", f"its serving interpreter {c.python} is not on this machine (an SGLang "
                                               "upgrade canary runs on the host that has it)")
        else:
            todo.append(c)
    checked = ctx.engine.precheck_many([cands_mod.apply(ctx.spec, c) for c in todo], longest, list(t.buckets))
    pres.update(zip((c.name for c in todo), checked, strict=True))
    share = round((time.monotonic() - t0) / max(1, len(cands)), 3)
    out = []
    for c in cands:
        row = _row(c, pres[c.name])
        row["precheck_s"] = share
        out.append((c, pres[c.name], row))
    oscalls.current().check()       # before production is touched
    return out


def _left(ctx: Ctx) -> float:
    return ctx.settings.budget_s - (time.monotonic() - ctx.t0)


def _launch(ctx: Ctx, cspec: Deployment, log_path: Path) -> Any:
    t = ctx.spec.tune
    argv, env = ctx.engine.launch_env(cspec)
    timeout = min(t.ready_timeout_s or float(ctx.spec.systemd.timeout_start_sec), t.budget_per_candidate_s, max(1.0, _left(ctx)))
    host, port = ctx.engine.address(cspec)
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    argv_for = None
    if port == cspec.serving.port:      # a server on its own port (not a gateway's): taken during start-up, another

        def argv_for(port: int) -> tuple[tuple[str, ...], dict[str, str]]:
            a, e = ctx.engine.launch_env(cspec.model_copy(update={"serving": cspec.serving.model_copy(update={"port": port})}))
            return tuple(a), e

    return launch.Launch(tuple(argv), log_path, port, host, env, ctx.engine.ready_path(cspec), timeout,
                  systemd=t.systemd_run, stop_signal=ctx.engine.stop_signal, argv_for=argv_for)


def run_candidate(ctx: Ctx, c: Candidate, pre: PreCheck, row: dict[str, Any], run: int = 1) -> dict[str, Any]:
    """Launch, read the start-up log, benchmark, guard, take down: the candidate's archived row. `run` > 1: the
    reference again, benchmarked only (its guard outputs are the first run's)."""
    cspec = ctx.engine.placed(cands_mod.apply(ctx.spec, c))     # the gateway: on free ports
    t_start = time.monotonic()
    ctx.seq += 1
    row["seq"] = ctx.seq
    log_dir = (ctx.run_dir or Path(paths.outputs_dir())) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / (_file_name(c.name)[:-5] + (f".run{run}" if run > 1 else "") + ".log")
    row["log"] = str(log_path)
    shutdown = oscalls.current()
    try:
        with launch.launched(_launch(ctx, cspec, log_path)) as srv:   # by the module: tests stand in for it
            row["ready_s"] = round(srv.ready_s, 2)
            lost = getattr(srv, "collisions", None)     # (tests stand in for Running without it)
            if lost:      # not the candidate's doing: it ran on another port (ports.relaunching)
                row.update(port=srv.port, port_collisions=[c.to_dict() for c in lost])
            if prepared := ctx.engine.prepare(cspec, srv.url):
                row["prepared"] = prepared
            row["server_info"] = ctx.engine.live(cspec, srv.url)
            row["sglang_version"] = row["server_info"].get("version")     # what the server says it runs
            st = ctx.engine.startup(cspec, log_path, pre)
            row.update(observed=st.observed, startup=st.details)
            shutdown.check()
            _log(ctx, f"{c.name}: ready in {srv.ready_s:.1f} s; benchmarking")
            t_bench = time.monotonic()
            deadline = t_start + min(ctx.spec.tune.budget_per_candidate_s, max(0.0, _left(ctx)))
            row["bench"] = measure.run(cspec, srv.url, nvml=ctx.nvml, deadline=deadline)
            row["bench_s"] = round(time.monotonic() - t_bench, 2)
            shutdown.check()
            t_guard = time.monotonic()
            if run > 1:
                row["guard"] = {"status": "skip", "checks": [], "title": "the reference again: its speed only"}
            elif time.monotonic() < deadline or c.name == ctx.spec.tune.reference:   # the others need the reference's
                _log(ctx, f"{c.name}: accuracy guard")
                _guard(ctx, cspec, c, row, srv.url)
            else:
                row["guard"] = {"status": "skip", "checks": [], "title": "the candidate's time budget was spent"}
            row["guard_s"] = round(time.monotonic() - t_guard, 2)
            if not srv.alive():
                raise launch.LaunchFailed("exited", "the server died while it was measured; see its log")
            t_down = time.monotonic()
        row["teardown_s"] = round(time.monotonic() - t_down, 2)    # SIGTERM until every process is gone, port free
        row["status"] = "done"
    except launch.LaunchFailed as e:
        st = ctx.engine.startup(cspec, log_path, pre)
        row.update(status="failed", failure_kind=e.kind, observed=st.observed, startup=st.details,
                   reason=st.failure or str(e), log_tail=e.log_tail)
    except RunbookError as e:       # the benchmark or a probe refused its inputs: this candidate, not the run
        row.update(status="failed", failure_kind="measure", reason=" ".join(str(e).split()))
    ok, how = energy.wait_memory_free(ctx.baseline_gpu, nvml=ctx.nvml)
    row["gpu_memory_freed"] = {"ok": ok, "detail": how}
    row["total_s"] = round(time.monotonic() - t_start, 2)      # launch to result, teardown and memory check included
    return row


def _guard(ctx: Ctx, cspec: Deployment, c: Candidate, row: dict[str, Any], url: str) -> None:
    context = (row.get("observed") or {}).get("context_len") or (row.get("predicted") or {}).get("context_len")
    policy = c.policy is not None      # a gateway policy changes no numerics: its own guard (routing.py)
    got = routing.record(cspec, url, row) if policy else guard.record(cspec, url, context, row.get("observed"),
                                                                      row.get("sglang_version"))
    if not policy and c.name == ctx.spec.tune.reference and not ctx.settings.record:   # else judged by the record below
        ctx.kld = guard.kld_reference(cspec, url, context)
        if ctx.kld is not None and not isinstance(ctx.kld, str):
            row["kld_floor"] = {k: f.overall for k, f in ctx.kld.floors.items()}
            if ctx.run_dir is not None:         # --resume compares the candidates left with the same reference
                why = guard.keep_kld_reference(ctx.run_dir, cspec, ctx.kld, url, context)
                row["kld_record"] = f"not written: {why}" if why else guard.KLD_RECORD
    elif not policy and (k := guard.kld_candidate(cspec, ctx.kld, url, context)) is not None:
        got["kld"] = k
    row["guard_outputs"] = got
    if c.name == ctx.spec.tune.reference:
        ctx.reference = got
        row["guard"] = {"status": "reference", "checks": routing.own_checks(cspec, got) if policy else []}
    elif ctx.reference is None and not (ctx.settings.record and got.get("kld")):
        row["guard"] = {"status": "skip", "checks": [], "title": "no reference outputs to compare with (the reference did not run)"}
    else:       # without the reference's outputs (it could not run here) the record's KL divergence alone judges
        row["guard"] = (routing.compare if policy else guard.compare)(cspec, ctx.reference or {}, got)


def plan(todo: list[str], reference: str, extra: int) -> list[tuple[str, bool]]:
    """The launch order: `todo` as given, with the reference `extra` more times (True) spread evenly among the
    other candidates, the last after the last of them: the reference's runs then span the run, so their spread holds
    the host's drift as well as a relaunch's difference (noise.py); all at the end when the others ran before a
    --resume."""
    others = [n for n in todo if n != reference]
    if extra <= 0:
        return [(n, False) for n in todo]
    after = [max(1, round(j * len(others) / extra)) for j in range(1, extra + 1)] if others else [0] * extra
    out = [(n, False) for n in todo if n == reference] + [(reference, True)] * after.count(0)
    for i, n in enumerate(others, 1):
        out += [(n, False)] + [(reference, True)] * after.count(i)
    return out


def _repeated(ref_row: dict[str, Any]) -> int:
    """The reference's finished runs after its first (one cut short or not run is run again on --resume)."""
    return sum(r.get("status") == "done" for r in ref_row.get("repeats") or [])


def _again(ctx: Ctx, ref: tuple[Candidate, PreCheck] | None, rows: dict[str, dict[str, Any]]) -> None:
    """The reference launched and benchmarked once more; its run goes to the reference row's `repeats`."""
    row = rows.get(ctx.spec.tune.reference)
    if ref is None or row is None or row.get("status") != "done":
        return                       # no first run to repeat
    if not any(r.get("status") == "done" for n, r in rows.items() if n != row["name"]):
        return                       # every other launch so far failed: no gain to judge yet, save the launch
    runs = row.setdefault("repeats", [])
    rep: dict[str, Any] = {"name": row["name"], "run": _repeated(row) + 2, "status": "planned"}
    if _left(ctx) <= 0 or ctx.gpu_held:
        rep.update(status="not_run", reason="the run's budget was spent" if not ctx.gpu_held else "GPU memory was not freed")
    else:
        _log(ctx, f"{row['name']}: launching again (run {rep['run']}: the launches' noise)")
        run_candidate(ctx, ref[0], ref[1], rep, run=rep["run"])
        ctx.gpu_held = not rep["gpu_memory_freed"]["ok"]
    runs.append(rep)
    archive_candidate(ctx, row)


def _launch_all(ctx: Ctx, todo: list[tuple[Candidate, PreCheck, dict[str, Any]]], rows: dict[str, dict[str, Any]],
                findings: list[Finding], ref: tuple[Candidate, PreCheck] | None = None) -> None:
    spec = ctx.spec
    ref_row = rows.get(spec.tune.reference) or next((r for _, _, r in todo if r["name"] == spec.tune.reference), {})
    by_name = {c.name: (c, p, r) for c, p, r in todo}
    compared = any(n != spec.tune.reference for n in by_name) or any(
        n != spec.tune.reference and r.get("status") == "done" for n, r in rows.items())
    extra = spec.tune.reference_runs - 1 - _repeated(ref_row) if compared else 0    # alone: nothing to compare with
    ref = ref or next(((c, p) for c, p, _ in todo if c.name == spec.tune.reference), None)
    unit, ready = ctx.engine.production(spec)    # the production server (gateway) displaced; inactive: nothing stopped
    ctx.baseline_gpu = energy.gpu_memory_used(ctx.nvml)
    shutdown = oscalls.current()
    with production.paused(unit, yes=ctx.settings.yes, ready_url=ready, ready_timeout_s=float(spec.systemd.timeout_start_sec),
                           systemctl=ctx.systemctl) as pause:
        ctx.pause = pause
        for name, again in plan([c.name for c, _, _ in todo], spec.tune.reference, extra):
            shutdown.check()
            if again:
                _again(ctx, ref, rows)
                continue
            c, pre, row = by_name[name]
            if _left(ctx) <= 0:
                row.update(status="not_run", reason=f"the run's budget of {ctx.settings.budget_s:g} s was spent")
            elif ctx.gpu_held:
                row.update(status="not_run", reason="GPU memory was not freed after the previous candidate")
            else:
                _log(ctx, f"{c.name}: launching")
                run_candidate(ctx, c, pre, row)
                ctx.gpu_held = not row["gpu_memory_freed"]["ok"]
                _log(ctx, f"{c.name}: {row['status']}" + (f" ({row.get('reason')})" if row["status"] != "done" else ""))
            rows[c.name] = row
            archive_candidate(ctx, row)
        shutdown.check()
    findings += pause.findings


def _consent(ctx: Ctx) -> None:
    """The safety stop before anything is made or launched: production active and no --yes."""
    production.require_consent(ctx.engine.production(ctx.spec)[0], yes=ctx.settings.yes, systemctl=ctx.systemctl)


def _log(ctx: Ctx, msg: str) -> None:
    if ctx.log is not None:
        ctx.log(msg)


def tune(spec: Deployment, s: TuneSettings, systemctl: Sequence[str] = ("systemctl",), nvml: Any = None,
         log: Any = None) -> dict[str, Any]:
    """The whole run: its rows (one per candidate), the recommendation, the run folder and findings.
    oscalls.Interrupted (with `run_id` and `findings`) when a signal stopped it; production is restored first."""
    cands = cands_mod.select(cands_mod.expand(spec), s.candidates)
    ctx = Ctx(spec, engines.for_spec(spec), None, s, systemctl, nvml, log)
    with oscalls.on_signals() as shutdown:
        try:
            res = _run(ctx, cands)
            shutdown.check()      # a signal during the final restore: the run still ends as the operator asked
            return res
        except Stopped:
            raise
        except oscalls.Interrupted as e:
            raise Stopped(e.signum, ctx.run_dir.name if ctx.run_dir else None,
                          list(ctx.pause.findings) if ctx.pause else []) from None


def _run(ctx: Ctx, cands: list[Candidate]) -> dict[str, Any]:
    spec, s = ctx.spec, ctx.settings
    root = tune_dir(s.archive_root)
    done: dict[str, dict[str, Any]] = {}
    if s.record and not s.plan_only:        # refused before anything is stopped or launched
        ctx.kld = guard.recorded_kld_reference(spec, s.record)
    if s.resume:
        ctx.run_dir, done = _resumed(root, s.resume, spec)
        _log(ctx, f"run {ctx.run_dir.name}: resumed ({ctx.run_dir})")
    elif not s.plan_only:        # the run id first: an interrupt during the pre-check can be resumed too
        _consent(ctx)
        ctx.run_dir = _new_run(root, spec)
        _log(ctx, f"run {ctx.run_dir.name}: started ({ctx.run_dir})")
    if ctx.run_dir is not None:
        atomic_write_json(ctx.run_dir / "run.json", {"deployment": spec.name, "engine": spec.tune.engine,
                                                     "candidates": [c.name for c in cands]})
    ref_done = done.get(spec.tune.reference)
    again = ref_done is not None and spec.tune.reference_runs - 1 > _repeated(ref_done)
    checked = precheck_all(ctx, [c for c in cands if c.name not in done or (again and c.name == spec.tune.reference)])
    again_ref = next(((c, p) for c, p, _ in checked if c.name in done and p.status == "ok"), None)   # resumed: run it again
    checked = [x for x in checked if x[0].name not in done]
    ctx.seq = max([int(r.get("seq") or 0) for d in done.values() for r in [d, *(d.get("repeats") or [])]], default=0)
    _log(ctx, f"pre-check: {sum(p.status == 'ok' for _, p, _ in checked)} of {len(checked)} candidates pass"
         + (f" ({len(done)} finished in {s.resume})" if done else ""))
    rows: dict[str, dict[str, Any]] = dict(done)
    findings: list[Finding] = []
    if s.plan_only:
        rows.update({c.name: row for c, _, row in checked})
    else:
        assert ctx.run_dir is not None
        ref = done.get(spec.tune.reference)
        ctx.reference = ref.get("guard_outputs") if ref else None
        if ref is not None and not s.record:
            ctx.kld = guard.kept_kld_reference(ctx.run_dir)
        for _, pre, row in checked:
            if pre.status == "skipped":
                rows[row["name"]] = row
                archive_candidate(ctx, row)
        _launch_all(ctx, [x for x in checked if x[1].status == "ok"], rows, findings, again_ref)
    ordered = [rows[c.name] for c in cands if c.name in rows]
    rec = None if s.plan_only else recommend(spec, ordered)
    return {"rows": ordered, "recommendation": rec, "run_dir": str(ctx.run_dir) if ctx.run_dir else None,
            "run_id": ctx.run_dir.name if ctx.run_dir else None, "findings": findings, "plan_only": s.plan_only,
            "resumed": sorted(done)}
