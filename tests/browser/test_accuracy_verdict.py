"""The archived 50_accuracy an operator opens first, from a real run (the offline KV study on the default deployment),
looked at in headless Chromium: the verdict holds what needs action in full and one line each for the rest; the
study's own rows are in its section; no evidence cell runs over lines. Screenshots are saved in the test's temp dir."""
import os
import subprocess
import sys

import pytest
from conftest import REPO

from .conftest import CHROMIUM
from .test_archived_reports import _SECTIONS, WIDTH

pytestmark = [pytest.mark.browser, pytest.mark.notebook,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed (.ci/run installs it)")]

# Each findings table's rows: id, status and the evidence cell's text.
_EVIDENCE = """() => [...document.querySelectorAll('.jp-OutputArea-output table')].filter(t =>
  [...t.querySelectorAll('thead th')].map(th => th.innerText.trim()).join(',').startsWith('id,status,title,detail,evidence'))
  .map(t => [...t.querySelectorAll('tbody tr')].map(tr => {
    const td = [...tr.querySelectorAll('td')];
    return {id: td[0].innerText.trim(), status: td[1].innerText.trim(), evidence: td[4].innerText};
  }))"""


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    out = tmp_path_factory.mktemp("accuracy")
    cp = subprocess.run([sys.executable, "-m", "runbook", "run", "--only", "accuracy", "--out", str(out)],
                        capture_output=True, text=True, timeout=900, cwd=REPO)
    assert cp.returncode in (0, 1), cp.stdout[-2000:] + cp.stderr[-2000:]
    return out / "latest" / "50_accuracy.html"


def test_the_accuracy_verdict_reads_at_a_glance(archived, browser, tmp_path):
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(archived.as_uri())
    page.wait_for_selector(".jp-Notebook", timeout=30_000)
    page.screenshot(path=str(tmp_path / "50_accuracy.png"), full_page=True)
    sections = page.evaluate(_SECTIONS)
    verdict = sections["Verdict"]["rows"]
    statuses = [s for _, s, _ in verdict]
    # fail and warn in full first, then one line per other status: at most one row each for skip, pass, info
    assert statuses == sorted(statuses, key=["fail", "warn", "skip", "pass", "info"].index), verdict
    assert all(statuses.count(s) <= 1 for s in ("skip", "pass", "info")), verdict
    info = [r for r in verdict if r[1] == "info"]
    assert info and info[0][0].endswith(" info") and "accuracy.kvquant" in info[0][2]
    assert len(verdict) <= 8, f"a verdict of {len(verdict)} rows: {verdict}"
    # the study's rows in full in its own section
    study = next(v for k, v in sections.items() if k.startswith("1 · KV quantization"))["rows"]
    assert len(study) >= 5 and all(fid.startswith("accuracy.kvquant") for fid, _, _ in study)
    # evidence: one line in the verdict (the whole text is in the run's JSON)
    tables = page.evaluate(_EVIDENCE)
    assert tables and all("\n" not in r["evidence"].strip() and len(r["evidence"]) <= 200 for r in tables[0]), tables[0]
    page.close()
