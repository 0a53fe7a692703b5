"""Installing the unit (opt-in): back up, write atomically, daemon-reload, restart, wait for
readiness, roll back on failure.
"""
from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from runbook.core.findings import Finding
from runbook.core.fsutil import atomic_write_text
from runbook.core.spec import Deployment
from runbook.service.render import Rendered


@dataclass
class InstallResult:
    steps: list[dict[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rolled_back: bool = False
    backup: Optional[str] = None


def wait_ready(url: str, timeout: float, interval: float = 2.0) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=min(10.0, max(1.0, timeout))) as resp:
                if resp.status == 200:
                    return True, "200"
                last = str(resp.status)
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(interval)


def install(spec: Deployment, r: Rendered, dry_run: bool = True, root: Optional[Path] = None,
            systemctl: Sequence[str] = ("systemctl",), ready_url: Optional[str] = None, ready_timeout: Optional[float] = None,
            interval: float = 2.0, log: Callable[[str], None] = lambda s: None) -> InstallResult:
    """Back up, write atomically, daemon-reload, restart, wait for readiness; roll back on failure."""
    target = Path(spec.systemd.installed_path)
    path = (Path(root) / target.relative_to("/")) if root else target
    url = ready_url or spec.serving.local_url + spec.systemd.ready_path
    timeout = ready_timeout if ready_timeout is not None else spec.systemd.timeout_start_sec
    res = InstallResult()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    backup = path.with_name(f"{path.name}.bak-{stamp}") if path.exists() else None
    unit = f"{r.unit_name}.service"
    sysctl = list(systemctl)

    def step(name: str, command: str, action: Optional[Callable[[], Any]] = None) -> bool:  # the return value is ignored
        entry = {"step": name, "command": command, "status": "planned" if dry_run else "ok"}
        res.steps.append(entry)
        log(f"{'(dry run) ' if dry_run else ''}{name}: {command}")
        if dry_run or action is None:
            return True
        try:
            action()
        except (OSError, subprocess.CalledProcessError) as e:
            entry["status"] = f"failed: {e}"
            return False
        return True

    def ctl(*a: str) -> None:
        subprocess.run(sysctl + list(a), check=True, capture_output=True, text=True, timeout=300)

    if path.exists() and path.read_text(encoding="utf-8", errors="replace") == r.text:
        res.findings.append(Finding("service.install", "pass", f"{path} already matches the spec: nothing to do"))
        return res
    if backup:
        res.backup = str(backup)
        if not step("back up", f"cp -p {path} {backup}", lambda: shutil.copy2(path, backup)):
            res.findings.append(Finding("service.install", "fail", "backup failed: nothing changed", remedy="Check permissions."))
            return res
    ok = step("write unit", f"write {path} (temp file + rename, mode 0644)", lambda: atomic_write_text(path, r.text, 0o644))
    ok = ok and step("reload", " ".join(sysctl + ["daemon-reload"]), lambda: ctl("daemon-reload"))
    ok = ok and step("restart", " ".join(sysctl + ["restart", unit]), lambda: ctl("restart", unit))
    why = ""
    if ok and not dry_run:
        entry = {"step": "wait for readiness", "command": f"GET {url} until 200 (≤ {timeout:.0f} s)", "status": "ok"}
        res.steps.append(entry)
        ready, why = wait_ready(url, timeout, interval)
        if not ready:
            entry["status"] = f"failed: {why}"
            ok = False
    elif dry_run:
        step("wait for readiness", f"GET {url} until 200 (≤ {timeout:.0f} s)")
    if dry_run:
        res.findings.append(Finding("service.install", "info", "dry run: nothing changed",
                                    detail=f"{len(res.steps)} steps planned; `--yes` carries them out (root needed for /etc/systemd)."))
        return res
    if ok:
        res.findings.append(Finding("service.install", "pass", f"installed {path} and the server is ready", evidence=url))
        return res
    res.rolled_back = True
    if backup:
        step("roll back", f"restore {backup} -> {path}", lambda: atomic_write_text(path, backup.read_text(), 0o644))
    else:
        step("roll back", f"remove {path}", lambda: path.unlink(missing_ok=True))
    step("reload", " ".join(sysctl + ["daemon-reload"]), lambda: ctl("daemon-reload"))
    step("restart previous", " ".join(sysctl + ["restart", unit]), lambda: ctl("restart", unit) if backup else None)
    res.findings.append(Finding("service.install", "fail", "the new unit did not become ready: rolled back",
                                detail=f"readiness: {why or 'a step failed'}", evidence=f"backup {backup}" if backup else "",
                                remedy=f"`journalctl -u {unit}` for why; the previous unit is running again."))
    return res
