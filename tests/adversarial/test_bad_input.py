"""Bad input at the edge: CLI options and the deployment spec file (issue 13).

Every named case runs the real CLI (`python -m runbook`, as cron would) and asserts exit 2, exactly
one line on stderr, no traceback, and that the line names the option or spec field. Spec cases write
a variant of the story's deployment into tmp_path (its relative model.card made absolute).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import DEFAULT_SPEC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.core import spec, specbase
from runbook.core.errors import RunbookError, SpecError

MODEL = DEFAULT_SPEC.parents[1] / "models" / "llama-3.1-70b"
DEAD_URL = "http://127.0.0.1:9"      # nothing listens: old code that ignores a bad option fails fast


def _base_text() -> str:
    text = DEFAULT_SPEC.read_text()
    card = (DEFAULT_SPEC.parent / "../models/qwen3.5-397b-a17b-nvfp4").resolve()
    return re.sub(r"(?m)^(\s*card:) \S+", rf"\1 {card}", text)


def _sub(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return edit


def _bomb(text: str) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return text.replace("description: ", "bomb:\n" + "\n".join("  " + x for x in lines) + "\ndescription: ", 1)


# ---- CLI options -------------------------------------------------------------------------------
# (id, argv with {tmp} for tmp_path, what stderr must name)
CLI_CASES = [
    ("kv-contexts-abc", ["kv", MODEL, "--contexts", "abc"], "--contexts"),
    ("kv-contexts-zero", ["kv", MODEL, "--contexts", "8192,0"], "--contexts"),
    ("kv-tp-abc", ["kv", MODEL, "--tp", "abc"], "--tp"),
    ("kv-gpu-mem-nan", ["kv", MODEL, "--gpu-mem-gib", "nan"], "--gpu-mem-gib"),
    ("kv-gpu-mem-inf", ["kv", MODEL, "--gpu-mem-gib", "inf"], "--gpu-mem-gib"),
    ("kv-weights-nan", ["kv", MODEL, "--weights-gib", "nan"], "--weights-gib"),
    ("kv-weights-negative", ["kv", MODEL, "--gpu-mem-gib", "80", "--weights-gib", "-1"], "--weights-gib"),
    ("kv-budget-inf", ["kv", MODEL, "--kv-budget-gib", "inf"], "--kv-budget-gib"),
    ("kv-mem-fraction-nan", ["kv", MODEL, "--mem-fraction-static", "nan"], "--mem-fraction-static"),
    ("kv-context-len-negative", ["kv", MODEL, "--context-len", "-1"], "--context-len"),
    ("kv-page-size-abc", ["kv", MODEL, "--page-size", "abc"], "--page-size"),
    ("kv-tp-float", ["kv", MODEL, "--tp", "8.0"], "--tp"),                       # pydantic's lax int would take it
    ("kv-tp-word-true", ["kv", MODEL, "--tp", "True"], "--tp"),
    ("kv-contexts-unclosed-json", ["kv", MODEL, "--contexts", "[8192,"], "--contexts"),
    ("kv-contexts-fraction", ["kv", MODEL, "--contexts", "8192,32768.5"], "--contexts"),
    ("bench-concurrency-abc", ["bench", "--url", DEAD_URL, "--archive", "", "--concurrency", "abc"], "--concurrency"),
    ("bench-concurrency-zero", ["bench", "--url", DEAD_URL, "--archive", "", "--concurrency", "0"], "--concurrency"),
    ("bench-concurrency-negative", ["bench", "--url", DEAD_URL, "--archive", "", "--concurrency", "1,-4"], "--concurrency"),
    ("bench-rate-abc", ["bench", "--url", DEAD_URL, "--archive", "", "--rate", "abc"], "--rate"),
    ("bench-rate-zero", ["bench", "--url", DEAD_URL, "--archive", "", "--rate", "0"], "--rate"),
    ("bench-rate-nan", ["bench", "--url", DEAD_URL, "--archive", "", "--rate", "nan"], "--rate"),
    ("bench-rate-unclosed-json", ["bench", "--url", DEAD_URL, "--archive", "", "--rate", "[1,"], "--rate"),
    ("bench-seed-float", ["bench", "--url", DEAD_URL, "--archive", "", "--seed", "1.5"], "--seed"),
    ("bench-requests-zero", ["bench", "--url", DEAD_URL, "--archive", "", "--requests", "0"], "--requests"),
    ("bench-duration-zero", ["bench", "--url", DEAD_URL, "--archive", "", "--duration", "0"], "--duration"),
    ("bench-duration-inf", ["bench", "--url", DEAD_URL, "--archive", "", "--duration", "inf"], "--duration"),
    ("bench-warmup-negative", ["bench", "--url", DEAD_URL, "--archive", "", "--warmup", "-1"], "--warmup"),
    ("bench-timeout-zero", ["bench", "--url", DEAD_URL, "--archive", "", "--timeout", "0"], "--timeout"),
    ("bench-input-len-zero", ["bench", "--url", DEAD_URL, "--archive", "", "--input-len", "0"], "--input-len"),
    ("bench-url-not-a-url", ["bench", "--archive", "", "--url", "notaurl"], "--url"),
    ("bench-url-no-host", ["bench", "--archive", "", "--url", "http://:30000"], "--url"),
    ("bench-compare-url-ftp", ["bench", "--url", DEAD_URL, "--archive", "", "--compare-url", "ftp://host/x"], "--compare-url"),
    ("accuracy-lengths-abc", ["accuracy", "recall", "--url", DEAD_URL, "--lengths", "abc"], "--lengths"),
    ("accuracy-lengths-negative", ["accuracy", "recall", "--url", DEAD_URL, "--lengths", "-5"], "--lengths"),
    ("accuracy-depths-abc", ["accuracy", "recall", "--url", DEAD_URL, "--depths", "abc"], "--depths"),
    ("accuracy-depths-out-of-range", ["accuracy", "recall", "--url", DEAD_URL, "--depths", "0.5,1.5"], "--depths"),
    ("accuracy-per-cell-zero", ["accuracy", "recall", "--url", DEAD_URL, "--per-cell", "0"], "--per-cell"),
    ("accuracy-prompts-zero", ["accuracy", "identity", "--url", DEAD_URL, "--compare-url", DEAD_URL, "--prompts", "0"], "--prompts"),
    ("accuracy-max-tokens-zero", ["accuracy", "identity", "--url", DEAD_URL, "--compare-url", DEAD_URL, "--max-tokens", "0"],
     "--max-tokens"),
    ("accuracy-url-not-a-url", ["accuracy", "recall", "--url", "notaurl"], "--url"),
    ("accuracy-spec-off-url", ["accuracy", "report", "--spec-off-url", "localhost"], "--spec-off-url"),
    ("service-drift-url", ["service", "drift", "--url", "notaurl"], "--url"),
    ("service-ready-url", ["service", "install", "--root", "{tmp}", "--ready-url", "notaurl"], "--ready-url"),
    ("service-ready-timeout-zero", ["service", "install", "--root", "{tmp}", "--ready-timeout", "0"], "--ready-timeout"),
    ("run-timeout-zero", ["run", "--out", "{tmp}/out", "--notebooks", "{tmp}/nb", "--timeout", "0"], "--timeout"),
    ("run-timeout-negative", ["run", "--out", "{tmp}/out", "--notebooks", "{tmp}/nb", "--timeout", "-5"], "--timeout"),
    ("run-run-timeout-zero", ["run", "--out", "{tmp}/out", "--notebooks", "{tmp}/nb", "--run-timeout", "0"], "--run-timeout"),
    ("run-keep-zero", ["run", "--out", "{tmp}/out", "--notebooks", "{tmp}/nb", "--keep", "0"], "--keep"),
    ("run-keep-negative", ["run", "--out", "{tmp}/out", "--notebooks", "{tmp}/nb", "--keep", "-1"], "--keep"),
    ("run-only-empty", ["run", "--out", "{tmp}/out", "--notebooks", "{tmp}/nb", "--only", ""], "--only"),
    # a notebook parameter typed float took nan and inf (the notebook then ran on them)
    ("run-param-nan", ["run", "--out", "{tmp}/out", "--param", "gpu_mem_gib=nan"], "--param gpu_mem_gib=nan"),
    ("run-param-list-inf", ["run", "--out", "{tmp}/out", "--param", "rates=1,inf"], "--param rates=1,inf"),
]

# ---- spec file ---------------------------------------------------------------------------------
# (id, edit of the spec text or a writer of the spec path, what stderr must name)
SPEC_CASES: list[tuple[str, Callable, str]] = [
    ("inf-float-field", _sub("gpu_memory_gib: 95.5927734375", "gpu_memory_gib: .inf"), "hardware.gpu_memory_gib"),
    ("inf-size", _sub("size_gib: 233", "size_gib: .inf"), "model.size_gib"),
    ("inf-slo", _sub("ttft_ms_p99: 3000", "ttft_ms_p99: .inf"), "slo.ttft_ms_p99"),
    ("nan-flag", _sub("mem-fraction-static: 0.88", "mem-fraction-static: .nan"), "serving.flags.mem-fraction-static"),
    ("duplicate-key", _sub("  port: 30000\n", "  port: 30000\n  port: 30001\n"), "duplicate key 'port'"),
    ("duplicate-section", lambda t: t + "\nserving:\n  python: /x\n", "duplicate key 'serving'"),
    ("string-false-switch", _sub("enable-metrics: true", 'enable-metrics: "false"'), "serving.flags.enable-metrics"),
    ("string-true-switch", _sub("enable-metrics: true", "disable-radix-cache: 'True'"), "serving.flags.disable-radix-cache"),
    ("context-length-word", _sub("context-length: 262144", "context-length: lots"), "serving.flags.context-length"),
    ("context-length-zero", _sub("context-length: 262144", "context-length: 0"), "serving.flags.context-length"),
    ("context-length-float", _sub("context-length: 262144", "context-length: 1.5"), "serving.flags.context-length"),
    ("max-running-requests-negative", _sub("context-length: 262144", "context-length: 262144\n    max-running-requests: -3"),
     "serving.flags.max-running-requests"),
    ("mem-fraction-above-one", _sub("mem-fraction-static: 0.88", "mem-fraction-static: 8.8"), "serving.flags.mem-fraction-static"),
    ("concurrency-zero", _sub("concurrency: [1, 2, 4,", "concurrency: [0, 2, 4,"), "benchmark.concurrency"),
    ("recall-depth-above-one", _sub("recall_depths: [0.1,", "recall_depths: [1.5,"), "accuracy.recall_depths"),
    ("recall-length-negative", _sub("recall_lengths: [8192,", "recall_lengths: [-8192,"), "accuracy.recall_lengths"),
    ("bad-date", _sub("description: Qwen", "description: 2001-02-30\nx_description: Qwen"), "not a valid YAML value"),
    ("nul-byte", _sub("name: qwen", "name: q\x00wen"), "not valid YAML"),
    ("deep-nesting", _sub("description: Qwen", "description: " + "[" * 5000 + "]" * 5000 + "\nx: Qwen"), "nested"),
    ("alias-bomb", _bomb, "aliases expand"),
    ("too-large", lambda t: t + "\n# " + "x" * (1 << 20) + "\n", "too large"),
]


def _spec_file(tmp_path: Path, edit: Callable[[str], str]) -> Path:
    p = tmp_path / "dep.yaml"
    p.write_text(edit(_base_text()), encoding="utf-8")
    return p


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "dep.yaml"
    os.mkfifo(p)
    return p


def _latin1(tmp_path: Path) -> Path:
    p = tmp_path / "dep.yaml"
    p.write_bytes(_base_text().replace("description: Qwen", "description: Qw\u00e9n").encode("latin-1"))
    return p


FILE_CASES = [
    ("fifo", _fifo, "not a regular file"),
    ("not-utf8", _latin1, "not UTF-8"),
]


def _assert_one_line_error(cp, names: str) -> None:
    err = cp.stderr
    assert "Traceback" not in err, err[-2000:]
    lines = [x for x in err.splitlines() if x.strip()]
    assert cp.returncode == 2, (cp.returncode, err[-2000:])
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err[-2000:]
    assert names in lines[0], lines[0]


@pytest.mark.parametrize("argv, names", [pytest.param(a, n, id=i) for i, a, n in CLI_CASES])
def test_bad_cli_option_is_one_line_naming_it(cli, tmp_path, argv, names):
    cp = cli(*[str(x).replace("{tmp}", str(tmp_path)) for x in argv], timeout=60)
    _assert_one_line_error(cp, names)
    assert cp.stderr.startswith("runbook")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, names", [pytest.param(e, n, id=i) for i, e, n in SPEC_CASES])
def test_bad_spec_is_one_line_naming_file_and_field(cli, tmp_path, edit, names):
    p = _spec_file(tmp_path, edit)
    cp = cli("kv", "--deployment", p, timeout=60)
    _assert_one_line_error(cp, names)
    assert p.name in cp.stderr


@pytest.mark.parametrize("make, names", [pytest.param(m, n, id=i) for i, m, n in FILE_CASES])
def test_bad_spec_file_is_one_line_naming_it(cli, tmp_path, make, names):
    p = make(tmp_path)
    cp = cli("kv", "--deployment", p, timeout=60)   # a FIFO used to block here forever
    _assert_one_line_error(cp, names)
    assert p.name in cp.stderr


def test_spec_directory_is_refused(cli, tmp_path):
    cp = cli("kv", "--deployment", tmp_path, timeout=60)
    _assert_one_line_error(cp, "is a directory")


def test_base_spec_variant_loads(tmp_path):
    """The unedited variant is valid, so each case above fails for its own edit only."""
    d = spec.load(_spec_file(tmp_path, lambda t: t))
    assert d.name == "qwen3.5-397b-a17b-nvfp4" and Path(d.model.card or "").is_absolute()


def test_env_values_keep_the_text_as_written(tmp_path):
    """YAML 1.1 reads 0755 as 493, 1:30 as 90 and 1e3 as 1000.0; an env value is the text as written."""
    edit = _sub("    PYTHONUNBUFFERED: \"1\"\n", "    PYTHONUNBUFFERED: \"1\"\n    UMASK: 0755\n    T: 1:30\n    N: 1e3\n    H: 0x1F\n"
                "    ONE: 1\n")
    env = spec.load(_spec_file(tmp_path, edit)).serving.env
    assert (env["UMASK"], env["T"], env["N"], env["H"], env["ONE"]) == ("0755", "1:30", "1e3", "0x1F", "1")


def test_env_value_read_as_boolean_says_quote_it(cli, tmp_path):
    p = _spec_file(tmp_path, _sub("    NCCL_DEBUG: WARN\n", "    NCCL_DEBUG: WARN\n    NCCL_IB_DISABLE_X: yes\n"))
    cp = cli("kv", "--deployment", p, timeout=60)
    _assert_one_line_error(cp, "serving.env.NCCL_IB_DISABLE_X")
    assert 'quote the value: NCCL_IB_DISABLE_X: "yes"' in cp.stderr


@pytest.mark.parametrize("value, what", [("", "an empty value as null"), ("~", "~ as null"), ("off", "off as true/false")])
def test_env_value_yaml_reads_as_no_text_says_quote_it(tmp_path, value, what):
    """serving.env goes through the same scalar pass as every other field: null and booleans are refused by name."""
    p = _spec_file(tmp_path, _sub("    NCCL_DEBUG: WARN\n", f"    NCCL_DEBUG: WARN\n    X_EMPTY: {value}\n"))
    with pytest.raises(SpecError) as ei:
        spec.load(p)
    msg = str(ei.value)
    assert "serving.env.X_EMPTY" in msg and f"YAML reads {what}" in msg and 'quote the value: X_EMPTY: "' in msg, msg


# ---- property: random bytes as the spec --------------------------------------------------------
_FRAGMENTS = [b"name: ", b"serving:\n", b"  env:\n", b"    A: ", b"flags:\n", b"&a ", b"*a", b"[", b"]", b"{", b"}", b": ", b", ",
              b"- ", b"\n", b"  ", b"0755", b".inf", b".nan", b"1:30", b"2001-02-30", b"!!binary", b"!!int", b"!!timestamp x",
              b"<<: *a", b"? ", b"'", b'"', b"\xff", b"\x00", b"\xef\xbb\xbf", b"---\n", b"...\n", b"%YAML 1.1\n", b"|\n", b"&b [*b]"]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=400), st.lists(st.sampled_from(_FRAGMENTS) | st.binary(max_size=8), max_size=40).map(b"".join)))
def test_random_bytes_as_spec_raise_only_runbook_errors(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "spec.yaml"
        p.write_bytes(data)
        try:
            spec.load(p)
        except RunbookError as e:
            assert "\n" not in str(e) and p.name in str(e)


@pytest.mark.parametrize("flags, field, want", [
    ({"disable-radix-cache": "false"}, "disable_radix_cache", False),
    ({"disable-radix-cache": "0"}, "disable_radix_cache", False),
    ({"disable-radix-cache": True}, "disable_radix_cache", True),
    ({"context-length": "131072"}, "context_len", 131072),
])
def test_kv_reads_what_if_flag_strings_by_their_meaning(flags, field, want):
    """--arg values reach kv as strings: bool('false') must not mean true."""
    from conftest import DEFAULT_SPEC

    from runbook import kv
    from runbook.core import spec

    d = spec.load(DEFAULT_SPEC)
    d = d.model_copy(update={"serving": d.serving.model_copy(update={"flags": dict(d.serving.flags, **flags)})})
    assert getattr(kv.assess(d).inputs, field) == want


@pytest.mark.parametrize("value", ["lots", "nan", "inf"])
def test_kv_refuses_a_what_if_flag_that_is_not_a_number(value):
    from conftest import DEFAULT_SPEC

    from runbook import kv
    from runbook.core import spec
    from runbook.core.errors import InputError

    d = spec.load(DEFAULT_SPEC)
    d = d.model_copy(update={"serving": d.serving.model_copy(update={"flags": dict(d.serving.flags, **{"mem-fraction-static": value})})})
    with pytest.raises(InputError, match="--mem-fraction-static"):
        kv.assess(d)


def _float_fields(model, prefix: str = ""):
    """Every float the spec holds, by its dotted path: (path, whether it is a list of floats)."""
    for name, f in model.model_fields.items():
        kind = specbase.unwrap(f.annotation)
        if kind is float or kind == ("list", float):
            yield prefix + name, kind is not float
        elif isinstance(kind, tuple) and kind[0] == "model":
            yield from _float_fields(kind[1], f"{prefix}{name}.")


SPEC_FLOATS = sorted(_float_fields(spec.Deployment))


def test_the_spec_has_the_floats_the_property_below_covers():
    assert {"hardware.gpu_memory_gib", "model.size_gib", "accuracy.recall_depths", "tune.budget_s"} <= {p for p, _ in SPEC_FLOATS}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SPEC_FLOATS), st.sampled_from([".inf", "-.inf", ".Inf", ".nan", ".NaN", "1.0e+400", "'inf'", "'nan'"]))
def test_every_float_in_the_spec_must_be_finite(field, written):
    """Whatever float field, whatever spelling YAML (or pydantic's reading of text) makes infinite or not a number."""
    (path, is_list), marker = field, "__NOT_FINITE__"
    data = yaml.safe_load(_base_text())
    *parents, leaf = path.split(".")
    node = data
    for k in parents:
        node = node.setdefault(k, {})
    node[leaf] = [0.5, marker] if is_list else marker
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "dep.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False).replace(marker, written))
        with pytest.raises(SpecError) as e:
            spec.load(p)
    msg = str(e.value)
    assert "\n" not in msg and p.name in msg and path in msg and "finite" in msg, msg


def _option_floats():
    from runbook.core import registry

    for stage in registry.stages():
        for name, f in stage.options.model_fields.items():
            kind = specbase.unwrap(f.annotation)
            if kind is float or kind == ("list", float):
                yield stage.options, name, kind is not float


OPTION_FLOATS = sorted(_option_floats(), key=lambda t: (t[0].__name__, t[1]))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OPTION_FLOATS), st.sampled_from(["inf", "-inf", "nan", "NaN", "1e400", float("inf"), float("nan")]))
def test_every_float_flag_must_be_finite(option, value):
    """Every stage's float flag (and notebook parameter): the same model the CLI's flags are generated from."""
    from runbook.core import options
    from runbook.core.errors import InputError

    model, name, is_list = option
    with pytest.raises(InputError) as e:
        options.validate(model, {name: [0.5, value] if is_list else value}, cli=True)
    assert options.flag(model, name) in str(e.value) and "finite" in str(e.value), str(e.value)


