"""deploy/ansible/runbook.yml --tags units with a real ansible-playbook run over several inventory hosts (all local):
each host gets exactly the units the spec places on it — its replicas, its node rank, the gateway."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import DEFAULT_SPEC, REPO
from topology.specs import nodes_dep, topo

from runbook.core import spec

from .test_ansible import PLAYBOOK, _ansible_playbook

RECORDER = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/systemctl.log"
"""


def _spec_file(tmp: Path, d: spec.Deployment) -> Path:
    data = d.model_dump(mode="json")
    data["model"]["card"] = str((DEFAULT_SPEC.parent / data["model"]["card"]).resolve())
    f = tmp / f"{d.name}.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def _play(exe: str, tmp: Path, spec_file: Path, hosts: list[str]) -> tuple[subprocess.CompletedProcess, dict[str, Path]]:
    """The units tag over `hosts`, each with its own unit directory and a systemctl that records its calls."""
    dirs = {h: tmp / "hosts" / h for h in hosts}
    for d in dirs.values():
        d.mkdir(parents=True)
        (d / "systemctl").write_text(RECORDER)
        (d / "systemctl").chmod(0o755)
    # Every setting in the inventory as an operator writes it (`all: vars` and each host's own), no -e: the
    # playbook's defaults must not beat either (play vars would; its role defaults do not).
    common = {"runbook_dir": str(REPO), "runbook_venv": str(Path(sys.executable).parents[1]), "runbook_deployment": str(spec_file),
              "runbook_install_units": True, "ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv = {"all": {"vars": common, "hosts": {h: {"runbook_systemd_dir": str(dirs[h]), "runbook_systemctl": str(dirs[h] / "systemctl")}
                                             for h in hosts}}}
    inv_file = tmp / "inventory.yml"
    inv_file.write_text(yaml.safe_dump(inv))
    e = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
         "ANSIBLE_REMOTE_TEMP": str(tmp / "ansible-tmp")}
    cp = subprocess.run([exe, "-i", str(inv_file), str(PLAYBOOK), "--tags", "units"], capture_output=True, text=True,
                        timeout=600, env=e, cwd=tmp)
    return cp, dirs


def _installed(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("*.service"))


@pytest.mark.slow   # a real ansible-playbook run over four hosts
def test_each_host_gets_its_replicas_and_the_gateway_and_a_stray_host_is_named(tmp_path):
    exe = _ansible_playbook()
    d = topo()
    spec_file = _spec_file(tmp_path, d)
    cp, dirs = _play(exe, tmp_path, spec_file, ["gpu-01", "gpu-02", "gw-01", "stray-01"])
    out = cp.stdout + cp.stderr
    assert cp.returncode != 0 and "places no unit on stray-01" in out, out[-3000:]
    assert _installed(dirs["gpu-01"]) == ["sglang-qwen-r0.service", "sglang-qwen-r1.service"], out[-3000:]
    assert _installed(dirs["gpu-02"]) == ["sglang-qwen-r2.service"]
    assert _installed(dirs["gw-01"]) == ["sglang-qwen-gateway.service"]
    assert _installed(dirs["stray-01"]) == []
    # What was installed is what `service render` renders, byte for byte.
    from runbook.service.stage import all_units

    for u in all_units(spec.load(spec_file)):
        assert (dirs[u.host] / f"{u.unit_name}.service").read_text() == u.text
    log = (dirs["gpu-01"] / "systemctl.log").read_text().splitlines()
    assert log == ["daemon-reload", "enable sglang-qwen-r0.service", "enable sglang-qwen-r1.service",
                   "restart sglang-qwen-r0.service", "restart sglang-qwen-r1.service"]


@pytest.mark.slow   # a real ansible-playbook run over two hosts
def test_each_node_gets_its_own_rank_by_name_or_address(tmp_path):
    exe = _ansible_playbook()
    cp, dirs = _play(exe, tmp_path, _spec_file(tmp_path, nodes_dep()), ["a", "10.0.0.2"])
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    ranks = {}
    for h in ("a", "10.0.0.2"):
        (unit,) = dirs[h].glob("*.service")
        text = unit.read_text()
        ranks[h] = (unit.name, text.split("--node-rank ", 1)[1].split()[0])
    assert ranks == {"a": ("sglang-qwen-a.service", "0"), "10.0.0.2": ("sglang-qwen-b.service", "1")}
