"""tune's parts without a server: the spec section (bad input as one line naming the key), candidates, the
llama-server pre-check's arithmetic and GGUF reader, buckets, the recommendation, the Pareto front, NVML energy,
llama-server's draft counters, and `runbook run` leaving tune out unless asked."""
import struct

import pytest
import yaml
from conftest import REPO

from runbook.core import registry
from runbook.core import spec as spec_mod
from runbook.core.errors import InputError, SpecError
from runbook.model import gguf
from runbook.tune import candidates, energy, measure, recommend, report
from runbook.tune.engines import llama

DEFAULT = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml"


def _spec(tune: dict, tmp_path=None) -> spec_mod.Deployment:
    data = yaml.safe_load(DEFAULT.read_text())
    data["tune"] = tune
    return spec_mod.from_dict(data, str(DEFAULT))


@pytest.mark.parametrize("tune, msg", [
    ({"candidates": {"x": {"flags": {"port": 1}}}}, "tune.candidates.x.flags.port: set it through serving.port"),
    ({"candidates": {"x": {"flags": {"context-length": "lots"}}}}, "tune.candidates.x.flags.context-length: must be a token"),
    ({"candidates": {"x": {"flags": {"--kv": "a"}}}}, "write flags without leading dashes"),
    ({"candidates": {"x y": {}}}, "a candidate name is letters"),
    ({"candidates": {"x": {"python": "python3"}}}, "must be an absolute path"),
    ({"grid": {"page-size": []}}, "a grid entry is a non-empty list"),
    ({"buckets": [32768, 8192]}, "buckets: must ascend"),
    ({"engine": "llama-server"}, "llama_server: engine llama-server needs the binary's path"),
    ({"budget_s": 0}, "tune.budget_s"),
    ({"engine": "vllm"}, "tune.engine"),
    ({"nonsense": 1}, "tune.nonsense: unknown key"),
    ({"reference_runs": 0}, "tune.reference_runs"),
    ({"confidence": 1.5}, "tune.confidence"),
])
def test_bad_tune_sections_are_one_line_naming_the_key(tune, msg):
    with pytest.raises(SpecError) as e:
        _spec(tune)
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_candidates_reference_first_grid_expanded_and_selected():
    dep = _spec({"candidates": {"mtp": {"flags": {"speculative-algorithm": "NEXTN"}}, "no-metrics": {"flags": {"enable-metrics": None}}},
                 "grid": {"page-size": [32, 64], "disable-radix-cache": [True, False]}})
    cs = candidates.expand(dep)
    assert [c.name for c in cs] == ["reference", "mtp", "no-metrics", "page-size=32,disable-radix-cache=on",
                                    "page-size=32,disable-radix-cache=off", "page-size=64,disable-radix-cache=on",
                                    "page-size=64,disable-radix-cache=off"]
    assert [c.name for c in candidates.select(cs, ["mtp"])] == ["reference", "mtp"]
    with pytest.raises(InputError, match=r"candidates nope: no such candidate"):
        candidates.select(cs, ["nope"])
    applied = candidates.apply(dep, cs[2]).serving.flags
    assert "enable-metrics" not in applied and applied["kv-cache-dtype"] == "bf16"
    assert candidates.apply(dep, cs[1]).serving.flags["speculative-algorithm"] == "NEXTN"
    with pytest.raises(InputError, match="tune.reference: 'zzz' is not a candidate"):
        candidates.expand(_spec({"reference": "zzz"}))


def test_the_default_deployment_names_mtp_and_fp8_kv():
    names = [c.name for c in candidates.expand(spec_mod.load(DEFAULT))]
    assert names == ["reference", "mtp", "fp8-kv"]


def test_llama_kv_prediction_from_the_gguf_header():
    meta = {"general.architecture": "llama", "llama.block_count": 6, "llama.attention.head_count": 12,
            "llama.attention.head_count_kv": 12, "llama.embedding_length": 768, "llama.context_length": 4096}
    p = llama.kv_prediction(meta, {"parallel": 2, "ctx-size": 2048, "cache-type-k": "q8_0", "cache-type-v": "q8_0"})
    # what llama-server 0.3.36 logged for these flags: "size = 19.12 MiB (1024 cells, 6 layers, 2/2 seqs), K (q8_0): 9.56 MiB"
    assert p["kv_mib"] == pytest.approx(19.12, abs=0.01) and p["context_len"] == 1024 and p["max_running_requests"] == 2
    assert llama.kv_prediction(meta, {"parallel": 2, "ctx-size": 2048})["kv_mib"] == pytest.approx(36.0)
    gqa = dict(meta, **{"llama.attention.head_count_kv": 4})
    assert llama.kv_prediction(gqa, {"ctx-size": 2048})["kv_bytes_per_token"] == 6 * 256 * 4


