"""deploy/ansible/runbook.yml with `-i localhost, -c local` against a temporary checkout: the run lands in the store."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PLAYBOOK = REPO / "deploy" / "ansible" / "runbook.yml"
URL = "s3://fleet-bkt/ansible"


def _ansible_playbook() -> str:
    local = Path(sys.executable).with_name("ansible-playbook")
    exe = str(local) if local.is_file() else shutil.which("ansible-playbook")
    if not exe:
        pytest.skip("ansible-playbook not installed (ansible-core is in requirements-dev.txt: `make test` installs it)")
    if not shutil.which("git"):
        pytest.skip("git not installed: the playbook checks the project out with it")
    return exe


def _head(src: Path) -> str:
    """The clone's HEAD commit, read from .git (no git command needed)."""
    head = (src / ".git" / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        return head
    ref = head[5:]
    p = src / ".git" / ref
    if p.is_file():
        return p.read_text().strip()
    for line in (src / ".git" / "packed-refs").read_text().splitlines():
        if line.endswith(" " + ref):
            return line.split()[0]
    return "HEAD"


def _play(exe: str, tmp: Path, tags: str, extra: dict, env: dict) -> subprocess.CompletedProcess:
    vars_file = tmp / f"vars-{tags.replace(',', '-')}.json"
    vars_file.write_text(json.dumps(extra))
    e = {**os.environ, **env, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
         "ANSIBLE_REMOTE_TEMP": str(tmp / "ansible-tmp"), "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    e.pop("RUNBOOK_ARCHIVE_URL", None)
    return subprocess.run([exe, "-i", "localhost,", "-c", "local", str(PLAYBOOK), "--tags", tags, "-e", f"@{vars_file}"],
                          capture_output=True, text=True, timeout=900, env=e, cwd=tmp)


def test_playbook_checks_out_runs_and_the_archive_lands_in_the_store(s3, tmp_path):
    exe = _ansible_playbook()
    src, checkout, units = tmp_path / "src", tmp_path / "checkout", tmp_path / "units"
    subprocess.run(["git", "clone", "-q", str(REPO), str(src)], check=True, timeout=300, capture_output=True)
    units.mkdir()
    common = {"runbook_repo": str(src), "runbook_version": _head(src), "runbook_dir": str(checkout),
              "runbook_venv": str(Path(sys.executable).parents[1]), "runbook_setup_venv": False,
              "runbook_archive_url": URL, "runbook_environment": s3.env, "runbook_only": "environment",
              "runbook_systemd_dir": str(units), "runbook_systemctl": "/bin/true"}
    cp = _play(exe, tmp_path, "checkout", common, {})
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    assert (checkout / "Makefile").is_file() and (checkout / ".git").is_dir()
    # The code under test is this working tree's (it may not be committed yet): lay it over the checkout.
    for d in ("lib", "notebooks", "deployments"):
        shutil.copytree(REPO / d, checkout / d, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cp = _play(exe, tmp_path, "run,timer", dict(common, runbook_timer=True, runbook_run_now=True), {})
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]
    runs = [d for d in (checkout / "outputs").iterdir() if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")]
    assert len(runs) == 1, runs
    run_id = runs[0].name
    s = json.loads((runs[0] / "summary.json").read_text())
    assert s["host"] == "localhost" and s["archive"]["status"] == "pass", s.get("archive")
    assert [n["name"] for n in s["notebooks"]] == ["00_environment"]
    fs = s3.fs()
    assert fs.exists(f"fleet-bkt/ansible/localhost/{run_id}/_COMPLETE")
    stored = json.loads(fs.cat_file(f"fleet-bkt/ansible/localhost/{run_id}/summary.json"))
    assert stored["run_id"] == run_id and stored["deployment_file"].startswith(str(checkout))
    # the timer's units, rendered (systemctl stubbed): credentials only in the 0600 environment file
    service = (units / "sglang-runbook.service").read_text()
    assert f"WorkingDirectory={checkout}" in service and "-m runbook run --deployment" in service and "--only environment" in service
    assert "AWS_SECRET_ACCESS_KEY" not in service
    env_file = units / "sglang-runbook.env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600" and f"RUNBOOK_ARCHIVE_URL={URL}" in env_file.read_text()
    assert "OnCalendar=*-*-* 06:15:00" in (units / "sglang-runbook.timer").read_text()
