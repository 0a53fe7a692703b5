"""service check's abbreviation warn and service drift's runtime-state comparison (issue 14)."""
from __future__ import annotations

import json
import os

import pytest
from conftest import DEFAULT_SPEC, spec_data
from httpfake import serve

from runbook import service
from runbook.core import spec

SECRET = "sk-drift-SECRET-424242"


def dep(**changes):
    return spec.from_dict(spec_data(**changes), str(DEFAULT_SPEC))


def test_abbreviation_is_a_warn_naming_the_full_flag():
    known = ["--kv-cache-dtype", "--context-length", "--tp-size", "--tool-call-parser"]
    f = service.check.__globals__["abbreviations"](["--kv-cache-dtyp", "bf16", "--context-length", "1", "--t", "x"], known, "0.5.23")
    assert [x.id for x in f] == ["service.flag_abbrev.kv-cache-dtyp"]
    assert f[0].status == "warn" and "--kv-cache-dtype" in f[0].title and "--kv-cache-dtype" in f[0].remedy


@pytest.mark.serving
@pytest.mark.skipif(not os.environ.get("RUNBOOK_SERVING_PYTHON"), reason="needs SGLang's parser (RUNBOOK_SERVING_PYTHON)")
def test_check_with_sglangs_parser_warns_on_an_abbreviation():
    flags = dict(dep().serving.flags)
    flags["kv-cache-dtyp"] = flags.pop("kv-cache-dtype")
    _, f = service.check(dep(**{"serving.flags": flags}))
    got = {x.id: x for x in f}
    assert got["service.flag_abbrev.kv-cache-dtyp"].status == "warn"
    assert got["service.parser"].status == "pass"   # SGLang itself accepts it: that is the danger


INFO = {"model_path": "nvidia/Qwen3.5-397B-A17B-NVFP4", "tp_size": 8, "kv_cache_dtype": "bf16", "context_length": 262144,
        "mem_fraction_static": 0.88, "max_running_requests": None, "api_key": SECRET, "launch_command": f"--api-key {SECRET}",
        "internal_states": [{"max_total_num_tokens": 2034058, "max_running_requests": 233}], "max_total_num_tokens": 2034058}


def test_drift_reads_runtime_state_and_never_shows_the_key(monkeypatch):
    monkeypatch.setenv("SGLANG_API_KEY", SECRET)
    with serve({"/server_info": (200, INFO)}) as (url, _):
        rows, f, info = service.drift(dep(), url)
    assert rows == [] and f[0].status == "pass" and "runtime values" in f[0].title
    assert info["max_total_num_tokens"] == 2034058 and info["max_running_requests"] == 233
    assert SECRET not in json.dumps([rows, [x.to_dict() for x in f], info])


def test_drift_flags_a_pool_above_max_total_tokens_and_an_unset_dtype_resolved_otherwise():
    flags = dict(dep().serving.flags, **{"max-total-tokens": 1000000})
    with serve({"/server_info": (200, dict(INFO, max_total_tokens=1000000))}) as (url, _):
        rows, f, _ = service.drift(dep(**{"serving.flags": flags}), url)
    assert rows == [{"flag": "max-total-tokens", "spec": "at most 1000000", "server": "2034058"}]
    assert f[0].status == "fail"
    # kv-cache-dtype unset: SGLang's auto resolves to the checkpoint's FP8; a server on bf16 is not the unit
    no_dtype = {k: v for k, v in dep().serving.flags.items() if k != "kv-cache-dtype"}
    d = dep(**{"serving.flags": no_dtype})
    with serve({"/server_info": (200, dict(INFO, kv_cache_dtype="bfloat16"))}) as (url, _):
        rows, _, _ = service.drift(d, url, built=service.build(d, with_quant=True))
    assert rows == [{"flag": "kv-cache-dtype", "spec": "auto (→ fp8_e4m3)", "server": "bfloat16"}]
