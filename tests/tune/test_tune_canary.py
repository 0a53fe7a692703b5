"""tune's SGLang upgrade canary on CPU: two SGLang versions side by side (`make serving-canary` builds 0.5.20 beside
.venv-serving's 0.5.23, sharing its packages). The deployment runs 0.5.20; the candidate `upgrade` is the same flags
on 0.5.23's interpreter: each pre-checked by its own version's parser (a flag 0.5.23 removed is skipped by 0.5.23's
parser, nothing launched), both launched for real, their versions read from the servers themselves, and the guard's
A/B naming the difference it tested: the SGLang version, 0.5.20 → 0.5.23. Two SGLang starts (25-55 s each here)."""
import json
import subprocess

import pytest

from runbook.core import SGLANG_VERSION as NEW
from runbook.core import spec as spec_mod
from runbook.core.ports import free_port
from runbook.demo.sglang import CANARY_SGLANG_VERSION as OLD
from runbook.tune import stage as tune_stage

pytestmark = pytest.mark.sglang

START_S = 240     # one SGLang start on 2 busy cores: 25-55 s measured, with room


def test_upgrade_canary_between_two_sglang_versions(tmp_path, fake_systemd):
    from runbook.core import oscalls
    from runbook.demo import sglang as demo
    from runbook.demo.tune import write_sglang_spec

    old_py, new_py = demo.canary_python(), demo.deployment().serving.python
    assert old_py.is_file(), f"{old_py} is missing: build it with `{demo.CANARY_MAKE_TARGET}`"
    said = subprocess.run([str(old_py), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                          capture_output=True, text=True, timeout=60)
    assert said.stdout.strip() == OLD, said.stderr       # its own sglang shadows the shared 0.5.23

    candidates = {
        "upgrade": {"python": new_py, "description": f"the same flags on SGLang {NEW}"},
        # removed in 0.5.23 (0.5.20 has it): the new version's parser must say so, not the deployment's
        "upgrade-old-flag": {"python": new_py, "flags": {"keep-mm-feature-on-device": True}},
    }
    port = free_port()
    path = write_sglang_spec(tmp_path / "canary.yaml", port, candidates=candidates, python=str(old_py),
                             reference_runs=1,        # the versions' A/B is the subject, not speed: no third start
                             guard={"identity_prompts": 4, "identity_max_tokens": 24, "min_identical_tokens": 8,
                                    "recall_lengths": [512], "toolcall": False})
    dep = spec_mod.load(path)
    settings = tune_stage.TuneSettings.resolve(dep, tune_stage.TuneOptions(yes=True, archive=str(tmp_path / "arch")))
    rep = tune_stage.assess(dep, settings,
                              systemctl=fake_systemd.systemctl)
    rows = {r["name"]: r for r in rep.rows}

    # each candidate's flags through its own SGLang's parser
    parser = {n: next(d["title"] for d in rows[n]["precheck_details"] if d["id"] == "service.parser")
              for n in ("reference", "upgrade")}
    assert parser["reference"].startswith(f"SGLang {OLD}'s own parser accepts")
    assert parser["upgrade"].startswith(f"SGLang {NEW}'s own parser accepts")
    skipped = rows["upgrade-old-flag"]
    assert skipped["status"] == "skipped" and f"--keep-mm-feature-on-device: not a flag of SGLang {NEW}" in skipped["reason"]
    assert "ready_s" not in skipped

    # both launched for real; each record names its SGLang, as the server itself reports it, and its start-up time
    for name, version in (("reference", OLD), ("upgrade", NEW)):
        r = rows[name]
        assert r["status"] == "done", (name, r.get("reason"))
        assert r["sglang_version"] == r["server_info"]["version"] == version
        assert 1 < r["ready_s"] < START_S and r["bench"]["output_tok_s"] > 0
        assert 0 < r["teardown_s"] < 10      # SIGINT: SGLang stops its own children at once, no 5 s drain tick
        assert oscalls.port_free("127.0.0.1", port)

    # the A/B: the guard compares the two versions and names that difference, with both sides' versions
    g = rows["upgrade"]["guard"]
    assert g["versions"] == {"reference": OLD, "candidate": NEW}
    assert g["tested"] == f"SGLang version {OLD} → {NEW}"
    assert [d["flag"] for d in g["differences"]] == ["version"]
    assert g["status"] in ("pass", "fail") and any(c["probe"] == "identity" for c in g["checks"])
    found = [f for f in rep.findings if f.id in ("tune.ran", "tune.guard") and f.title.startswith("upgrade:")]
    assert found and f"SGLang version {OLD} → {NEW}" in found[0].detail
    if g["status"] == "fail":
        assert "between SGLang versions" in found[0].remedy
    print(json.dumps({n: {k: rows[n].get(k) for k in ("sglang_version", "ready_s", "teardown_s", "precheck_s")}
                      for n in ("reference", "upgrade")}), f"guard: {g['status']}; {g['tested']}")