# ---- where the model is, and whether SGLang would start it ---------------------------------------

@pytest.mark.parametrize("make, what", [
    (lambda d: None, "does not exist"),
    (lambda d: (d / "cards").mkdir() or (d / "cards" / "nope").write_text("{}"), "is a file, not a directory"),
])
def test_a_relative_model_card_that_is_not_there_names_the_card_and_where_it_resolved(cli, tmp_path, make, what):
    """The card is what the user pointed at: the line names model.card, as written and as resolved against
    the spec's folder (not only model.path, which is a repo id nobody expects to be local)."""
    (tmp_path / "specs").mkdir()
    make(tmp_path)
    p = _spec_file(tmp_path / "specs", lambda t: re.sub(r"(?m)^(\s*card:) \S+", r"\1 ../cards/nope", t))
    cp = cli("kv", "--deployment", p, timeout=60)
    _assert_one_line_error(cp, f"model.card ../cards/nope (resolved to {tmp_path / 'cards' / 'nope'}) {what}")
    assert p.name in cp.stderr and "point model.card at the directory holding config.json" in cp.stderr


@pytest.mark.parametrize("verb", ["kv", "quant"])
def test_a_file_given_as_model_dir_is_called_a_file(cli, tmp_path, verb):
    f = tmp_path / "config.json"
    f.write_text("{}")
    cp = cli(verb, f, timeout=60)
    _assert_one_line_error(cp, f"{f}: a file, not a directory")
    assert "no such directory" not in cp.stderr


def test_service_check_carries_kvs_refusal(cli, tmp_path):
    """TP 3 on the story's 32-head model: kv says SGLang refuses to start; service check's cross-check against the
    KV plan (every other check passing or warning: a context that fits, idle GPUs) must fail on the same refusal."""
    from runbook import service

    p = _spec_file(tmp_path, lambda t: _sub("context-length: 262144", "context-length: 8192")(_sub("  tp: 8\n", "  tp: 3\n")(t)))
    kv = cli("kv", "--deployment", p, "--json", timeout=120)
    assert kv.returncode == 1 and "kv.refused" in {f["id"] for f in json.loads(kv.stdout)["findings"]}, kv.stderr
    d = spec.load(p)
    found = service.cross_checks(d, service.render(d)[0])
    refused = [f for f in found if f.id == "service.kv_refused"]
    assert len(refused) == 1 and refused[0].status == "fail" and "32 is not divisible by 3" in refused[0].title, found
    assert not [f for f in found if f.status == "fail" and f.id != "service.kv_refused"], found   # the refusal alone fails it
