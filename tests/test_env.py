import json
import subprocess
import sys

import pytest
from conftest import DEFAULT_SPEC
from fake_nvml import GIB, FakeNVML

from runbook.core import spec
from runbook.core.registry import document
from runbook.env import check as env
from runbook.env import gpus


@pytest.fixture
def dep():
    return spec.load(DEFAULT_SPEC)


def _by_id(findings):
    return {f.id: f for f in findings}


def test_blackwell_host_with_leftover_process_and_ecc_off(dep):
    nvml = FakeNVML(ecc=False, procs={0: {4242: int(70 * GIB)}, 3: {4242: int(70 * GIB)}})
    rep = gpus.check(dep, nvml)
    f = _by_id(rep.findings)
    assert f["env.gpu.driver"].status == "pass" and "580.95.05" in f["env.gpu.driver"].title and "CUDA 13.0" in f["env.gpu.driver"].title
    assert f["env.gpu.count"].status == "pass"
    assert f["env.gpu.compute_capability"].status == "pass" and "sm_120" in f["env.gpu.compute_capability"].title
    assert f["env.gpu.ecc"].status == "warn" and "GPU 0, 1, 2, 3, 4, 5, 6, 7" in f["env.gpu.ecc"].title
    assert f["env.gpu.processes"].status == "warn"
    assert "140.0 GiB" in f["env.gpu.processes"].title and "kill 4242" in f["env.gpu.processes"].remedy
    assert "pid 4242 on GPU 0: 70.0 GiB" in f["env.gpu.processes"].evidence
    assert f["env.gpu.p2p"].status == "pass" and "28 GPU pairs" in f["env.gpu.p2p"].title
    assert "env.gpu.model" not in f and "env.gpu.memory" not in f and "env.gpu.mig" not in f
    assert len(rep.gpus) == 8 and rep.gpus[0]["compute_capability"] == "12.0" and rep.gpus[0]["processes"] == 1
    assert rep.gpus[0]["memory_free_gib"] == pytest.approx(25.6, abs=0.01)
    assert {t["link"] for t in rep.topology} == {"host bridge (PHB)", "across sockets (SYS)"}
    assert nvml.shutdown_called


def test_wrong_host_findings(dep):
    nvml = FakeNVML(n=4, name="NVIDIA H100 80GB HBM3", total_gib=79.6, cc=(9, 0), persistence=False, mig=True,
                    p2p_ok=False, temp=91)
    f = _by_id(gpus.check(dep, nvml).findings)
    assert f["env.gpu.count"].status == "fail" and "4 GPUs visible, spec expects 8" in f["env.gpu.count"].title
    assert f["env.gpu.model"].status == "warn"
    assert f["env.gpu.memory"].status == "warn"
    assert f["env.gpu.compute_capability"].status == "warn" and "9.0" in f["env.gpu.compute_capability"].title
    assert f["env.gpu.persistence"].status == "warn"
    assert f["env.gpu.mig"].status == "fail"
    assert f["env.gpu.temperature"].status == "warn"
    assert f["env.gpu.p2p"].status == "warn" and "6 GPU pair" in f["env.gpu.p2p"].title
    assert f["env.gpu.processes"].status == "pass"


def test_ecc_not_supported_is_info(dep):
    f = _by_id(gpus.check(dep, FakeNVML(ecc=None)).findings)
    assert f["env.gpu.ecc"].status == "info"


def test_no_driver_is_skip_unless_required(dep):
    rep = gpus.check(dep, FakeNVML(no_driver=True))
    assert [(f.id, f.status) for f in rep.findings] == [("env.gpu.driver", "skip")]
    assert rep.findings[0].title == "no NVIDIA driver: NVML Shared Library Not Found"
    strict = dep.model_copy(update={"hardware": dep.hardware.model_copy(update={"require_gpus": True})})
    assert gpus.check(strict, FakeNVML(no_driver=True)).findings[0].status == "fail"


def test_a_spec_s_require_gpus_is_turned_off_from_the_cli_and_the_notebook(dep):
    """hardware.require_gpus: true, checked once on a machine without a driver: --no-require-gpus and the
    notebook's require_gpus=False make it a skip; no flag and the parameter's None keep the spec's true."""
    from runbook import cli
    from runbook.env.stage import resolved
    from runbook.runner import notebook

    strict = dep.model_copy(update={"hardware": dep.hardware.model_copy(update={"require_gpus": True})})

    def flags(*argv):
        return cli._options("env", cli.build_parser().parse_args(["env", *argv]))

    def status(spec_, options):
        return gpus.check(resolved(spec_, options), FakeNVML(no_driver=True)).findings[0].status

    assert status(strict, flags()) == status(strict, notebook.options("environment", require_gpus=None)) == "fail"
    assert status(strict, flags("--no-require-gpus")) == "skip"
    assert status(strict, notebook.options("environment", require_gpus=False)) == "skip"
    assert status(dep, flags("--require-gpus")) == status(dep, notebook.options("environment", require_gpus=True)) == "fail"
    assert resolved(strict, flags()) is strict and strict.hardware.require_gpus is True     # the spec itself unchanged


