"""`runbook service install` on a topology: each host installs the units the spec places on it, under their own
names, waiting on their own ports; a host the spec places nothing on is refused in one line."""
import pytest

from runbook.core.errors import InputError
from runbook.service.install import install, local_units, unit_path, unit_ready_url

from .specs import loopback


def test_a_host_installs_the_units_placed_on_it_under_their_own_names(tmp_path):
    d = loopback([30001, 30002], 30003)           # both replicas and the gateway on 127.0.0.1
    units = local_units(d, here={"127.0.0.1"})
    assert [u.unit_name for u in units] == [f"{d.systemd.unit_name}-r0", f"{d.systemd.unit_name}-r1",
                                            f"{d.systemd.unit_name}-gateway"]
    assert [unit_path(d, u).name for u in units] == [f"{u.unit_name}.service" for u in units]
    assert [unit_ready_url(d, u) for u in units] == ["http://127.0.0.1:30001" + d.systemd.ready_path,
                                                     "http://127.0.0.1:30002" + d.systemd.ready_path,
                                                     "http://127.0.0.1:30003/health"]
    res = install(d, units[1], dry_run=True, root=tmp_path)
    assert not [f for f in res.findings if f.status == "fail"]
    assert any(f"{d.systemd.unit_name}-r1.service" in str(s) for s in res.steps)


def test_a_host_the_spec_places_nothing_on_is_refused():
    d = loopback([30001, 30002], 30003)
    with pytest.raises(InputError, match=r"^service: this host \(.*\) runs none of the spec's 3 units"):
        local_units(d, here={"gpu-99.example.com"})


def test_one_unit_options_with_several_units_here_are_refused():
    d = loopback([30001, 30002], 30003)
    with pytest.raises(InputError, match=r"installed_unit and ready_url name one unit"):
        local_units(d, one=True, here={"127.0.0.1"})
