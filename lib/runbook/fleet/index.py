"""Collect completed runs from an archive store and build the fleet index (see the package docstring)."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from runbook.core import registry
from runbook.core.fsutil import atomic_write_text
from runbook.core.numeric import is_number
from runbook.fleet.options import FleetOptions
from runbook.runner.upload import MARKER, open_store

SCHEMA = "runbook.fleet/1"


@dataclass
class Fleet:
    """What `collect` read: run summaries (each with `_host`, `_run`, `_html`) plus how it went."""
    url: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    objects_listed: int = 0
    incomplete: int = 0                       # run folders without _COMPLETE (uploading, or an upload that failed)
    unreadable: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _layout(keys: list[str], root: str) -> tuple[dict[tuple[str, str], set[str]], set[tuple[str, str]]]:
    """(host, run id) -> file names, and the runs that have their marker; only PREFIX/<host>/<run>/<file>."""
    files: dict[tuple[str, str], set[str]] = {}
    done: set[tuple[str, str]] = set()
    cut = len(root) + 1 if root else 0
    for k in keys:
        parts = k[cut:].split("/")
        if len(parts) < 3 or not parts[0] or not parts[1]:
            continue
        run = (parts[0], parts[1])
        if len(parts) == 3:
            files.setdefault(run, set()).add(parts[2])
            if parts[2] == MARKER:
                done.add(run)
    return files, done


def _read_all(fs: Any, paths: list[str], workers: int) -> list[Any]:
    """Bytes (or the exception) of each path, `workers` at a time: asyncio for async filesystems (s3fs)."""
    if getattr(fs, "async_impl", False):
        from fsspec.asyn import sync  # lazy: ~0.1 s, only for an async store (s3fs)

        async def gather() -> list[Any]:
            sem = asyncio.Semaphore(workers)

            async def one(p: str) -> Any:
                async with sem:
                    try:
                        return await fs._cat_file(p)
                    except Exception as e:  # one bad object is skipped, not fatal
                        return e
            return await asyncio.gather(*(one(p) for p in paths))
        return sync(fs.loop, gather)

    def one_sync(p: str) -> Any:
        try:
            return fs.cat_file(p)
        except Exception as e:
            return e
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one_sync, paths))


def collect(url: str, workers: int = 64, fs: Any = None, root: str | None = None) -> Fleet:
    """List the store once and read the summary.json of every completed run, concurrently."""
    if fs is None or root is None:
        fs, root = open_store(url)
    fl = Fleet(url=url.rstrip("/"))
    t0 = time.perf_counter()
    try:
        keys = [str(k) for k in fs.find(root)]      # one recursive listing (S3: ListObjectsV2 pages, no delimiter)
    except FileNotFoundError:
        keys = []
    fl.timings["list_s"] = time.perf_counter() - t0
    fl.objects_listed = len(keys)
    files, done = _layout(keys, root)
    fl.incomplete = sum(1 for r, names in files.items() if r not in done and "summary.json" in names)
    todo = sorted(r for r in done if "summary.json" in files[r])
    t1 = time.perf_counter()
    bodies = _read_all(fs, [f"{root}/{h}/{r}/summary.json" for h, r in todo], workers)
    fl.timings["read_s"] = time.perf_counter() - t1
    for (host, run_id), body in zip(todo, bodies, strict=True):
        try:
            if isinstance(body, BaseException):
                raise body
            doc = json.loads(body)
            if not isinstance(doc, dict) or not isinstance(doc.get("deployment"), str):
                raise ValueError("not a run summary")
        except Exception as e:
            fl.unreadable.append(f"{host}/{run_id}: {type(e).__name__}")
            continue
        doc["_host"], doc["_run"] = host, run_id
        doc["_html"] = sorted(n for n in files[(host, run_id)] if n.endswith(".html"))
        fl.runs.append(doc)
    return fl


# --- the index document -------------------------------------------------------------------------------

def _linker(fl: Fleet, links: str, base: str | None, expires: int, fs: Any) -> Any:
    """rel path (HOST/RUN/FILE under PREFIX) -> href: relative, under an absolute base, or presigned."""
    if links == "presigned":
        if fs is None:
            fs, _ = open_store(fl.url)

        def sign(rel: str) -> str:
            try:
                return str(fs.sign(f"{fl.url}/{rel}", expiration=expires))
            except NotImplementedError:
                return rel
        return sign
    if base:
        return lambda rel: f"{base.rstrip('/')}/{rel}"
    return lambda rel: rel


def _failing(s: dict[str, Any]) -> list[dict[str, str]]:
    out = [{"notebook": n.get("name", "?"), "id": f.get("id", ""), "status": f.get("status", ""), "title": f.get("title", "")}
           for n in s.get("notebooks") or [] if isinstance(n, dict)
           for f in n.get("failed_findings") or [] if isinstance(f, dict) and f.get("status") == "fail"]
    out += [{"notebook": n.get("name", "?"), "id": "notebook.error", "status": "fail", "title": str(n.get("error") or "")}
            for n in s.get("notebooks") or [] if isinstance(n, dict) and n.get("status") == "failed"]
    up = (s.get("archive") or {}).get("finding")
    if isinstance(up, dict) and up.get("status") not in (None, "pass"):
        out.append({"notebook": "archive", "id": up.get("id", ""), "status": up.get("status", ""), "title": up.get("title", "")})
    return out


def _point(s: dict[str, Any], link: Any) -> dict[str, Any]:
    m: dict[str, Any] = s["metrics"] if isinstance(s.get("metrics"), dict) else {}
    p = {"run_id": s["_run"], "started": s.get("started"), "exit_code": s.get("exit_code"),
         "link": link(f"{s['_host']}/{s['_run']}/summary.html") if "summary.html" in s["_html"] else None}
    # the run-summary figures the stages declare as trends (core/registry.py), in stage order
    p.update({k: m[k] for k in registry.trend_keys() if is_number(m.get(k))})
    if isinstance(m.get("output_tok_s"), dict):
        p["output_tok_s"] = {str(k): v for k, v in m["output_tok_s"].items() if isinstance(v, (int, float))}
    return p


def build(fl: Fleet, trend: int = 30, links: str = "relative", link_base: str | None = None, expires: int = 7 * 86400,
          fs: Any = None) -> dict[str, Any]:
    """The fleet JSON: hosts, deployments, one cell per (host, deployment) and every run's point."""
    t0 = time.perf_counter()
    link = _linker(fl, links, link_base, expires, fs)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in fl.runs:
        groups.setdefault((s["_host"], s["deployment"]), []).append(s)
    cells: list[dict[str, Any]] = []
    for (host, dep), runs in sorted(groups.items()):
        runs.sort(key=lambda s: (str(s.get("started") or ""), s["_run"]))
        last = runs[-1]
        cells.append({
            "host": host, "deployment": dep, "runs": len(runs),
            "latest": {"run_id": last["_run"], "started": last.get("started"), "exit_code": last.get("exit_code"),
                       "verdict": last.get("verdict"), "findings": last.get("findings"), "git_commit": last.get("git_commit"),
                       "failing": _failing(last),
                       "link": link(f"{host}/{last['_run']}/summary.html") if "summary.html" in last["_html"] else None,
                       "notebooks": {n[:-5]: link(f"{host}/{last['_run']}/{n}") for n in last["_html"] if n != "summary.html"}},
            "trend": [_point(s, link) for s in runs[-trend:]],
        })
    doc = {"schema": SCHEMA, "generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "source": fl.url,
           "links": "presigned" if links == "presigned" else (link_base or "relative"),
           "hosts": sorted({str(c["host"]) for c in cells}), "deployments": sorted({str(c["deployment"]) for c in cells}),
           "runs": len(fl.runs), "objects_listed": fl.objects_listed, "incomplete_runs": fl.incomplete,
           "unreadable": fl.unreadable, "cells": cells}
    fl.timings["build_s"] = time.perf_counter() - t0
    return doc


