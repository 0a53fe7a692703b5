"""Telemetry during benchmark levels: fake NVML and a scripted /metrics whose values change over time."""
import json
import time
from types import SimpleNamespace

import pytest
from fake_nvml import GIB, FakeNVML

from bench.rawsse import Reply, completion_stream
from runbook.bench import run as bench
from runbook.bench import telemetry
from runbook.bench.settings import BenchSettings


class BusyNVML(FakeNVML):
    """FakeNVML plus the fields telemetry reads; utilisation rises with each call."""

    def __init__(self, **kw):
        super().__init__(n=2, procs={0: {1: int(40 * GIB)}, 1: {1: int(42 * GIB)}}, **kw)
        self.calls = 0

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls += 1
        return SimpleNamespace(gpu=50 + (self.calls % 2) * 40, memory=10)

    def nvmlDeviceGetPowerUsage(self, h):
        return 300_000


class Metrics:
    """SGLang-style gauges that change with time: queue grows, token usage climbs."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self):
        dt = time.perf_counter() - self.t0
        return ("# TYPE sglang:token_usage gauge\n"
                f'sglang:token_usage{{model_name="m",tp_rank="0"}} {min(0.9, 0.1 + dt / 2):.3f}\n'
                "# TYPE sglang:num_queue_reqs gauge\n"
                f'sglang:num_queue_reqs{{model_name="m"}} {int(dt * 4)}\n'
                "# TYPE sglang:num_running_reqs gauge\n"
                'sglang:num_running_reqs{model_name="m"} 4\n')




@pytest.mark.slow  # real-clock levels sampled for telemetry
def test_levels_carry_telemetry(raw, tmp_path):
    srv = raw(lambda b: Reply(completion_stream(4, 0.3, 0.05)), metrics=Metrics())
    o = BenchSettings(url=srv.url, concurrency=[2], requests=8, workload="code", output_len=4, warmup=0,
                           out=tmp_path, telemetry_interval_s=0.2, nvml=BusyNVML())
    res = bench.run(o)
    t = res.summary["levels"][0]["telemetry"]
    assert t["samples"] >= 3
    assert t["gpu_util_pct"]["mean"] == pytest.approx(70, abs=20) and t["gpu_mem_used_gib"]["max"] == pytest.approx(42, abs=0.01)
    assert 0.1 < t["kv_token_usage"]["max"] <= 0.9 and t["num_queue_reqs"]["max"] >= 1 and t["queued"] is True
    assert t["power_w"]["max"] == 300 and t["num_running_reqs"]["max"] == 4
    json.dumps(res.summary, allow_nan=False)
    lines = [json.loads(x) for x in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    assert len(lines) == t["samples"] and all(x["level"] == "c2" for x in lines) and "gpus" in lines[0]
    assert any(f.id == "bench.telemetry.c2" for f in res.findings)


def test_no_driver_and_no_metrics_are_skipped_cleanly(raw):
    srv = raw(lambda b: Reply(completion_stream(4, 0.01, 0.005)))         # no /metrics (404)
    o = BenchSettings(url=srv.url, concurrency=[1], requests=2, workload="code", output_len=4, warmup=0,
                           telemetry_interval_s=0.2, nvml=FakeNVML(no_driver=True))
    res = bench.run(o)
    t = res.summary["levels"][0]["telemetry"]
    assert set(t["skipped"]) == {"gpu", "server"} and t["gpu_util_pct"]["mean"] is None and t["kv_token_usage"]["max"] is None
    assert [f.status for f in res.findings if f.id == "bench.telemetry"] == ["skip"]
    assert all(r.ok for r in res.levels[0].records)


def test_pick_gauges_takes_the_max_over_ranks():
    g = telemetry.pick_gauges({"sglang:token_usage{tp_rank=0}": 0.2, "sglang:token_usage{tp_rank=1}": 0.4,
                               "sglang:num_queue_reqs": 3.0, "other": 1.0})
    assert g == {"kv_token_usage": 0.4, "num_queue_reqs": 3.0}


def test_plot_telemetry_renders_from_synthetic_samples(tmp_path):
    from runbook.bench import plot_telemetry
    from runbook.core.plots import png

    samples = []
    for k in range(12):
        level = "c1" if k < 6 else "c4"
        samples.append({"t": 100.0 + k, "level": level,
                        "gpus": [{"gpu": i, "gpu_util_pct": 40.0 + 5 * k, "gpu_mem_used_gib": 70.0 + i} for i in range(2)],
                        "server": {"kv_token_usage": 0.05 * k, "num_queue_reqs": max(0, k - 6)}})
    path = tmp_path / "telemetry.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    from types import SimpleNamespace
    result = SimpleNamespace(levels=[SimpleNamespace(telemetry={"samples": samples[:6]}), SimpleNamespace(telemetry=None),
                                     SimpleNamespace(telemetry={"samples": samples[6:]})])   # what notebook 40 passes
    for src in (samples, path, str(path), result):
        fig = plot_telemetry(src)
        ax_gpu, ax_srv = fig.axes[:2]
        assert len(ax_gpu.lines) == 2 + 2 and len(ax_srv.lines) == 1 + 2   # per-GPU util, two level boundaries / KV
        assert [ln.get_xdata()[0] for ln in ax_gpu.lines[-2:]] == [0.0, 6.0]   # boundaries where the level changes
        assert [t.get_text() for t in ax_gpu.texts] == ["c1", "c4"]
        assert png(fig)[:4] == b"\x89PNG"
    empty = plot_telemetry([])
    assert "no NVML samples" in empty.axes[0].get_title() and png(empty)[:4] == b"\x89PNG"