def _gguf(path, kvs: list[tuple[str, int, bytes]]) -> None:
    body = b"".join(struct.pack("<Q", len(k)) + k.encode() + struct.pack("<I", t) + v for k, t, v in kvs)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + body)


def test_gguf_reader_reads_scalars_skips_arrays_and_refuses_other_files(tmp_path):
    p = tmp_path / "m.gguf"
    arr = struct.pack("<IQ", 4, 3) + struct.pack("<3I", 1, 2, 3)
    _gguf(p, [("general.architecture", 8, struct.pack("<Q", 5) + b"llama"), ("llama.block_count", 4, struct.pack("<I", 6)),
              ("tokens", 9, arr), ("llama.rope.freq_base", 6, struct.pack("<f", 1.5))])
    assert gguf.metadata(p) == {"general.architecture": "llama", "llama.block_count": 6, "tokens": None,
                                "llama.rope.freq_base": 1.5}
    (tmp_path / "x.gguf").write_bytes(b"GGML....")
    with pytest.raises(InputError, match="not a GGUF model"):
        gguf.metadata(tmp_path / "x.gguf")
    p.write_bytes(p.read_bytes()[:-3])
    with pytest.raises(InputError, match="cut short"):
        gguf.metadata(p)
    with pytest.raises(InputError, match="cannot read the model"):
        gguf.metadata(tmp_path / "missing.gguf")
    _gguf(p, [("general.architecture", 8, struct.pack("<Q", 2) + b"\xff\xfe")])                # not UTF-8
    with pytest.raises(InputError, match="not a GGUF model"):
        gguf.metadata(p)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(InputError, match="not a GGUF model"):
        gguf.metadata(tmp_path / "empty.gguf")


def test_buckets_by_prompt_tokens():
    assert [measure.bucket_of(n, [8192, 32768, 131072]) for n in (1, 8192, 8193, 40000, 200000, None)] == \
        ["≤8k", "≤8k", "8k–32k", "32k–128k", ">128k", None]


def _row(name, status="done", guard="pass", limit=None, tps=1.0, tpot=10.0):
    return {"name": name, "status": status, "overlay": {"kv-cache-dtype": "fp8_e4m3"} if name != "reference" else {},
            "guard": {"status": guard, "checks": []},
            "bench": {"slo_limit": limit, "output_tok_s": tps, "levels": [{"concurrency": 4, "tpot_ms": {"p50": tpot}}]}}


def test_recommendation_is_the_highest_load_within_slo_then_throughput_among_guarded():
    dep = spec_mod.load(DEFAULT)
    rows = [_row("reference", guard="reference", limit=8, tps=100), _row("fast-but-wrong", guard="fail", limit=64, tps=900),
            _row("fp8", limit=16, tps=90), _row("skipped", status="skipped"), _row("more-tps", limit=8, tps=500)]
    rec = recommend.recommend(dep, rows)
    assert rec["name"] == "fp8" and not rec["is_reference"]
    assert [r["verdict"] for r in rows] == ["ran, not the best", "not recommended: accuracy guard failed — ", "recommended",
                                            "skipped", "ran, not compared with the reference: no per-request figures to pair"]
    assert rec["command"].startswith("python -m runbook service install --deployment ")
    assert "--arg kv-cache-dtype=fp8_e4m3 --yes" in rec["command"]
    assert recommend.recommend(dep, [_row("x", status="failed")]) is None
    # more throughput at the same load wins only outside the measured noise (test_tune_noise.py); one figure each
    # has no noise to measure: keep the deployment as it is
    close = [_row("reference", guard="reference", limit=8, tps=100), _row("fp8", limit=8, tps=150)]
    assert recommend.recommend(dep, close)["is_reference"] and close[1]["verdict"].startswith("ran, not compared")
    # started, but not as planned: not a configuration to serve
    bad_start = {**_row("fp8", limit=64, tps=900), "startup": [{"id": "verify.kv_dtype", "status": "fail", "title": "x"}]}
    assert recommend.recommend(dep, [close[0], bad_start])["is_reference"]
    assert bad_start["verdict"] == "not recommended: start-up log check failed — x"