def _spark(values: list[float | None], w: int = 120, h: int = 28) -> str:
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    if not pts:
        return ""
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span, n = (hi - lo) or 1.0, max(1, len(values) - 1)
    xy = " ".join(f"{i * (w - 4) / n + 2:.1f},{h - 3 - (v - lo) / span * (h - 6):.1f}" for i, v in pts)
    return (f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}"><polyline fill="none" stroke="#2563eb" '
            f'stroke-width="1.5" points="{xy}"/></svg>')


def _level_order(label: str) -> tuple[int, str]:
    return len(label), label     # c2 before c16


def _series(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the trend table: label, latest value, sparkline."""
    tr = cell["trend"]
    rows = []
    names = {"kv_tokens_planned": "KV tokens planned", "kv_tokens_observed": "KV tokens observed",
             "max_concurrency_within_slo": "max concurrency within SLO", "max_rate_within_slo": "max request rate within SLO",
             "recall": "long-context recall",
             "greedy_identical": "greedy identity", "kvquant_attn_rel_err_max": "KV-quant attention error (max)",
             "kld_excess": "KLD above the reference's floor (nats)", "kld_top1_drop_pts": "top-1 drop against the reference (points)"}
    for key, label in names.items():
        vals = [p.get(key) for p in tr]
        if any(v is not None for v in vals):
            rows.append({"label": label, "latest": next((v for v in reversed(vals) if v is not None), None), "svg": _spark(vals)})
    names_: set[str] = {str(lv) for p in tr for lv in (p.get("output_tok_s") or {})}
    levels = sorted(names_, key=_level_order)
    for lv in levels:
        vals = [(p.get("output_tok_s") or {}).get(lv) for p in tr]
        rows.append({"label": f"output tok/s at {lv}", "latest": next((v for v in reversed(vals) if v is not None), None),
                     "svg": _spark(vals)})
    return rows


_PAGE = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Runbook fleet</title>
<style>body{font:14px system-ui,sans-serif;margin:20px;color:#111}table{border-collapse:collapse;margin:8px 0 18px}
td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}th{background:#f5f5f5}
.v0{background:#d1fae5}.v1{background:#fee2e2}.v2{background:#fde68a}.none{color:#999}small{color:#555}
.spark{vertical-align:middle}h2{margin-top:28px}</style></head><body>
<h1>Runbook fleet</h1>
<p><small>{{ d.runs }} completed runs from <code>{{ d.source }}</code> · {{ d.hosts|length }} hosts ·
{{ d.deployments|length }} deployments · generated {{ d.generated }}{% if d.incomplete_runs %} · {{ d.incomplete_runs }} run(s) without
_COMPLETE not shown{% endif %}{% if d.unreadable %} · {{ d.unreadable|length }} unreadable{% endif %}</small></p>
<table><tr><th>deployment \\ host</th>{% for h in d.hosts %}<th>{{ h }}</th>{% endfor %}</tr>
{% for dep in d.deployments %}<tr><th>{{ dep }}</th>{% for h in d.hosts %}{% set c = by.get((h, dep)) %}
{% if c %}<td class="v{{ c.latest.exit_code }}"><a href="#{{ c.anchor }}">{{ c.latest.verdict or '?' }}</a><br>
<small>{{ c.latest.started }} · exit {{ c.latest.exit_code }} · {{ c.runs }} run(s)</small>
{% if c.latest.failing %}<br><small>{{ c.latest.failing|length }} failing</small>{% endif %}</td>
{% else %}<td class="none">—</td>{% endif %}{% endfor %}</tr>
{% endfor %}</table>
{% for c in d.cells %}<h2 id="{{ c.anchor }}">{{ c.deployment }} on {{ c.host }}</h2>
<p>Latest: {% if c.latest.link %}<a href="{{ c.latest.link }}">{{ c.latest.run_id }}</a>{% else %}{{ c.latest.run_id }}{% endif %}
 — {{ c.latest.verdict }} (exit {{ c.latest.exit_code }}), {{ c.latest.started }}{% if c.latest.git_commit %}, commit
 <code>{{ c.latest.git_commit[:12] }}</code>{% endif %}.
{% for nb, href in c.latest.notebooks.items() %} <a href="{{ href }}">{{ nb }}</a>{% endfor %}</p>
{% if c.latest.failing %}<table><tr><th>notebook</th><th>finding</th><th>title</th></tr>
{% for f in c.latest.failing %}<tr><td>{{ f.notebook }}</td><td><code>{{ f.id }}</code></td><td>{{ f.title }}</td></tr>{% endfor %}
</table>{% endif %}
{% if c.rows %}<table><tr><th>trend (last {{ c.trend|length }} runs)</th><th>latest</th><th></th></tr>
{% for r in c.rows %}<tr><td>{{ r.label }}</td><td>{{ r.latest }}</td><td>{{ r.svg|safe }}</td></tr>{% endfor %}</table>{% endif %}
<p><small>Runs: {% for p in c.trend|reverse %}{% if p.link %}<a href="{{ p.link }}">{{ p.started }}</a>{% else %}{{ p.started }}{% endif %}
 (exit {{ p.exit_code }}){% if not loop.last %} · {% endif %}{% endfor %}</small></p>
{% endfor %}</body></html>
""")


