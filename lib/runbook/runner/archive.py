"""The run archive under outputs/: per-run folders, summary files, latest, index.html, retention."""
from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path
from typing import Any

import jinja2

from runbook.core.archive import INPROGRESS, list_runs
from runbook.core.fsutil import atomic_write_text

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("runbook.runner", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"]),
    trim_blocks=True, lstrip_blocks=True,
)

# Code input is hidden in archived HTML; the button shows it. Kept small and self-contained.
_TOGGLE = """<style>body.rb-hide-input .jp-CodeCell .jp-Cell-inputWrapper{display:none}
#rb-toggle{position:fixed;top:8px;right:12px;z-index:100;font:13px sans-serif;padding:4px 10px}
.rb-banner{font:14px sans-serif;padding:10px 14px;margin:8px;border-radius:4px;background:#f8d7da;color:#58151c}
.rb-log{margin:24px 0 8px;font:13px sans-serif}.rb-log summary{cursor:pointer;color:#555}
.rb-log pre{font-size:12px;background:#f5f5f5;padding:8px;white-space:pre-wrap;overflow-wrap:anywhere}</style>
<script>document.addEventListener('DOMContentLoaded',function(){document.body.classList.add('rb-hide-input');
var b=document.createElement('button');b.id='rb-toggle';b.textContent='Show code';
b.onclick=function(){var h=document.body.classList.toggle('rb-hide-input');b.textContent=h?'Show code':'Hide code'};
document.body.appendChild(b);});</script>"""


def export_html(ipynb: Path, out: Path, banner: str | None = None) -> Path:
    """nbconvert's lab HTML without the injected-parameters cell, input hidden behind a toggle, and what the
    cells wrote to stderr (progress lines, warnings) in a collapsed log at the end instead of in red among the
    results; the archived notebook keeps it where it was written."""
    import nbformat  # lazy: nbformat and nbconvert (~0.8 s) only when a run's HTML is written
    from nbconvert import HTMLExporter  # lazy: see nbformat above
    from nbconvert.preprocessors import TagRemovePreprocessor  # lazy: see nbformat above

    nb = nbformat.read(str(ipynb), as_version=4)
    log = _take_stderr(nb)
    exporter = HTMLExporter(template_name="lab")
    exporter.register_preprocessor(TagRemovePreprocessor(remove_cell_tags=("injected-parameters",)), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    body = body.replace("</head>", _TOGGLE + "</head>", 1)
    if banner:
        body = _insert_after_body_tag(body, f'<div class="rb-banner">{html.escape(banner)}</div>')
    if log:
        n = log.count("\n") + 1
        section = (f'<details class="rb-log" id="rb-log"><summary>Log: what the cells wrote to stderr ({n} line'
                   f'{"s" if n != 1 else ""})</summary><pre>{html.escape(log)}</pre></details>')
        body = body.replace("</main>", section + "</main>", 1) if "</main>" in body else body.replace("</body>", section + "</body>", 1)
    return atomic_write_text(out, body)


def _take_stderr(nb: Any) -> str:
    """Remove the code cells' stderr stream outputs from `nb`; their text, in order."""
    parts: list[str] = []
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        keep = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stderr":
                parts.append(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", [])))
            else:
                keep.append(o)
        cell["outputs"] = keep
    return "".join(parts).rstrip("\n")


def _insert_after_body_tag(doc: str, snippet: str) -> str:
    i = doc.find("<body")
    j = doc.find(">", i) if i >= 0 else -1
    return doc if j < 0 else doc[: j + 1] + snippet + doc[j + 1:]


def write_summary_html(run_dir: Path, summary: dict[str, Any], attention: list[tuple[str, dict[str, str]]]) -> Path:
    """The run's page; `attention`: (notebook, finding) to list under "Needs attention", per-level ones folded."""
    page = _TEMPLATES.get_template("summary.html.j2").render(s=summary, att=attention)
    return atomic_write_text(run_dir / "summary.html", page)


def write_index(out_dir: Path) -> Path:
    runs = list_runs(out_dir)
    page = _TEMPLATES.get_template("index.html.j2").render(runs=runs)
    return atomic_write_text(out_dir / "index.html", page)


def point_latest(out_dir: Path, run_dir_name: str) -> None:
    tmp = out_dir / f".latest.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(run_dir_name, tmp)
    os.replace(tmp, out_dir / "latest")


_MARKER = ".runbook-deployment"  # inside an in-progress folder: whose run it is


def run_id_pattern(deployment: str) -> re.Pattern[str]:
    """Run ids of exactly this deployment: `<UTC stamp>[-N]-<deployment>` (so `rtq` never matches `x-rtq`)."""
    return re.compile(r"\d{8}T\d{6}Z(?:-\d+)?-" + re.escape(deployment))


def _is_run_of(name: str, deployment: str) -> bool:
    return run_id_pattern(deployment).fullmatch(name) is not None


def mark_inprogress(tmp: Path, deployment: str) -> None:
    """Record the deployment inside its in-progress folder: a run id alone is ambiguous when one
    deployment's name is a suffix of another's (`<stamp>-2-rtq` is run 2 of `rtq` or a run of `2-rtq`)."""
    (tmp / _MARKER).write_text(deployment + "\n", encoding="utf-8")


def unmark_inprogress(tmp: Path) -> None:
    (tmp / _MARKER).unlink(missing_ok=True)


def _inprogress_owner(d: Path) -> str | None:
    try:
        return (d / _MARKER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def apply_retention(out_dir: Path, deployment: str, keep: int | None) -> list[str]:
    """Delete this deployment's oldest runs beyond `keep`; other deployments are untouched: a run is
    this deployment's when its summary says so and its folder name is one of this deployment's run ids."""
    if not keep or keep < 1:
        return []
    mine = [r for r in list_runs(out_dir) if r.get("deployment") == deployment and _is_run_of(r["_dir"], deployment)]
    removed = []
    for r in mine[keep:]:
        shutil.rmtree(out_dir / r["_dir"], ignore_errors=True)
        removed.append(r["_dir"])
    return removed


def clean_stale(out_dir: Path, deployment: str) -> list[str]:
    """Remove half-built runs of this deployment left by a killed run (we hold its lock).

    Only `.inprogress-<run id>` folders whose run id is exactly one of this deployment's, and whose
    marker (when present) names this deployment: another deployment's run in progress is never touched."""
    removed: list[str] = []
    if not out_dir.is_dir():
        return removed
    for d in out_dir.iterdir():
        if not d.name.startswith(INPROGRESS) or d.is_symlink() or not d.is_dir():
            continue
        if not _is_run_of(d.name[len(INPROGRESS):], deployment):
            continue
        owner = _inprogress_owner(d)
        if owner is not None and owner != deployment:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed
