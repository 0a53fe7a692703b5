"""What a person sees: JupyterLab in headless Chromium (Debian's /usr/bin/chromium driven by Playwright,
no browser download), and the archived run opened from outputs/index.html. Screenshots are saved in the
test's temp dir."""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import warnings

import pytest
from conftest import REPO

from .conftest import CHROMIUM

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed (.ci/run installs it)")]


# The panel's first table (the selected configuration) once it differs from `b` and both tables are drawn.
_CHANGED = ("(b) => { const t = document.querySelectorAll('.widget-vbox .jp-OutputArea table'); "
            "return t.length >= 2 && t[0].innerText !== b; }")


def _up(url: str, token: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Our own JupyterLab on a free loopback port, over a copy of the project (autosave cannot touch the repo)."""
    root = tmp_path_factory.mktemp("lab")
    import matplotlib.font_manager  # noqa: F401  (a fresh machine builds the font cache here, not in the kernel's first plot)
    for d in ("notebooks", "deployments", "models"):
        shutil.copytree(REPO / d, root / d)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "runbook-test-token"
    # No news or update prompts: they cover part of the page and would reach for the network.
    settings = root / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(root / ".jupyter"), JUPYTER_RUNTIME_DIR=str(root / ".runtime"))
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root / 'notebooks'}",
           f"--LabApp.workspaces_dir={root / '.workspaces'}", "--ServerApp.disable_check_xsrf=True", "--allow-root"]
    with open(root / "lab.log", "w") as log:   # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    if proc.poll() is not None or not _up(url, token):
        proc.kill()
        pytest.fail("JupyterLab did not start: " + (root / "lab.log").read_text()[-2000:])
    yield url, token, root
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def _choose(page, panel, label: str, value: str, before: str) -> str:
    """Pick `value` in the panel's `label` dropdown; wait for the recomputed table and return its text."""
    panel.locator(".widget-dropdown", has_text=label).locator("select").select_option(value)
    page.wait_for_function(_CHANGED, arg=before, timeout=60_000)
    return panel.locator("table").first.inner_text()


_STARTED = "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].some(e => /\\[(\\*|\\d+)\\]/.test(e.innerText))"


def _diagnose(page, root, shot) -> str:
    """What the page shows when a step times out: kernel, prompts, dialogs, errors, the server's log."""
    try:
        page.screenshot(path=str(shot))
        js = ("() => ({kernel: document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status,"
              " name: document.querySelector('.jp-KernelName')?.innerText,"
              " prompts: [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.innerText).join(' '),"
              " dialogs: [...document.querySelectorAll('.jp-Dialog, .Toastify__toast')].map(e => e.innerText).join(' | '),"
              " errors: [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type*=\"stderr\"], "
              ".jp-RenderedText[data-mime-type*=\"error\"]')]"
              "   .map(e => e.innerText.slice(0, 600)).join(' | ')})")
        state = page.evaluate(js)
    except Exception as e:  # the page itself may be gone
        state = {"page": repr(e)}
    log = (root / "lab.log").read_text(errors="replace")[-1500:]
    return f"page state: {state}; screenshot: {shot}; lab.log tail: {log}"


def _expected_plot(root, tp: int, kv_dtype: str, frac: float) -> bytes:
    """The memory plot the panel should show for these inputs, rendered here by the same code."""
    from runbook.core import plots, spec
    from runbook.kv import plan as kvplan
    from runbook.kv import report as kvreport

    d = spec.load(root / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml")
    p = kvplan.assess(d, None, tp=tp, kv_dtype=kv_dtype, mem_fraction_static=frac, context_len=262144, contexts=(262144,))
    return plots.png(kvreport.plot_memory(p))


def _show(page, panel) -> None:
    """Once the kernel is idle and the panel's plot decoded, scroll the panel to the top of the view."""
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    img = panel.locator("img").first
    img.wait_for(timeout=60_000)
    page.wait_for_function("e => e.complete && e.naturalWidth > 100", arg=img.element_handle(), timeout=30_000)
    panel.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # painted


def _run_all(page, root, tmp_path) -> None:
    """Run > Run All Cells, as a person does; once more if the click landed before the notebook took focus."""
    for attempt in (1, 2):
        page.locator(".jp-Notebook .jp-Cell").first.click()       # the Run menu acts on the focused notebook
        page.get_by_role("menuitem", name="Run", exact=True).click(timeout=10_000)
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click(timeout=10_000)
        try:
            page.wait_for_function(_STARTED, timeout=30_000)
            return
        except Exception:
            state = _diagnose(page, root, tmp_path / f"run-all-{attempt}.png")
            if attempt == 2:
                pytest.fail("Run All Cells did not start the kernel: " + state)
            warnings.warn("the first Run All Cells click started nothing; clicking again. " + state, stacklevel=1)


def test_kv_notebook_widgets_recompute(lab, browser, tmp_path):
    url, token, root = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/lab/tree/20_kv_memory.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    _run_all(page, root, tmp_path)
    panel = page.locator(".widget-vbox").last
    try:
        panel.locator("table").first.wait_for(timeout=240_000)
    except Exception:
        pytest.fail("the widget panel did not render: " + _diagnose(page, root, tmp_path / "panel.png"))
    _show(page, panel)
    page.screenshot(path=str(tmp_path / "01-kv-notebook.png"), full_page=False)
    before = panel.locator("table").first.inner_text()
    img_before = panel.locator("img").first.get_attribute("src")
    assert "bfloat16" in before and "max_total_num_tokens" in before

    after_tp = _choose(page, panel, "TP", "4", before)
    assert after_tp != before
    _show(page, panel)
    page.screenshot(path=str(tmp_path / "02-tp4.png"))

    after_dtype = _choose(page, panel, "KV dtype", "fp8_e4m3", after_tp)
    assert after_dtype != after_tp and "fp8_e4m3" in after_dtype
    page.wait_for_timeout(500)
    src = panel.locator("img").first.get_attribute("src")
    assert src != img_before                                              # the memory plot was redrawn ...
    frac = float(panel.locator(".widget-slider .widget-readout").first.inner_text())
    assert base64.b64decode(src.split(",", 1)[1]) == _expected_plot(root, tp=4, kv_dtype="fp8_e4m3", frac=frac)  # ... whole
    _show(page, panel)
    page.screenshot(path=str(tmp_path / "03-fp8.png"))
    page.close()


@pytest.mark.notebook
def test_archived_run_renders(browser, tmp_path, cli):
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--only", "quant_config,kv_memory")
    fails = json.loads((out / "latest" / "summary.json").read_text())["findings"]["fail"]
    assert cp.returncode == (1 if fails else 0), cp.stderr
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto((out / "index.html").as_uri())
    assert page.locator("table tbody tr").count() == 1
    assert page.locator(".b.ok").count() >= 2          # status badges for the notebooks
    page.screenshot(path=str(tmp_path / "10-index.png"))
    page.click("text=20_kv_memory")
    page.wait_for_selector(".jp-Notebook", timeout=30_000)
    imgs = page.locator(".jp-OutputArea-output img")
    assert imgs.count() >= 3
    assert all(imgs.nth(i).evaluate("e => e.naturalWidth > 100") for i in range(imgs.count()))
    findings = page.locator("table", has_text="kv.layout")
    assert findings.count() >= 1 and "remedy" in findings.first.inner_text()
    code = page.locator(".jp-CodeCell .jp-Cell-inputWrapper").first
    assert not code.is_visible()                        # code hidden by default ...
    page.click("#rb-toggle")
    assert code.is_visible()                            # ... with a way to show it
    page.screenshot(path=str(tmp_path / "11-kv-html.png"), full_page=True)
    page.goto((out / "latest" / "summary.html").as_uri())
    assert page.locator("h1").inner_text().startswith("Run ")
    page.close()