def test_pareto_front_and_plot_mark_guard_failures():
    data = {"candidates": [_row("a", tps=100, tpot=10), _row("b", tps=200, tpot=20), _row("c", tps=90, tpot=15),
                           _row("d", guard="fail", tps=300, tpot=5)]}
    assert set(report.pareto(data)) == {"a", "b"}          # d is faster, but not the same model
    fig = report.plot_pareto(data)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "d (accuracy guard failed)" in labels and "c" in labels


class _NVML:
    """NVML as pynvml answers: energy in mJ since the driver loaded, memory in bytes."""

    def __init__(self, mj=(1000, 2000), used=(1 << 30, 1 << 30)):
        self.mj, self.used = list(mj), list(used)

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return len(self.mj)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetTotalEnergyConsumption(self, h): return self.mj[h]
    def nvmlDeviceGetMemoryInfo(self, h): return type("M", (), {"used": self.used[h]})()


def test_energy_over_a_window_and_gpu_memory_back_before_the_next_launch():
    nv = _NVML()
    m = energy.EnergyMeter(nv)
    m.start()
    nv.mj = [4000, 9000]
    assert m.stop() == pytest.approx(10.0)            # (3000 + 7000) mJ
    no = energy.EnergyMeter(type("Broken", (), {"nvmlInit": lambda self: (_ for _ in ()).throw(OSError("no driver"))})())
    no.start()
    assert no.stop() is None and "no driver" in no.skipped
    base = energy.gpu_memory_used(nv)
    nv.used = [6 << 30, 1 << 30]
    ok, why = energy.wait_memory_free(base, timeout_s=0, nvml=nv, sleep=lambda s: None)
    assert not ok and "GPU 0 still holds 5.0 GiB" in why
    nv.used = [1 << 30, 1 << 30]
    assert energy.wait_memory_free(base, timeout_s=0, nvml=nv)[0]
    assert energy.wait_memory_free(None) == (True, "no GPU here: nothing to check")


def test_llama_server_draft_counters_give_the_acceptance_length():
    from runbook.endpoint.client import RequestRecord, _draft_counters

    r = RequestRecord(1)
    _draft_counters({"predicted_n": 96, "draft_n": 19, "draft_n_accepted": 10}, r)   # a real response's counters
    assert r.spec_accept_length == pytest.approx(96 / 86)
    for bad in ({"predicted_n": 10, "draft_n": 5, "draft_n_accepted": 10}, {"predicted_n": 10}, None, {"draft_n": "x"}):
        r2 = RequestRecord(2)
        _draft_counters(bad, r2)
        assert r2.spec_accept_length is None


def test_run_leaves_tune_out_unless_only_names_it():
    from runbook.runner import run

    assert registry.get("tune").in_default_run is False
    names = [p.name for p in run.discover(run.NOTEBOOKS, [])]
    assert "60_tune.ipynb" not in names and "40_benchmark.ipynb" in names
    assert [p.name for p in run.discover(run.NOTEBOOKS, ["tune"])] == ["60_tune.ipynb"]


def test_summary_figures_carry_the_recommendation():
    st = registry.get("tune")
    assert st.figures({"recommendation": {"name": "mtp", "slo_limit": 16, "output_tok_s": 123.456}}) == \
        {"tune_recommended": "mtp", "tune_max_concurrency_within_slo": 16, "tune_output_tok_s": 123.46}
    assert st.figures({"recommendation": None}) == {} and st.figures({}) == {}


def test_sglang_launch_fills_the_api_key_from_the_env_file_or_leaves_it_out(tmp_path, monkeypatch):
    from runbook.tune.engines import sglang

    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    data = yaml.safe_load(DEFAULT.read_text())
    env = tmp_path / "qwen.env"
    env.write_text("SGLANG_API_KEY=sk-tune-123456789\n")
    data["serving"]["env_file"] = str(env)
    argv, extra = sglang.ENGINE.launch_env(spec_mod.from_dict(data, str(DEFAULT)))
    assert argv[argv.index("--api-key") + 1] == "sk-tune-123456789" and extra["SGLANG_API_KEY"] == "sk-tune-123456789"
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--kv-cache-dtype" in argv
    data["serving"]["env_file"] = str(tmp_path / "missing.env")
    argv, _ = sglang.ENGINE.launch_env(spec_mod.from_dict(data, str(DEFAULT)))
    assert "--api-key" not in argv and not any("${" in w for w in argv)


