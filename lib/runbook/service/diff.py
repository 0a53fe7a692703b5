"""The rendered unit against the installed one: a unified diff and a flag-level table."""
from __future__ import annotations

import difflib
from pathlib import Path

from runbook.core.findings import Finding
from runbook.service import unitfile
from runbook.service.render import Rendered


def _launch_flags(unit: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    starts = unitfile.values(unit, "Service", "ExecStart")
    if not starts:
        return {}
    words = unitfile.split_words(starts[-1])
    if "sglang.launch_server" in words:
        words = words[words.index("sglang.launch_server") + 1:]
    return unitfile.flags_of(words)


def diff(rendered: Rendered, installed: Path) -> tuple[str, list[dict[str, str]], list[Finding]]:
    """Unified diff and a flag-level table of what installing would change."""
    if not installed.exists():
        return "", [], [Finding("service.diff", "info", f"no unit installed at {installed}", detail="install would create it")]
    old = installed.read_text(encoding="utf-8", errors="replace")
    text = "".join(difflib.unified_diff(old.splitlines(True), rendered.text.splitlines(True), str(installed), "rendered"))
    a, b = unitfile.parse(old), unitfile.parse(rendered.text)
    rows: list[dict[str, str]] = []
    for kind, x, y in (("flag", _launch_flags(a), _launch_flags(b)), ("env", unitfile.environment(a), unitfile.environment(b)),
                       ("setting", {k: v for k, v in a.get("Service", []) if k not in ("ExecStart", "Environment")},
                        {k: v for k, v in b.get("Service", []) if k not in ("ExecStart", "Environment")})):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                change = "added" if k not in x else "removed" if k not in y else "changed"
                rows.append({"kind": kind, "name": k, "installed": x.get(k, ""), "rendered": y.get(k, ""), "change": change})
    if not text:
        return "", [], [Finding("service.diff", "pass", f"installed unit {installed} matches the spec")]
    return text, rows, [Finding("service.diff", "warn", f"installed unit differs from the spec in {len(rows)} item(s)",
                                evidence=", ".join(f"{r['change']} {r['name']}" for r in rows[:6]),
                                remedy="Review the diff; `python -m runbook service install --yes` applies the spec.")]
