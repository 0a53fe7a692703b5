"""`runbook tune --plan-only` on the default SGLang deployment: nothing launched; MTP and BF16/FP8 KV candidates
with SGLang's own figures (the differential oracle of tests/test_kv_vs_sglang.py, run on the same argv), and the
candidates SGLang refuses skipped with its own words."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from runbook import cli
from runbook.core import spec as spec_mod
from runbook.tune import stage as tune_stage

ORACLE = REPO / "tests" / "oracle"
SERVING_PY = os.environ.get("RUNBOOK_SERVING_PYTHON") or str(REPO / ".venv-serving" / "bin" / "python")
pytestmark = [pytest.mark.serving,
              pytest.mark.skipif(not Path(SERVING_PY).exists(), reason=f"no serving venv at {SERVING_PY} (make serving-env)")]
DEFAULT = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml"


def _oracle(cases: list[dict]) -> dict[str, dict]:
    proc = subprocess.run([SERVING_PY, str(ORACLE / "sglang_kv.py")], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=900, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    data = yaml.safe_load(DEFAULT.read_text())
    data["model"]["card"] = str(REPO / "models" / "qwen3.5-397b-a17b-nvfp4")     # the copy's folder is elsewhere
    data["tune"]["candidates"].update({
        "not-a-flag": {"flags": {"enable-warp-drive": True}},                 # SGLang's parser: no such flag
        "too-long": {"flags": {"context-length": 1048576}},                   # beyond the model's 262,144 positions
        "tiny-pool": {"flags": {"max-total-tokens": 65536}},                  # not one 128k request fits
        "canary": {"python": str(Path(SERVING_PY).absolute())},               # an upgrade canary: its own parser
        "canary-elsewhere": {"python": "/opt/sglang-next/bin/python"},        # not on this machine
    })
    path = tmp_path_factory.mktemp("spec") / "qwen-tune.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    os.environ.setdefault("RUNBOOK_SERVING_PYTHON", SERVING_PY)
    dep = spec_mod.load(path)
    rep = tune_stage.evaluate(dep, tune_stage.TuneOptions(plan_only=True, archive=str(tmp_path_factory.mktemp("arch"))))
    return dep, rep, path


def test_plan_only_launches_nothing_and_archives_nothing(plan):
    _, rep, _ = plan
    assert rep.plan_only and rep.run_dir is None and rep.recommendation is None
    assert all(r["status"] in ("planned", "skipped") for r in rep.rows)
    assert [r["name"] for r in rep.rows][:3] == ["reference", "mtp", "fp8-kv"]


def test_mtp_and_kv_dtype_candidates_carry_sglangs_own_figures(plan):
    sys.path.insert(0, str(ORACLE))
    import kv_cases

    rows = {r["name"]: r for r in plan[1].rows}
    dep, rep, _ = plan
    model = next(d for d in kv_cases.DEFAULT_MODEL_DIRS if (Path(d) / "config.json").is_file())
    w = int(dep.model.size_gib * kv_cases.GIB) // dep.parallelism.tp
    gpu = {"name": dep.hardware.gpu_model, "total_mib": int(dep.hardware.gpu_memory_gib * 1024),
           "sm": dep.hardware.compute_capability}                     # the spec's GPU, as the plan sees it
    fp8 = [("fp8_e4m3" if a == "bf16" else a) for a in kv_cases.DEFAULT_FLAGS]
    argvs = {"reference": kv_cases.DEFAULT_FLAGS, "mtp": kv_cases.DEFAULT_FLAGS + kv_cases.SPEC, "fp8-kv": fp8}
    want = _oracle([{**kv_cases._case(n, model, a, "RTX6000", w), "gpu": gpu} for n, a in argvs.items()])
    for name in ("reference", "mtp", "fp8-kv"):
        assert rows[name]["precheck"] == "ok", rows[name]["reason"]
        pred, sg = rows[name]["predicted"], want[name]
        assert not sg.get("refused"), sg
        assert pred["max_total_num_tokens"] == sg["max_total_num_tokens"], name
        assert pred["max_running_requests"] == sg["max_running_requests"], name
    assert rows["mtp"]["predicted"]["speculative"] and rows["mtp"]["predicted"]["max_running_requests"] < \
        rows["reference"]["predicted"]["max_running_requests"]
    assert rows["fp8-kv"]["predicted"]["kv_dtype"].startswith("fp8") and rows["reference"]["predicted"]["kv_dtype"] == "bfloat16"


def test_candidates_sglang_refuses_are_skipped_with_its_reason(plan):
    _, rep, _ = plan
    rows = {r["name"]: r for r in rep.rows}
    assert rows["not-a-flag"]["status"] == "skipped" and "--enable-warp-drive" in rows["not-a-flag"]["reason"]
    assert "not a flag of SGLang 0.5.23" in rows["not-a-flag"]["reason"]
    assert rows["too-long"]["status"] == "skipped" and "refuse" in rows["too-long"]["reason"]
    assert rows["tiny-pool"]["status"] == "skipped" and "not even one request" in rows["tiny-pool"]["reason"]
    for r in rows.values():
        assert "\n" not in r["reason"]
    assert rows["canary"]["status"] == "planned" and rows["canary"]["python"].endswith("python")
    assert any(d["id"] == "service.parser" and "SGLang 0.5.23" in d["title"] for d in rows["canary"]["precheck_details"])
    assert rows["canary-elsewhere"]["status"] == "skipped" and "not on this machine" in rows["canary-elsewhere"]["reason"]
    skipped = [f for f in rep.findings if f.id == "tune.skipped"]
    assert {f.title.split(":")[0] for f in skipped} == {"not-a-flag", "too-long", "tiny-pool", "canary-elsewhere"}


def test_the_cli_prints_the_table(plan, capsys):
    _, _, path = plan
    code = cli.main(["tune", "--deployment", str(path), "--plan-only", "--candidates", "fp8-kv"])
    out = capsys.readouterr().out
    assert code == 0 and "tokens predicted" in out and "fp8-kv" in out and "mtp" not in out
    assert "plan only: nothing was launched" in out


def test_oom_at_cuda_graph_capture_fails_the_candidate_with_the_remedy(tmp_path, monkeypatch):
    """The start-up log read by stage 35 says why a launch died: OOM at graph capture → failed, with its remedy."""
    import contextlib

    from verify.sglang_formats import SRT
    from verify.test_verify import startup

    from runbook.tune import launch

    if SRT is None:
        pytest.skip("no .venv-serving with SGLang's sources (make serving-env)")

    @contextlib.contextmanager
    def dies(spec):               # the server wrote SGLang's own OOM lines, then exited
        spec.log_path.write_text("\n".join(startup(oom_at_capture=True)) + "\n")
        raise launch.LaunchFailed("exited", "the server exited with code 1 before it was ready", "…")
        yield

    monkeypatch.setattr(launch, "launched", dies)
    dep = spec_mod.load(DEFAULT)
    rep = tune_stage.evaluate(dep, tune_stage.TuneOptions(candidates=["fp8-kv"], archive=str(tmp_path)))
    rows = {r["name"]: r for r in rep.rows}
    for name in ("reference", "fp8-kv"):
        r = rows[name]
        assert r["status"] == "failed" and r["failure_kind"] == "exited"
        assert "out of memory while capturing CUDA graphs" in r["reason"] and "--mem-fraction-static" in r["reason"]
        assert "\n" not in r["reason"] and (tmp_path / "tune" / rep.run_id / "candidates" / f"{name}.json").is_file()
    assert [f.id for f in rep.findings if f.status == "fail"].count("tune.failed") == 2
    assert rep.recommendation is None
