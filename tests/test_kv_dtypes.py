"""One KV-dtype name table (model/sglang_names.py): every normaliser agrees, and the verify comparison knows
which formats a log's torch dtype cannot tell apart. tests/test_kv_vs_sglang.py diffs the table against SGLang."""
import pytest

from runbook.accuracy import kvquant
from runbook.core.errors import InputError
from runbook.kv import memory as kvmem
from runbook.model import sglang_names as names
from runbook.quant import sglang_rules
from runbook.service.drift import _same as drift_same
from runbook.verify import compare, logparse


@pytest.mark.parametrize("given, canonical", [
    ("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("torch.bfloat16", "bfloat16"), ("BF16", "bfloat16"),
    ("fp8_e4m3", "fp8_e4m3"), ("torch.float8_e4m3fn", "fp8_e4m3"), ("torch.float8_e4m3fnuz", "fp8_e4m3"),
    ("torch.float8_e5m2", "fp8_e5m2"), ("torch.float8_e5m2fnuz", "fp8_e5m2"), ("mxfp8", "mxfp8"),
    ("nvfp4", "nvfp4"), ("fp4_mx_block16", "fp4_mx_block16"), ("torch.float4_e2m1fn_x2", "nvfp4"),
    ("torch.float16", "float16"), ("fp16", "float16"), ("torch.float32", "float32"),
    ("auto", None), ("", None), (None, None), ("fp7", None), ("torch.uint8", None),
])
def test_every_spelling_has_one_canonical_name(given, canonical):
    assert names.kv_dtype_name(given) == canonical


def test_table_facts():
    t = names.KV_DTYPES
    assert [t[n].bits for n in ("bfloat16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16")] == [16, 8, 8, 8, 4, 4]
    assert t["nvfp4"].bytes == 0.5 and t["bfloat16"].bytes == 2
    assert names.FP8_KV == ("fp8_e4m3", "fp8_e5m2") and names.FP4_KV == ("nvfp4", "fp4_mx_block16")
    # every flag spelling but auto names a table entry
    assert {c for c in names.KV_CACHE_DTYPE_CHOICES if c != "auto"} == {f for d in t.values() for f in d.flags}


def test_the_normalisers_use_the_table():
    assert logparse.kv_dtype_name("torch.float4_e2m1fn_x2") == "nvfp4"         # was "fp4"
    assert logparse.kv_dtype_name("torch.uint8") == "uint8"                     # unknown: as logged
    assert kvmem.normalise_dtype("bf16") == "bfloat16" and kvmem.normalise_dtype("fp16") == "float16"
    assert tuple(names.KV_DTYPES) == kvmem.KV_DTYPES
    with pytest.raises(InputError, match="fp4_mx_block16"):
        kvmem.normalise_dtype("fp7")
    assert sglang_rules.effective_kv_dtype("bf16", "x") == "bfloat16" and sglang_rules.effective_kv_dtype("auto", "x") == "x"
    assert kvquant.active_format("fp8_e4m3", "all") == ("fp8_e4m3", "per_tensor")
    assert kvquant.active_format("nvfp4") == ("bf16", "none")
    assert drift_same("bf16", "bfloat16") and not drift_same("fp8_e4m3", "bfloat16")


def _kv_finding(want: str, have: str, where: str):
    out = compare.compare({}, {"kv_dtype": have}, logparse.Facts(), {"kv-cache-dtype": want}, where)
    return next(f for f in out if f.id == "verify.kv_dtype")


@pytest.mark.parametrize("want, have, where, status", [
    ("nvfp4", logparse.kv_dtype_name("torch.float4_e2m1fn_x2"), "log", "pass"),          # was a fail: fp4 != nvfp4
    ("fp4_mx_block16", logparse.kv_dtype_name("torch.float4_e2m1fn_x2"), "log", "pass"),  # same torch dtype in the log
    ("mxfp8", logparse.kv_dtype_name("torch.float8_e4m3fn"), "log", "pass"),
    ("bf16", logparse.kv_dtype_name("torch.bfloat16"), "log", "pass"),
    ("fp8_e4m3", logparse.kv_dtype_name("torch.bfloat16"), "log", "fail"),
    ("nvfp4", logparse.kv_dtype_name("torch.float8_e4m3fn"), "log", "fail"),
    ("mxfp8", "fp8_e4m3", "/server_info", "fail"),      # the server names its flag: no ambiguity to forgive
    ("bfloat16", "bf16", "/server_info", "pass"),
])
def test_verify_compares_kv_dtypes_through_the_table(want, have, where, status):
    assert _kv_finding(want, have, where).status == status
