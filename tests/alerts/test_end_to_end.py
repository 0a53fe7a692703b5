"""The whole path with the real programs: `runbook run` writes the textfile, Debian's prometheus-node-exporter
serves it, a real Prometheus scrapes it (every second) and evaluates the rules; the test reads the series and the
fired alert back through Prometheus' HTTP API. A run killed mid-way leaves the previous textfile as it was, and a
planted secret reaches no metric, label, rule or alert."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from conftest import REPO, spec_data

from runbook.alerts import metrics, textfile
from runbook.demo import prometheus

from .conftest import SECRET, promtool, write_run

pytestmark = [pytest.mark.server, pytest.mark.notebook, pytest.mark.timeout(300)]
LINK = "https://runbooks.example.com/fleet"


def _until(what: str, probe, timeout: float = 60.0):
    try:
        return prometheus.until(what, probe, timeout)
    except TimeoutError as e:
        pytest.fail(str(e))


@pytest.fixture
def stack(tmp_path):
    try:
        s = prometheus.Stack(tmp_path)
    except prometheus.Missing as e:
        pytest.skip(str(e))
    yield s
    s.stop()


def _spec(tmp: Path) -> Path:
    """The default deployment with a serving interpreter that is not there (env.serving.python fails: the
    planted failing finding, its path holding the planted secret) and an API key variable holding the secret."""
    data = spec_data(**{"serving.python": f"/nonexistent/{SECRET}/bin/python", "serving.api_key_env": "RUNBOOK_E2E_API_KEY"})
    data["alerts"] = {"link_base": LINK, "interval_s": 3600}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(tmp: Path, stack: prometheus.Stack, **kw) -> subprocess.Popen:
    env = dict(os.environ, RUNBOOK_E2E_API_KEY=SECRET, HF_TOKEN=SECRET + "-hf")
    return subprocess.Popen([sys.executable, "-m", "runbook", "run", "--only", "environment", "--deployment", str(_spec(tmp)),
                             "--out", str(tmp / "out"), "--textfile-dir", str(stack.textfiles)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_a_run_reaches_prometheus_and_its_failed_check_fires(tmp_path, stack: prometheus.Stack):
    proc = _run(tmp_path, stack)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, out              # a failed check is a result, not an error
    prom = stack.textfiles / "runbook_qwen3.5-397b-a17b-nvfp4.prom"
    text = prom.read_text()
    assert promtool("check", "metrics", stdin=text).returncode == 0
    summary = json.loads((tmp_path / "out" / "latest" / "summary.json").read_text())

    got = _until("the run's series in Prometheus", lambda: stack.query("runbook_last_run_exit_code"))
    assert got[0]["metric"]["deployment"] == "qwen3.5-397b-a17b-nvfp4" and got[0]["value"][1] == "1"
    assert got[0]["metric"]["instance"] == f"127.0.0.1:{stack.node_port}"
    failed = stack.query('runbook_finding{status="fail"}')
    assert {r["metric"]["id"] for r in failed} >= {"env.serving.python"}
    assert stack.query('runbook_findings{stage="environment",status="fail"}')[0]["value"][1] == "1"

    def fired():
        alerts = stack.get("alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "RunbookCheckFailed" and a["state"] == "firing"]
    alert = _until("RunbookCheckFailed firing", fired)[0]
    assert alert["labels"]["stage"] == "environment" and alert["labels"]["severity"] == "page"
    assert "env.serving.python" in alert["annotations"]["description"]
    assert alert["annotations"]["runbook_url"] == f"{LINK}/{summary['host']}/{summary['run_id']}/summary.html"
    print(json.dumps(alert, indent=1))           # the closing note's fired alert (pytest -s)

    # a stage verb's report next to the run's file: its own series (source="verb"), node_exporter still reads both
    env = dict(os.environ, RUNBOOK_E2E_API_KEY=SECRET, RUNBOOK_TEXTFILE_DIR=str(stack.textfiles))
    verb = subprocess.run([sys.executable, "-m", "runbook", "env", "--deployment", str(tmp_path / "spec.yaml"), "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert verb.returncode == 1 and json.loads(verb.stdout)["findings"], verb.stderr
    got = _until("the verb's series", lambda: stack.query('runbook_findings{source="verb",stage="environment",status="fail"}'))
    assert got[0]["value"][1] == "1"
    assert stack.query("node_textfile_scrape_error")[0]["value"][1] == "0"
    assert {a["labels"]["source"] for a in _until("both alerts", lambda: len(fired()) == 2 and fired())} == {"run", "verb"}

    # the planted secret: in no metric, label, rule or alert Prometheus holds
    match = urllib.parse.quote('{__name__=~"runbook_.*"}')
    series = stack.get(f"series?match[]={match}")
    rules = stack.get("rules")
    verb_text = (stack.textfiles / "runbook_qwen3.5-397b-a17b-nvfp4.environment.prom").read_text()
    for doc in (text, verb_text, json.dumps(series), json.dumps(rules), json.dumps(stack.get("alerts"))):
        assert SECRET not in doc and urllib.parse.quote(SECRET) not in doc


def test_a_run_killed_mid_way_leaves_the_previous_textfile(tmp_path, stack):
    first = _run(tmp_path, stack)
    first.communicate(timeout=180)
    prom = stack.textfiles / "runbook_qwen3.5-397b-a17b-nvfp4.prom"
    before = prom.read_bytes()
    second = _run(tmp_path, stack, start_new_session=True)
    _until("the second run's notebook started", lambda: list((tmp_path / "out").glob(".inprogress-*/00_environment.log")), 60)
    os.kill(second.pid, signal.SIGKILL)
    second.communicate(timeout=30)
    assert second.returncode == -signal.SIGKILL
    assert prom.read_bytes() == before
    assert sorted(p.name for p in stack.textfiles.iterdir()) == [prom.name]     # no temp file, nothing half-written
    # and Prometheus still serves the first run's series
    got = _until("series after the kill", lambda: stack.query("runbook_last_run_info"))
    assert got[0]["metric"]["run_id"] in before.decode()


def test_silence_fires_with_the_real_programs(tmp_path, stack):
    """A run's textfile that node_exporter says is old, a file next to it it cannot parse, then the run's file gone:
    each fires its alert for the deployment (or the host), read back from the real Prometheus."""
    run = write_run(tmp_path / "out")
    m = metrics.collect(json.loads((run / "summary.json").read_text()), run, interval_s=60)
    prom = textfile.write(stack.textfiles, "d1", m.registry)

    def firing(name: str):
        return [a for a in stack.get("alerts")["data"]["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]

    _until("the run's series", lambda: stack.query('runbook_run_interval_seconds{deployment="d1"}'))
    assert not firing("RunbookTextfileStale") and not firing("RunbookTextfileMissing")
    os.utime(prom, (time.time() - 3600, time.time() - 3600))         # written an hour ago: twice 60 s long past
    stale = _until("RunbookTextfileStale firing", lambda: firing("RunbookTextfileStale"))[0]
    assert stale["labels"]["deployment"] == "d1" and stale["labels"]["file"].endswith("/runbook_d1.prom")

    (stack.textfiles / "other.prom").write_text("not_a_metric{{\n")
    _until("RunbookTextfileScrapeError firing", lambda: firing("RunbookTextfileScrapeError"))

    prom.unlink()
    gone = _until("RunbookTextfileMissing firing", lambda: firing("RunbookTextfileMissing"))[0]
    assert gone["labels"]["deployment"] == "d1" and gone["labels"]["instance"] == f"127.0.0.1:{stack.node_port}"
    assert not stack.query('runbook_run_interval_seconds{deployment="d1"}')     # nothing left to fire the other alerts
