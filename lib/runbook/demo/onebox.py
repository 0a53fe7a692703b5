"""The story's one-box flow in `make demo`: one host, one port, one server at a time, as on an 8-GPU box that holds
one copy of the model.

1. Record the reference that serves (BF16 KV): `runbook accuracy record` writes its scores and noise floors.
2. Change the unit: the reference's unit is what is installed; the candidate's (an FP8 KV cache without scales, the
   story's) is diffed against it (`runbook service diff`) and written over it.
3. The server restarts with the candidate on the same port, started from that unit's ExecStart.
4. `runbook run --only accuracy` compares it with the record (the spec's accuracy.record, as cron would): the
   verdict in the archived notebook, and in the textfile a real Prometheus scrapes: RunbookAccuracyOffReference fires.
5. Rollback: the reference's unit again, the same run: inside the record's floor, and the alert resolves.

Prometheus and node_exporter are optional (steps 4-5 then write the textfile only); the rules' `for:` is shortened
to seconds (demo/prometheus.py)."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runbook.cli import main as cli
from runbook.core import spec as specmod
from runbook.core.fsutil import atomic_write_text
from runbook.demo import prometheus, sglang

ALERT = "RunbookAccuracyOffReference"


def _log(msg: str) -> None:
    print(f"demo: one box: {msg}", file=sys.stderr, flush=True)


@dataclass
class Step:
    """One compare run of the flow, as the table at the end shows it."""
    server: str
    exit_code: int
    run_id: str
    metrics: dict[str, Any]
    alert: str


def record(spec: Path, url: str, out: Path) -> tuple[int, Path]:
    """Step 1: the reference at `url` recorded into `out` (the run's own windows: notebook 50's defaults)."""
    path = out / "reference.kld"
    return cli(["accuracy", "record", "--deployment", str(spec), "--url", url, "--record", str(path)]), path


def production(spec: Path, rec: Path, path: Path, flags: dict[str, Any] | None = None) -> Path:
    """The deployment as production's cron sees it: the demo's spec naming the record, `flags` changed."""
    data = yaml.safe_load(spec.read_text(encoding="utf-8"))
    data["serving"]["flags"].update(flags or {})
    data.setdefault("accuracy", {})["record"] = str(rec.resolve())
    return atomic_write_text(path, "# written by runbook.demo: the one-box flow's deployment\n"
                             + yaml.safe_dump(data, sort_keys=False))


def change_unit(new: Path, unit: Path) -> None:
    """Step 2 (and the rollback): `new`'s unit diffed against the one in place at `unit` (printed), then written
    over it."""
    cli(["service", "diff", "--deployment", str(new), "--installed", str(unit)])
    cli(["service", "render", "--deployment", str(new), "--out", str(unit)])


def summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "latest" / "summary.json").read_text()))


def compare(spec: Path, name: str, out: Path, work: Path, textfiles: Path, alert: Callable[[], str]) -> Step:
    """Steps 3-4: `spec`'s server started on its port (its unit's ExecStart), the cron run, then the alert's state."""
    srv = sglang.start(specmod.load(spec), log_path=work / f"{name}.log")
    _log(f"{name} serving at {srv.url} ({srv.startup_s:.0f} s); runbook run --only accuracy against the record")
    try:
        code = cli(["run", "--only", "accuracy", "--deployment", str(spec), "--out", str(out),
                    "--textfile-dir", str(textfiles), "--param", "toolcall_max_tokens=64"])
    finally:
        srv.stop()
    s = summary(out)
    return Step(name, code, s["run_id"], s.get("metrics") or {}, alert())


def _alert(stack: prometheus.Stack | None, firing: bool) -> str:
    """Wait (at most 90 s) for the alert to fire or to resolve; what it did."""
    if stack is None:
        return "no Prometheus"
    want = "fired" if firing else "resolved"
    done = (lambda: stack.alerts(ALERT)) if firing else (lambda: not stack.alerts(ALERT) and not stack.alerts(ALERT, "pending"))
    try:
        prometheus.until(f"{ALERT} {want}", done, 90)
    except TimeoutError:
        return "did not fire" if firing else "still firing"
    return want


def table(two_server: dict[str, Any], steps: list[Step]) -> str:
    """The flow's figures: the two-server probe of the main run beside each compare with the record."""
    rows = [("two servers side by side (the main run)", two_server, "")] + [
        (f"{s.server} vs the record ({s.run_id})", s.metrics, s.alert) for s in steps]
    lines = [f"{'compared':<62} {'verdict':<8} {'excess KLD':>11} {'top-1 drop':>11}  alert"]
    for what, m, alert in rows:
        lines.append(f"{what:<62} {m.get('kld_verdict', '-'):<8} {m.get('kld_excess', float('nan')):>11.5f} "
                     f"{m.get('kld_top1_drop_pts', float('nan')):>10.2f}p  {alert}")
    return "\n".join(lines)


def run(spec: Path, rec: Path, two_server: dict[str, Any], candidate: dict[str, Any], out: Path) -> int:
    """Steps 2-5 once the demo's servers are stopped: `spec` (the reference's deployment, on the port the record
    was made at) switched to `candidate`'s flags and back, each compared with `rec` from a cron-style run."""
    work = rec.parent
    ref, cand = production(spec, rec, work / "production.yaml"), production(spec, rec, work / "candidate.yaml", candidate)
    unit = work / "units" / f"{specmod.load(ref).systemd.unit_name}.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    try:
        stack: prometheus.Stack | None = prometheus.Stack(work / "prometheus")
    except prometheus.Missing as e:
        _log(f"alerts not shown: {e}")
        stack = None
    textfiles = stack.textfiles if stack else work / "textfile"
    textfiles.mkdir(parents=True, exist_ok=True)
    cli(["service", "render", "--deployment", str(ref), "--out", str(unit)])     # the reference's unit, installed
    try:
        change_unit(cand, unit)
        steps = [compare(cand, "candidate", out, work, textfiles, lambda: _alert(stack, firing=True))]
        change_unit(ref, unit)
        steps.append(compare(ref, "rollback", out, work, textfiles, lambda: _alert(stack, firing=False)))
    finally:
        if stack:
            stack.stop()
    _log(f"{candidate} against the record of the reference, then the reference again:\n" + table(two_server, steps))
    return max(s.exit_code for s in steps)
