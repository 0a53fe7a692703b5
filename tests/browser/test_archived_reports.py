"""The archived HTML an operator reads, from real runs (60_tune on llama-server candidates, 40_benchmark against
llama-server), looked at in headless Chromium at a laptop's width: no red stderr block in the verdict, no
NaN/None cell, figures to their precision, no table wider than the page, one verdict row per finding kind and
status. Screenshots are saved in the test's temp dir."""
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from .conftest import CHROMIUM

pytestmark = [pytest.mark.browser, pytest.mark.notebook, pytest.mark.llama,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed (.ci/run installs it)")]

WIDTH = 1280
# Per section (the h2 above it): how many stderr outputs it shows, and its findings table's (id, status, title) rows.
_SECTIONS = """() => {
  const out = {}; let name = '';
  for (const cell of document.querySelectorAll('.jp-Cell')) {
    const hs = cell.querySelectorAll('.jp-MarkdownCell h2');    // a cell's last heading names what follows it
    if (hs.length) name = hs[hs.length - 1].innerText.replace(/¶/g, '').trim();
    const s = out[name] = out[name] || {stderr: 0, rows: []};
    s.stderr += cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').length;
    for (const t of cell.querySelectorAll('.jp-OutputArea-output table')) {
      const head = [...t.querySelectorAll('thead th')].map(th => th.innerText.trim());
      if (head[0] !== 'id' || head[1] !== 'status') continue;
      for (const tr of t.querySelectorAll('tbody tr'))
        s.rows.push([...tr.querySelectorAll('td')].slice(0, 3).map(td => td.innerText.trim()));
    }
  }
  return out;
}"""
# Every table: its cells' text, and how far it reaches past the page or scrolls inside itself.
_TABLES = """() => [...document.querySelectorAll('.jp-OutputArea-output table')].map(t => ({
  head: t.innerText.slice(0, 60), cells: [...t.querySelectorAll('td, th')].map(c => c.innerText.trim()),
  right: t.getBoundingClientRect().right, scroll: t.scrollWidth - t.clientWidth,
  page: document.documentElement.clientWidth}))"""
MISSING = re.compile(r"\b(NaN|nan|None|<NA>|NaT)\b")
LONG_DECIMALS = re.compile(r"\d\.\d{4,}")


def _runbook(*args: str, timeout: int = 900) -> None:
    cp = subprocess.run([sys.executable, "-m", "runbook", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert cp.returncode in (0, 1), cp.stdout[-2000:] + cp.stderr[-2000:]


@pytest.fixture(scope="module")
def archived(tmp_path_factory, llama):
    """The archived 60_tune and 40_benchmark HTML of one run each."""
    from runbook.core import ports
    from runbook.demo import llama as demo
    from runbook.demo.tune import CANDIDATES, write_spec

    root = tmp_path_factory.mktemp("archived")
    # a guard failure, two that ran, a flag llama-server refuses (a row with no figures): every kind of row
    picked = {k: CANDIDATES[k] for k in ("q4-kv", "np4", "ngram", "old-draft-flag")}
    spec = write_spec(root / "tune.yaml", demo.llama_server_path(), demo.tiny_model(), ports.free_port(), candidates=picked,
                      concurrency=[1, 2], requests_per_level=4, search_levels=2, output_len=16)
    _runbook("run", "--only", "tune", "--deployment", str(spec), "--out", str(root / "tune"))
    # without a tokenizer every level's token count is approximate: one finding per level, folded in the verdict
    _runbook("run", "--only", "benchmark", "--out", str(root / "bench"), "--param", f"url={llama.url}",
             "--param", "concurrency=1,2,4", "--param", "requests=6", "--param", "output_len=16")
    return {"60_tune": root / "tune" / "latest" / "60_tune.html", "40_benchmark": root / "bench" / "latest" / "40_benchmark.html"}


@pytest.mark.parametrize("name", ["60_tune", "40_benchmark"])
def test_archived_report_reads_as_a_report(archived, browser, tmp_path, name):
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(archived[name].as_uri())
    page.wait_for_selector(".jp-Notebook", timeout=30_000)
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    sections = page.evaluate(_SECTIONS)
    verdict = sections["Verdict"]
    assert verdict["stderr"] == 0, f"{name}: stderr shown in the verdict (screenshot {tmp_path})"
    assert sum(s["stderr"] for s in sections.values()) == 0     # anywhere: it is in the collapsed log at the end
    if name == "60_tune":                                        # its progress lines went there
        log = page.locator("details#rb-log")
        assert log.count() == 1 and not log.evaluate("e => e.open") and "tune: " in log.text_content()

    # one row per finding kind and status: a per-level or per-candidate family is not repeated
    assert verdict["rows"], f"{name}: no findings table in the verdict"
    kinds = []
    for fid, status, title in verdict["rows"]:
        item = title.partition(": ")[0]
        family = fid.split(" (")[0]
        kinds.append((family[: -len(item) - 1] if family.endswith("." + item) else family, status))
    assert len(kinds) == len(set(kinds)), f"{name}: a finding kind repeated in the verdict: {kinds}"
    # folded: a family's items in one row (a fail/warn row's id, or the id a pass/skip/info line names)
    assert any(" (" in fid or " (" in title for fid, _, title in verdict["rows"]), f"{name}: nothing folded: {verdict['rows']}"

    tables = page.evaluate(_TABLES)
    assert len(tables) >= 3
    for t in tables:
        assert not [c for c in t["cells"] if MISSING.search(c)], f"{name}: a missing value shown raw in {t['head']!r}"
        assert not [c for c in t["cells"] if LONG_DECIMALS.search(c)], f"{name}: a figure beyond its precision in {t['head']!r}"
        assert t["right"] <= t["page"] and t["scroll"] <= 1, f"{name}: table {t['head']!r} wider than the page: {t}"
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH     # the page itself does not scroll sideways
    page.close()