def render_html(doc: dict[str, Any]) -> str:
    cells = [dict(c, anchor=f"c{i}", rows=_series(c)) for i, c in enumerate(doc["cells"])]
    by = {(c["host"], c["deployment"]): c for c in cells}
    return _PAGE.render(d=dict(doc, cells=cells), by=by)


def write(doc: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """DIR/index.html and DIR/fleet.json, each written atomically."""
    out_dir = Path(out_dir)
    j = atomic_write_text(out_dir / "fleet.json", json.dumps(doc, indent=1, default=str) + "\n")
    h = atomic_write_text(out_dir / "index.html", render_html(doc))
    return h, j


@dataclass
class Written:
    """What `runbook fleet` made: the index document, the fleet it was built from, and where it went."""
    doc: dict[str, Any]
    fleet: Fleet
    html: Path
    json: Path
    published: str | None      # the page's URL in the store, when --publish wrote it there

    def text(self) -> str:
        fl, doc = self.fleet, self.doc
        return (f"{doc['runs']} completed runs, {len(doc['hosts'])} hosts, {len(doc['deployments'])} deployments "
                f"({fl.objects_listed} objects listed in {fl.timings['list_s']:.2f} s, "
                f"summaries read in {fl.timings['read_s']:.2f} s)\nIndex: {self.html}\nJSON:  {self.json}"
                + (f"\nPublished: {self.published}" if self.published else ""))


def make(o: FleetOptions) -> Written:
    """`runbook fleet`: collect the store's completed runs, write the index and, with `publish`, put it in the store."""
    fs, root = open_store(o.source)
    fl = collect(o.source, workers=o.workers, fs=fs, root=root)
    doc = build(fl, trend=o.trend, links=o.links, link_base=o.link_base, expires=int(o.expires), fs=fs)
    html, js = write(doc, o.out)
    if o.publish:
        fs.pipe_file(f"{root}/index.html", html.read_bytes())
        fs.pipe_file(f"{root}/fleet.json", js.read_bytes())
    return Written(doc, fl, html, js, f"{o.source.rstrip('/')}/index.html" if o.publish else None)
