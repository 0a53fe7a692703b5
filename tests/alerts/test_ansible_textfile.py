"""deploy/ansible/runbook.yml --tags textfile with `-i localhost, -c local`: the textfile directory and
node_exporter's --collector.textfile.directory on its ARGS line; a directory that is not a plain path is refused."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PLAYBOOK = REPO / "deploy" / "ansible" / "runbook.yml"


def _play(tmp: Path, **extra) -> subprocess.CompletedProcess:
    local = Path(sys.executable).with_name("ansible-playbook")
    exe = str(local) if local.is_file() else shutil.which("ansible-playbook")
    if not exe:
        pytest.skip("ansible-playbook not installed (ansible-core is in requirements-dev.txt)")
    (tmp / "vars.json").write_text(json.dumps({"runbook_systemctl": "/bin/true", **extra}))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp / "a-tmp"), "ANSIBLE_REMOTE_TEMP": str(tmp / "a-tmp"),
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    return subprocess.run([exe, "-i", "localhost,", "-c", "local", str(PLAYBOOK), "--tags", "textfile", "-e", f"@{tmp / 'vars.json'}"],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp)


def test_the_textfile_directory_and_node_exporters_flag(tmp_path):
    tf, defaults = tmp_path / "node-exporter", tmp_path / "prometheus-node-exporter"
    defaults.write_text('# Debian\nARGS=""\n')
    cp = _play(tmp_path, runbook_textfile_dir=str(tf), runbook_node_exporter_defaults=str(defaults),
               runbook_node_exporter_args="--collector.systemd")
    assert cp.returncode == 0, cp.stdout[-3000:]
    assert tf.is_dir() and oct(tf.stat().st_mode & 0o7777) == "0o755"
    assert defaults.read_text() == f'# Debian\nARGS="--collector.systemd --collector.textfile.directory={tf}"\n'
    assert "Restart node_exporter" in cp.stdout
    again = _play(tmp_path, runbook_textfile_dir=str(tf), runbook_node_exporter_defaults=str(defaults),
                  runbook_node_exporter_args="--collector.systemd")
    assert again.returncode == 0 and "changed=0" in again.stdout           # idempotent: no second restart


@pytest.mark.parametrize("bad", ["relative/dir", "/var/lib/a dir", '/x"; rm -rf /', "/x\n"])
def test_a_directory_that_is_not_a_plain_path_is_refused(tmp_path, bad):
    bad = bad.replace("/x", str(tmp_path / "x"), 1)     # were it made, it would be made here
    defaults = tmp_path / "defaults"
    cp = _play(tmp_path, runbook_textfile_dir=bad, runbook_node_exporter_defaults=str(defaults))
    assert cp.returncode != 0 and "give an absolute path" in cp.stdout
    assert not defaults.exists() and not (tmp_path / "x").exists() and not (tmp_path / "x\n").exists()
