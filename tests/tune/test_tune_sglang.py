"""tune on the real SGLang server on CPU (runbook.demo.sglang): a real SGLang process as the production unit
(behind the stand-in systemctl), stopped for the run and restored — active and answering; candidates over SGLang's
own knobs launched for real, each with its start-up time and /server_info; a flag this SGLang refuses skipped by
its own parser before any launch; and the story: an FP8 KV cache without scales, read from its own log, guarded
against the BF16 reference with the difference named, and not recommended; the reference launched again at the end
and every gain judged against that noise. One run, six SGLang starts (production, three candidates, the reference
again, the restore): SGLang takes 25-55 s to start on these CPUs."""
import json
import subprocess
import time
import urllib.request

import pytest

from runbook.core import spec as spec_mod
from runbook.core.ports import free_port
from runbook.tune import guard, report
from runbook.tune import stage as tune_stage
from tune.procs import pid_gone

pytestmark = pytest.mark.sglang

CANDIDATES = {
    "chunked-512": {"description": "chunked prefill of 512 tokens, 8 running requests",
                    "flags": {"chunked-prefill-size": 512, "max-running-requests": 8}},
    "fp8-kv": {"description": "FP8 KV cache without scales", "flags": {"kv-cache-dtype": "fp8_e4m3"}},
    "old-flag": {"description": "a flag this SGLang does not have", "flags": {"enable-dp-lm-head-typo": True}},
}
START_S = 240     # one SGLang start on 2 busy cores: 25-55 s measured, with room


