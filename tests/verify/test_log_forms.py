"""Every SGLang log form since 0.4 -> the parser. The oracle is each release's own format strings: the committed
fixture holds the lines rendered from them (with version and file:line); the slow test re-renders them from the
wheels (fetched once into .cache/sglang-wheels) and checks the fixture is exactly what those releases log."""
from __future__ import annotations

import json
import subprocess

import pytest

from . import log_forms

FIXTURE = json.loads(log_forms.FIXTURE.read_text())
ROWS = FIXTURE["forms"]


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['kind']}:{r['from'][0]}" for r in ROWS])
def test_each_form_reads_right(row):
    assert log_forms.read(row["kind"], row["message"]) == log_forms.expect(row["kind"], row["message"]), row["from"]


def test_the_fixture_covers_every_version_and_the_issue_s_forms():
    """Each release in VERSIONS contributed lines, and the forms named in issue 29 are among them."""
    seen = {f.split()[0] for r in ROWS for f in r["from"]}
    assert seen == set(FIXTURE["versions"]) == set(log_forms.VERSIONS)
    msgs = {r["message"] for r in ROWS}
    assert "KV Cache is allocated. #tokens: 123456, K size: 1.50 GB, V size: 1.50 GB" in msgs        # no dtype: (0.4.6–0.5.12)
    assert "KV Cache is allocated. #tokens: 123456, KV size: 2.25 GB" in msgs                         # its MLA form
    assert "Using KV cache dtype: torch.float8_e4m3fn" in msgs                                         # 0.5.3–0.5.12
    assert any(m.startswith("Load weight end. type=") for m in msgs)                                   # no elapsed=
    assert "Capture cuda graph begin. This can take up to several minutes. avail mem=5.60 GB" in msgs  # 0.4.6–0.5.12
    assert "Capture cuda graph end. Time elapsed: 41.50 s. mem usage=1.20 GB. avail mem=4.40 GB." in msgs


def _fetch_or_skip(version):
    try:
        return log_forms.fetch(version)
    except (subprocess.SubprocessError, OSError) as e:
        err = getattr(e, "stderr", b"") or b""
        pytest.skip(f"sglang=={version} could not be fetched from the package index (offline?): "
                    f"{(err.decode(errors='replace').strip().splitlines() or [str(e)])[-1]}")


@pytest.mark.slow
def test_the_fixture_is_what_each_release_logs():
    """Re-render every form from each release's wheel: the fixture is exactly those lines, each read right."""
    rows = [r for v in log_forms.VERSIONS for r in log_forms.forms(_fetch_or_skip(v), v)]
    assert log_forms.fixture_rows(rows) == ROWS, "the fixture is stale: regenerate it (see tests/verify/log_forms.py)"
    for r in rows:
        assert log_forms.read(r["kind"], r["message"]) == log_forms.expect(r["kind"], r["message"]), (r["version"], r["source"])
