"""A finished run's summary as people read it: summary.md, the one screen `runbook run` prints, and the findings
that need attention (summary.json keeps every finding)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook.core.findings import STATUSES, Finding, grouped


def summary_md(s: dict[str, Any]) -> str:
    lines = [f"# Runbook run {s['run_id']}", "",
             f"- deployment: `{s['deployment']}` ({s['deployment_file']})",
             f"- commit: `{s['git_commit'] or 'unknown'}`",
             f"- started {s['started']}, {s['duration_s']:.0f} s, exit code **{s['exit_code']}** ({s['verdict']})", ""]
    broken = [n for n in s["notebooks"] if n["status"] == "failed"]
    if broken:
        lines += ["## Errors", ""] + [f"- **{n['name']}**: {n['error']}" for n in broken] + [""]
    lines += ["## Notebooks", "", "| notebook | status | duration | " + " | ".join(STATUSES) + " |",
              "|---|---|---|" + "---|" * len(STATUSES)]
    for n in s["notebooks"]:
        link = f"[{n['name']}]({n['html']})" if n.get("html") else n["name"]
        lines.append(f"| {link} | {n['status']} | {n['duration_s']:.1f} s | " + " | ".join(str(n["findings"][k]) for k in STATUSES) + " |")
    att = attention(s["notebooks"])
    up = (s.get("archive") or {}).get("finding")
    if up and up["status"] != "pass":
        att.append(("archive", up))
    if att:
        lines += ["", "## Needs attention", ""]
        for name, f in sorted(att, key=lambda x: STATUSES.index(x[1]["status"])):
            oneline = f["title"].replace("\n", "; ")
            lines.append(f"- **{f['status'].upper()}** `{f['id']}` ({name}): {oneline}"
                         + (f" — fix: {f['remedy']}" if f.get("remedy") else ""))
    return "\n".join(lines) + "\n"


def attention(notebooks: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """Each notebook's warn and fail findings as a person reads them: per-level ones folded into one per kind
    (summary.json keeps every finding)."""
    return [(n["name"], g.to_dict()) for n in notebooks
            for g in grouped(Finding.from_dict(f) for f in n.get("failed_findings", []))]


def one_screen(summary: dict[str, Any], run_dir: Path, max_items: int = 12) -> str:
    """What `make run` prints at the end: one screen, worst first, and where the archive is."""
    out = [f"Run {summary['run_id']}: {summary['verdict']} (exit {summary['exit_code']})"]
    for n in summary["notebooks"]:
        c = n["findings"]
        tally = ", ".join(f"{c[k]} {k}" for k in STATUSES if c[k])
        out.append(f"  {n['status']:7} {n['name']:24} {n['duration_s']:6.1f} s  {tally}" + (f"  [{n['error']}]" if n["error"] else ""))
    att = [f for _, f in attention(summary["notebooks"])]
    up = (summary.get("archive") or {}).get("finding")
    if up and up["status"] != "pass":
        att.append(up)
    att.sort(key=lambda f: STATUSES.index(f["status"]))
    if att:
        out.append("Needs attention:")
        for f in att[:max_items]:
            levels = f["id"].partition(" (")[2].rstrip(")")   # a folded kind names its levels, as one level's title does
            if "\n" in f["title"]:      # a folded row with one line per wording names its items on each line
                levels, title = "", f["title"].replace("\n", "\n" + " " * 7)
            else:
                title = f["title"]
            out.append(f"  {f['status'].upper():4} {levels + ': ' if levels else ''}{title}")
            if f.get("remedy"):
                out.append(f"       fix: {f['remedy'][:160]}")
        if len(att) > max_items:
            out.append(f"  … and {len(att) - max_items} more in summary.md")
    out.append(f"Archive: {run_dir}")
    if summary.get("archive"):
        out.append(f"Store:   {summary['archive']['url']} ({summary['archive']['status']})")
    out.append(f"Index:   {run_dir.parent / 'index.html'}")
    return "\n".join(out)