def _wait_health(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def _state(fake_systemd, unit: str) -> str:
    return subprocess.run([*fake_systemd.systemctl, "is-active", unit], capture_output=True, text=True).stdout.strip()


def test_tune_launches_sglang_candidates_and_restores_the_sglang_production_unit(tmp_path, fake_systemd):
    from runbook.demo import sglang as demo
    from runbook.demo.tune import write_sglang_spec

    port = free_port()
    path = write_sglang_spec(tmp_path / "tiny-sglang.yaml", port, candidates=CANDIDATES)
    dep = spec_mod.load(path)
    unit, url = dep.systemd.unit_name, dep.serving.local_url
    # production: SGLang started by the (stand-in) systemctl from the unit's own ExecStart
    (fake_systemd.state / f"{unit}.cmd.json").write_text(json.dumps(
        {"argv": demo.launch_argv(dep), "log": str(tmp_path / "production.log"), "env": {"HOME": str(tmp_path)}}))
    assert subprocess.run([*fake_systemd.systemctl, "start", unit]).returncode == 0
    try:
        assert _wait_health(url, START_S), demo.log_tail(tmp_path / "production.log")
        before = fake_systemd.main_pid(unit)
        settings = tune_stage.TuneSettings.resolve(dep, tune_stage.TuneOptions(yes=True, archive=str(tmp_path / "arch")))
        rep = tune_stage.assess(dep, settings,
                                  systemctl=fake_systemd.systemctl)
        rows = {r["name"]: r for r in rep.rows}
        ids = {f.id: f for f in rep.findings}

        # production was stopped for the run and is back: active, a new process, answering
        assert ids["tune.production.stopped"] and ids["tune.production.restored"].status == "pass"
        assert pid_gone(before) and _state(fake_systemd, unit) == "active" and fake_systemd.main_pid(unit) != before
        assert _wait_health(url, 10)

        # the refused flag: skipped by SGLang's own parser, nothing launched for it
        bad = rows["old-flag"]
        assert bad["status"] == "skipped" and "--enable-dp-lm-head-typo: not a flag of SGLang 0.5.23" in bad["reason"]
        assert "log" not in bad and "ready_s" not in bad
        assert not list((tmp_path / "arch").glob("tune/*/logs/old-flag.log"))

        # every launch: its start-up time and what SGLang itself reports
        for name in ("reference", "chunked-512", "fp8-kv"):
            r = rows[name]
            assert r["status"] == "done", (name, r.get("reason"))
            assert 1 < r["ready_s"] < START_S and r["server_info"]["version"] == "0.5.23"
            assert 0 < r["teardown_s"] < 60          # SGLang's scheduler and detokenizer exit 5-15 s after SIGTERM
            assert r["bench"]["output_tok_s"] > 0
            assert r["observed"]["max_total_num_tokens"] == r["server_info"]["max_total_num_tokens"]
        assert rows["chunked-512"]["server_info"]["chunked_prefill_size"] == 512
        assert rows["chunked-512"]["server_info"]["max_running_requests"] == 8
        assert rows["reference"]["observed"]["kv_dtype"] == "bfloat16"

        # the story: FP8 KV without scales, from its own log; guarded against BF16 with the difference named
        fp8 = rows["fp8-kv"]
        assert fp8["observed"]["kv_dtype"] == "fp8_e4m3" and fp8["server_info"]["kv_cache_dtype"] == "fp8_e4m3"
        assert any(d["id"] == "verify.fp8_kv_scales" and d["status"] == "fail" for d in fp8["startup"])
        startup = [f for f in rep.findings if f.id == "tune.startup" and f.title.startswith("fp8-kv:")]
        assert startup and startup[0].status == "fail" and "without scaling factors" in startup[0].title
        assert fp8["guard"]["tested"].startswith("KV cache dtype: bfloat16 vs fp8_e4m3")
        assert fp8["verdict"].startswith("not recommended: ")
        assert "start-up log check failed — fp8_e4m3 KV cache without scaling factors" in fp8["verdict"]
        # judged by the KL divergence against the reference's own noise floor; greedy identity is where outputs part
        checks = {c["probe"]: c for c in fp8["guard"]["checks"]}
        assert checks["kld"]["status"] in ("pass", "warn", "fail") and checks["kld"]["overall"]["positions"] > 0
        assert checks["identity"]["status"] == "info" and "floor" in checks["kld"]["title"]
        assert set(rows["reference"]["kld_floor"]) == {"second_pass", "batch"}
        # the reference's scores and floor kept as a record in the run's folder: what --resume compares the rest with
        assert rows["reference"]["kld_record"] == guard.KLD_RECORD
        (run_dir,) = [d for d in (tmp_path / "arch" / "tune").iterdir() if (d / guard.KLD_RECORD).is_file()]
        kept = guard.kept_kld_reference(run_dir)
        assert {k: f.overall for k, f in kept.floors.items()} == rows["reference"]["kld_floor"]
        if fp8["guard"]["status"] == "fail":
            assert "accuracy guard failed — next-token distributions materially off the reference" in fp8["verdict"]
            assert "FP8 KV cache without calibrated k/v scales" in ids["tune.guard"].remedy
            assert "peculative" not in ids["tune.guard"].remedy
        assert rep.recommendation["name"] != "fp8-kv"

        # the reference launched again at the end (speed only); each candidate's gain against the noise it measured
        again = rows["reference"]["repeats"]
        assert [(r["status"], r["guard"]["status"]) for r in again] == [("done", "skip")]
        assert again[0]["seq"] > max(rows[n]["seq"] for n in ("chunked-512", "fp8-kv"))
        assert again[0]["log"].endswith("reference.run2.log") and again[0]["bench"]["per_request"]
        assert rows["reference"]["noise"]["runs"] == 2
        chunked = rows["chunked-512"]
        assert chunked["gain"]["pairs"] > 0 and chunked["gain"]["reference_runs"] == 2
        assert (rep.recommendation["name"] == "chunked-512") == (chunked["gain"]["ci"][0] is not None
                                                                 and chunked["gain"]["ci"][0] > 0
                                                                 and chunked["gain"]["mean"] >= dep.tune.min_gain)

        # the table shows each launch's start-up time and throughput
        table = {r["candidate"]: r for r in report.rows(rep.data())}
        assert table["chunked-512"]["start-up s"] == rows["chunked-512"]["ready_s"]
        assert table["fp8-kv"]["tok/s"] == round(fp8["bench"]["output_tok_s"], 1)
        print("\n" + report.text_table(rep))
        print(f"fp8-kv verdict: {fp8['verdict']}")
    finally:
        subprocess.run([*fake_systemd.systemctl, "stop", unit], timeout=60)