def test_start_up_log_findings_of_a_candidate_that_ran_reach_the_verdict():
    from runbook.tune.findings import findings

    dep = spec_mod.load(DEFAULT)
    row = {**_row("fp8-kv"), "verdict": "recommended",
           "startup": [{"id": "verify.tokens", "status": "warn", "title": "token pool 4 % below the plan"},
                       {"id": "verify.fp8_kv_scales", "status": "fail", "title": "FP8 KV cache without scaling factors",
                        "remedy": "--kv-cache-dtype bf16"}, {"id": "verify.started", "status": "pass", "title": "ok"}]}
    got = [f for f in findings(dep, {"findings": [], "rows": [row], "plan_only": False, "recommendation": None})
           if f.id == "tune.startup"]
    assert len(got) == 1 and got[0].status == "fail" and "FP8 KV cache without scaling factors" in got[0].title
    assert got[0].evidence == "verify.fp8_kv_scales, verify.tokens" and got[0].remedy == "--kv-cache-dtype bf16"


def test_an_upgrade_canary_is_named_by_the_versions_the_servers_report():
    """Two interpreters running different SGLang versions: the difference is the version, with its direction, not
    their paths; the same version in another interpreter is still named by the interpreter."""
    from runbook.tune import guard

    old = {"flags": {"dtype": "bfloat16"}, "python": "/old/bin/python", "version": "0.5.20", "kv_dtype": "bfloat16"}
    new = {**old, "python": "/new/bin/python", "version": "0.5.23"}
    diffs = guard.differences(old, new)
    assert diffs == [{"what": "SGLang version", "flag": "version", "reference": "0.5.20", "candidate": "0.5.23"}]
    assert guard.tested(diffs) == "SGLang version 0.5.20 → 0.5.23"
    assert guard.remedy(diffs).startswith("Greedy output changed between SGLang versions")
    same = guard.differences(old, {**new, "version": "0.5.20"})
    assert [d["flag"] for d in same] == ["python"]
    unknown = guard.differences({**old, "version": None}, new)      # a server without /server_info: its path
    assert [d["flag"] for d in unknown] == ["python"]
    dep = spec_mod.load(DEFAULT)
    g = guard.compare(dep, {"identity": ["a b c"], "setup": old}, {"identity": ["a b c"], "setup": new})
    assert g["versions"] == {"reference": "0.5.20", "candidate": "0.5.23"} and g["tested"] == "SGLang version 0.5.20 → 0.5.23"


def test_the_guard_names_the_difference_it_tested_and_its_remedy():
    from runbook.tune import guard

    dep = spec_mod.load(DEFAULT)
    ref = {"identity": ["a b c"], "setup": {"flags": {"dtype": "bfloat16"}, "python": "/py", "kv_dtype": "bfloat16"}}
    fp8 = {"identity": ["x y z"], "setup": {"flags": {"dtype": "bfloat16", "kv-cache-dtype": "fp8_e4m3"}, "python": "/py",
                                            "kv_dtype": "fp8_e4m3"}}
    g = guard.compare(dep.model_copy(update={"tune": dep.tune.model_copy(update={"guard": dep.tune.guard.model_copy(
        update={"min_identical_tokens": 8})})}), ref, fp8)
    assert g["status"] == "fail"
    assert g["tested"] == "KV cache dtype: bfloat16 vs fp8_e4m3 (--kv-cache-dtype (default) vs fp8_e4m3)"
    assert "FP8 KV cache without calibrated k/v scales" in g["remedy"] and "peculative" not in g["remedy"]
    # another difference, another remedy; two kinds at once: change one at a time
    spec = {**fp8["setup"], "kv_dtype": "bfloat16", "flags": {"dtype": "bfloat16", "speculative-algorithm": "NGRAM"}}
    assert guard.remedy(guard.differences(ref["setup"], spec)).startswith("Speculative decoding changed greedy output")
    both = guard.differences(ref["setup"], {**spec, "flags": {**spec["flags"], "disable-radix-cache": True}})
    assert guard.remedy(both).startswith("It differs from the reference in more than one way (speculative decoding, radix cache)")
    assert guard.tested(guard.differences(ref["setup"], ref["setup"])) == "no difference from the reference in flags or interpreter"
    assert guard.tested(guard.differences(None, fp8["setup"])).startswith("what differs from the reference is unknown")
    # the verdict carries the reason, the finding the difference and its remedy
    row = {**_row("fp8-kv"), "guard": g, "startup": [{"id": "verify.fp8_kv_scales", "status": "fail",
                                                       "title": "FP8 KV cache without scaling factors"}]}
    recommend.recommend(dep, [_row("reference", guard="reference"), row])
    assert row["verdict"].startswith("not recommended: accuracy guard failed — greedy outputs diverge")
    assert ", testing KV cache dtype: bfloat16 vs fp8_e4m3" in row["verdict"]
    assert row["verdict"].endswith("; start-up log check failed — FP8 KV cache without scaling factors")


