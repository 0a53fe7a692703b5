import json

import pytest

from runbook.bench import level_findings, regression, workloads
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.demo import llama as demo


@pytest.fixture(scope="module")
def tok():
    return demo.train_tokenizer(vocab_size=2048)


def test_random_semantics(tok):
    wl = workloads.build("random", 200, input_len=64, range_ratio=0.25, tokenizer=tok, seed=1)
    lens = [len(r.prompt) for r in wl.requests]
    assert min(lens) >= 48 and max(lens) <= 80 and wl.exact_lengths
    assert all(r.prompt_tokens == len(r.prompt) for r in wl.requests)
    exact = workloads.build("random", 5, input_len=64, tokenizer=tok)
    assert {len(r.prompt) for r in exact.requests} == {64}
    approx = workloads.build("random", 3, input_len=10)   # no tokenizer: words, lengths unknown
    assert not approx.exact_lengths and approx.requests[0].prompt_tokens is None


def test_code_prompts_are_shipped_and_counted(tok):
    wl = workloads.build("code", 30, tokenizer=tok)
    assert len({r.prompt for r in wl.requests}) == len(workloads.code_prompts()) >= 20
    assert all(r.prompt_tokens and r.prompt_tokens > 10 for r in wl.requests)


def test_longctx_chat_text_fits_exactly(tok):
    wl = workloads.build("longctx", 2, input_len=300, tokenizer=tok, chat=True)
    for r in wl.requests:
        n = len(tok.encode(r.prompt, add_special_tokens=False).ids)
        assert 295 <= n <= 300 and r.prompt_tokens == n
    assert wl.requests[0].prompt != wl.requests[1].prompt   # different offsets: no shared prefix


def test_prefix_workload_shares_its_system_prompt(tok):
    wl = workloads.build("prefix", 4, input_len=200, tokenizer=tok, chat=True)
    systems = {r.prompt[0]["content"] for r in wl.requests}
    users = {r.prompt[1]["content"] for r in wl.requests}
    assert len(systems) == 1 and len(users) == 4


def test_file_workload_and_errors(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": [1, 2, 3], "max_tokens": 5}) + "\n")
    wl = workloads.build(str(f), 3)
    assert [r.prompt for r in wl.requests] == ["a", [1, 2, 3], "a"] and wl.requests[1].max_tokens == 5
    f.write_text("{bad\n")
    with pytest.raises(InputError, match=r"w.jsonl:1: not JSON"):
        workloads.build(str(f), 1)
    with pytest.raises(InputError, match="not random|code|longctx|prefix"):
        workloads.build("nonsense", 1)


def _lv(label, c, tok_s, tpot, failed=0, bound=False, errors=None):
    return {"label": label, "concurrency": c, "rate": None, "completed": 10, "failed": failed, "error_rate": failed / 10,
            "errors": errors or {}, "output_tok_s": tok_s, "tpot_ms": {"p50": tpot, "p99": tpot}, "ttft_ms": {"p50": 1, "p99": 2},
            "e2e_ms": {"p99": 3}, "client_bound": bound, "lag_ms": {"p99": 40.0}, "cpu_share": 0.95,
            "output_tokens": 100, "output_tokens_client": 100, "output_token_discrepancy": 0, "count_sources": ["usage"]}


def test_regressions_against_previous():
    prev = {"levels": [_lv("c1", 1, 100.0, 10.0), _lv("c8", 8, 500.0, 20.0)]}
    cur = {"levels": [_lv("c1", 1, 98.0, 10.2), _lv("c8", 8, 400.0, 26.0)]}
    f = {x.id: x for x in regression.compare_previous(cur, prev, 10)}
    assert set(f) == {"bench.regression.c8", "bench.regression.tpot.c8"} and "down 20%" in f["bench.regression.c8"].title
    assert regression.compare_previous(prev, prev, 10)[0].status == "pass"
    assert regression.compare_previous(cur, None, 10)[0].status == "info"


def test_level_findings():
    lv = _lv("c4", 4, 10.0, 1.0, failed=2, bound=True, errors={"timeout": 2})
    f = {x.id: x for x in level_findings.level_findings([lv], "random", None)}
    assert f["bench.workload"].status == "warn"
    assert f["bench.errors.c4"].status == "fail" and "timeout: 2" in f["bench.errors.c4"].evidence
    assert f["bench.client_bound.c4"].status == "warn"
    assert f["bench.peak"].status == "info"


def test_regression_check_refuses_other_work():
    prev = {"workload": "code", "corpus_version": "code-0", "input_len": 1024, "output_len": 256, "chat": False,
            "levels": [_lv("c1", 1, 100.0, 10.0)]}
    cur = dict(prev, corpus_version=workloads.build("code", 1).corpus_version, levels=[_lv("c1", 1, 50.0, 20.0)])
    (f,) = regression.compare_previous(cur, prev, 10)
    assert f.status == "skip" and "'code-0' then" in f.detail
    same = dict(prev, corpus_version=cur["corpus_version"])
    assert {x.id for x in regression.compare_previous(cur, same, 10)} == {"bench.regression.c1", "bench.regression.tpot.c1"}


def test_code_workloads_are_byte_identical_and_versioned(tmp_path):
    from runbook import corpus

    a, b = workloads.build("prefix", 3, input_len=256), workloads.build("prefix", 3, input_len=256)
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert a.corpus_version == corpus.VERSION == workloads.build("longctx", 1).corpus_version
    assert workloads.build("random", 1, seed=3).corpus_version == "random-seed3"
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": "hi"}\n')
    v1 = workloads.build(str(f), 1).corpus_version
    f.write_text('{"prompt": "ho"}\n')
    assert v1.startswith("file-") and workloads.build(str(f), 1).corpus_version != v1


def test_evaluate_compares_with_the_archive(tmp_path, monkeypatch):
    """bench.evaluate (CLI and notebook) reads the newest archived run of the deployment."""
    from conftest import DEFAULT_SPEC

    from runbook.bench import run as bench_run
    from runbook.core import spec

    dep = spec.load(DEFAULT_SPEC)
    cur = {"workload": "code", "corpus_version": "code-1", "input_len": 2048, "output_len": 512, "chat": False,
           "levels": [_lv("c1", 1, 50.0, 10.0)]}
    monkeypatch.setattr(bench_run, "run", lambda o, slo=None: bench_run.BenchResult(dict(cur), []))
    run_dir = tmp_path / "20260101T000000Z-x"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"deployment": dep.name, "started": "2026-01-01T00:00:00Z"}))
    (run_dir / "40_benchmark.results.json").write_text(json.dumps({"data": dict(cur, levels=[_lv("c1", 1, 100.0, 10.0)])}))
    res = bench.assess(dep, BenchSettings.resolve(dep), archive_root=tmp_path)
    assert [f.id for f in res.findings] == ["bench.regression.c1"] and res.summary["previous_run"]["corpus_version"] == "code-1"
    assert [f.status for f in bench.assess(dep, BenchSettings.resolve(dep), archive_root=tmp_path / "empty").findings] == ["info"]
    assert bench.assess(dep, BenchSettings.resolve(dep), archive_root=None).findings == []   # no archive: not compared