def test_real_nvml_on_this_machine_does_not_raise(dep):
    rep = gpus.check(dep)  # the real nvidia-ml-py; on a GPU-less machine: one skip finding
    assert rep.findings and all(f.status in ("pass", "warn", "fail", "skip", "info") for f in rep.findings)


def _fake_run(packages, python="3.12.3"):
    def run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"python": python, "executable": cmd[0], "packages": packages}), "")
    return run


def test_serving_env_versions_and_cuda_compat(dep, monkeypatch):
    monkeypatch.setattr(env.os.path, "isfile", lambda p: True)
    monkeypatch.setattr(env.os, "access", lambda p, m: True)
    pk = {"sglang": "0.5.23", "torch": "2.14.1+cu130", "flashinfer-python": "0.6.1", "sgl-kernel": "0.3.9",
          "sglang-kernel": None, "transformers": "5.19.0", "triton": "3.8.0"}
    f, info = env.serving_env(dep, run=_fake_run(pk))
    ids = _by_id(f)
    assert all(x.status == "pass" for x in f), [x for x in f if x.status != "pass"]
    assert ids["env.serving.sglang-kernel"].title == "sglang-kernel 0.3.9"  # found under its older name
    assert info["torch_cuda"] == "13.0"
    assert env.check_driver_vs_torch({"cuda_driver_version": "12.8"}, info)[0].status == "fail"
    assert env.check_driver_vs_torch({"cuda_driver_version": "13.0"}, info)[0].status == "pass"


def test_serving_env_missing_packages(dep, monkeypatch):
    monkeypatch.setattr(env.os.path, "isfile", lambda p: True)
    monkeypatch.setattr(env.os, "access", lambda p, m: True)
    f = _by_id(env.serving_env(dep, run=_fake_run({"sglang": None, "torch": "2.13.0+cpu"}))[0])
    assert f["env.serving.sglang"].status == "fail" and "pip install sglang" in f["env.serving.sglang"].remedy
    assert f["env.serving.flashinfer-python"].status == "warn"
    assert f["env.serving.torch_cuda"].status == "warn"


def test_serving_env_real_interpreter(dep):
    d = dep.model_copy(update={"serving": dep.serving.model_copy(update={"python": sys.executable})})
    f, info = env.serving_env(d)
    assert info["executable"] and _by_id(f)["env.serving.python"].status == "pass"
    assert _by_id(f)["env.serving.sglang"].status == "fail"  # the runbook's own venv has no sglang, by design


def test_missing_interpreter_is_a_fail_with_remedy(dep):
    f = env.serving_env(dep)[0]
    assert [(x.id, x.status) for x in f] == [("env.serving.python", "fail")]
    assert "/home/theuser/ml-env/bin/python" in f[0].title and "serving.python" in f[0].remedy


def test_risky_nccl_and_cuda_values(dep):
    risky = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": "BOGUS",
             "CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_HOME": "/nonexistent/cuda", "CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    d = dep.model_copy(update={"serving": dep.serving.model_copy(update={"env": risky})})
    f = _by_id(env.nccl_cuda_env(d))
    assert f["env.CUDA_LAUNCH_BLOCKING"].status == "fail"
    assert f["env.NCCL_P2P_DISABLE"].status == "warn"
    assert f["env.NCCL_DEBUG"].status == "warn"
    assert f["env.NCCL_P2P_LEVEL"].status == "fail"
    assert f["env.CUDA_VISIBLE_DEVICES"].status == "fail" and "needs 8" in f["env.CUDA_VISIBLE_DEVICES"].title
    assert f["env.CUDA_HOME"].status == "warn"
    assert f["env.CUDA_DEVICE_MAX_CONNECTIONS"].status == "info"
    clean = _by_id(env.nccl_cuda_env(dep))
    assert clean["env.nccl_cuda"].status == "pass" or clean.get("env.CUDA_HOME")


def test_host_findings_and_full_report(dep):
    rep = env.assess(dep, nvml=FakeNVML())
    ids = _by_id(rep.findings)
    assert {"env.host.shm", "env.host.memlock", "env.host.disk", "env.host.cpu_ram", "env.gpu.count", "env.serving.python"} <= set(ids)
    assert rep.host["cpus"] >= 1 and "model card" in rep.host["model_location"]
    assert json.loads(json.dumps(document(rep), default=str))["gpus"][0]["index"] == 0


def test_torch_cuda_parsing():
    assert env.torch_cuda("2.14.1+cu130") == "13.0"
    assert env.torch_cuda("2.9.1+cu128") == "12.8"
    assert env.torch_cuda("2.13.0+cpu") is None and env.torch_cuda("2.13.0") is None and env.torch_cuda(None) is None