def test_each_launch_shows_its_start_up_time_and_what_sglang_reported():
    ran = {**_row("fp8-kv"), "ready_s": 37.0, "verdict": "not recommended: x",
           "guard": {"status": "fail", "checks": [], "tested": "KV cache dtype: bfloat16 vs fp8_e4m3"},
           "server_info": {"version": "0.5.23", "kv_cache_dtype": "fp8_e4m3", "max_total_num_tokens": 411513,
                           "memory_usage": {"kvcache": 0.39}, "chunked_prefill_size": 4096, "max_running_requests": 4096}}
    data = {"candidates": [ran, _row("old-flag", status="skipped")]}
    got = report.launches(data)
    assert got == [{"candidate": "fp8-kv", "start-up s": 37.0, "version": "0.5.23", "KV dtype": "fp8_e4m3",
                    "token pool": 411513, "KV GB": 0.39, "chunked prefill": 4096, "running cap": 4096,
                    "tested against the reference": "KV cache dtype: bfloat16 vs fp8_e4m3", "verdict": "not recommended: x"}]
    assert report.rows(data)[0]["start-up s"] == 37.0 and report.rows(data)[1]["start-up s"] is None


def test_a_failed_sglang_start_is_told_in_sglangs_own_words(tmp_path):
    from runbook.tune.engines import PreCheck, sglang

    log = tmp_path / "c.log"
    log.write_text("[2026-12-05 08:18:40] Load weight end. elapsed=0.04 s\nTraceback (most recent call last):\n"
                   '  File "kv_cache_configurator.py", line 3050, in _profile_available_bytes\n    raise ValueError(\n'
                   "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.02. "
                   "Raise --mem-fraction-static above 0.033\n[2026-12-05 08:18:43] Received sigquit from a child process.\n"
                   "[2026-12-05 08:18:43] kill_process_tree called: parent_pid=1, include_parent=True, pid=1\n")
    st = sglang.ENGINE.startup(spec_mod.load(DEFAULT), log, PreCheck("ok"))
    assert st.failure == ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.02. "
                          "Raise --mem-fraction-static above 0.033")
    log.write_text("[2026-12-05 08:18:40] Load weight end. elapsed=0.04 s\n")
    assert sglang.ENGINE.startup(spec_mod.load(DEFAULT), log, PreCheck("ok")).failure is None


def test_the_sglang_demo_adds_the_upgrade_canary_only_where_it_is_built(tmp_path, monkeypatch):
    from runbook.demo import sglang as demo
    from runbook.demo import tune as demo_tune

    py = tmp_path / "bin" / "python"
    monkeypatch.setattr(demo, "canary_python", lambda: py)
    assert demo_tune.sglang_candidates() == demo_tune.SGLANG_CANDIDATES        # not built: the demo runs without it
    py.parent.mkdir()
    py.write_text("")
    got = demo_tune.sglang_candidates()
    canary = got.pop(f"sglang-{demo.CANARY_SGLANG_VERSION}")
    assert got == demo_tune.SGLANG_CANDIDATES and canary["python"] == str(py) and "flags" not in canary


def test_a_quantized_gguf_kv_cache_gets_llama_cpps_remedy_not_sglangs():
    """The same kind of difference (the KV cache dtype) on llama-server is its block-quantized cache types: the remedy
    names them, not SGLang's FP8 scaling factors."""
    from runbook.tune import guard

    ref = {"flags": {}, "python": None, "kv_dtype": "K f16, V f16"}
    q8 = {"flags": {"cache-type-k": "q8_0", "cache-type-v": "q8_0"}, "python": None, "kv_dtype": "K q8_0, V q8_0"}
    text = guard.remedy(guard.differences(ref, q8))
    assert text.startswith("The quantized KV cache (--cache-type-k/--cache-type-v q8_0, q4_0)") and "SGLang" not in text
    fp8 = {"flags": {"kv-cache-dtype": "fp8_e4m3"}, "python": "/py", "kv_dtype": "fp8_e4m3"}
    assert "no scaling factors provided" in guard.remedy(guard.differences({**ref, "kv_dtype": "bfloat16"}, fp8))
