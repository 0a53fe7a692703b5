"""A node's own environment and port (parallelism.nodes[].env, .port) land in that rank's unit only, as systemd reads
the unit back (Environment= lines, ExecStart), and bad values are one line naming the field."""
import shutil

import pytest
from conftest import DEFAULT_SPEC, spec_data

from runbook import service
from runbook.core import spec
from runbook.core.errors import SpecError
from runbook.service import unitfile

NODES = [{"name": "a", "address": "10.0.0.1", "env": {"SGLANG_CPU_OMP_THREADS_BIND": "0-3"}},
         {"name": "b", "address": "10.0.0.2", "port": 30123, "env": {"SGLANG_CPU_OMP_THREADS_BIND": "4-7", "NCCL_DEBUG": "WARN"}}]


def _dep(nodes, env=None):
    changes = {"parallelism.tp": 16, "parallelism.nodes": nodes}
    if env is not None:
        changes["serving.env"] = env
    return spec.from_dict(spec_data(**changes), str(DEFAULT_SPEC))


def test_each_rank_gets_its_own_environment_over_the_servers_and_its_own_port():
    d = _dep(NODES, env={"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1"})
    a, b = service.render(d)
    ea, eb = (unitfile.environment(unitfile.parse(u.text)) for u in (a, b))
    assert ea == {"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": "0-3"}
    assert eb == {"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": "4-7"}   # the rank's wins
    assert a.argv[a.argv.index("--port") + 1] == str(d.serving.port)
    assert b.argv[b.argv.index("--port") + 1] == "30123"


def test_without_node_env_or_port_the_units_are_as_before():
    plain = [{"name": n["name"], "address": n["address"]} for n in NODES]
    a, b = service.render(_dep(plain, env={"HF_HUB_OFFLINE": "1"}))
    for u in (a, b):
        assert unitfile.environment(unitfile.parse(u.text)) == {"HF_HUB_OFFLINE": "1"}
        assert u.argv[u.argv.index("--port") + 1] == "30000"


@pytest.mark.parametrize("env, msg", [
    ({"HF_TOKEN": "abcdefgh"}, "looks like a secret"),
    ({"1BAD": "x"}, "not a valid environment variable name"),
    ({"OK": True}, "quote the value"),
])
def test_bad_node_env_is_one_line_naming_the_field(env, msg):
    with pytest.raises(Exception) as e:
        _dep([{**NODES[0], "env": env}, NODES[1]])
    text = str(e.value)
    assert msg in text and "nodes" in text, text


def test_a_node_env_value_a_unit_line_cannot_carry_names_the_node():
    with pytest.raises(SpecError, match=r"remove it from parallelism\.nodes\[1\]\.env\.X$"):
        service.render(_dep([NODES[0], {**NODES[1], "env": {"X": "a\nb"}}]))


def test_rank_units_with_their_own_environment_pass_systemd_analyze():
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (.ci/run installs it)")
    for u in service.render(_dep(NODES)):
        bad = [x for x in service.verify_unit(u) if x.status in ("warn", "fail")]
        assert bad == [], bad
