"""The KLD probe (probes.run_kld, `runbook accuracy kld`) against fake SGLang servers whose next-token distributions
are known: what it reports equals the KLD computed straight from the two models, and every broken answer (no
logprobs, NaN, another token id echoed, ragged top-k, a named id missing, no /generate, a window longer than the
context, an unreachable server) is one finding or one error line, never a crash."""
import json
import socket

import numpy as np
import pytest
from tokenizers import Tokenizer

from accuracy.fake_generate import Model, serve, truth
from runbook.accuracy import kld, probes, scoring
from runbook.accuracy.settings import AccuracySettings
from runbook.core.errors import InputError

WINDOWS, LENGTH, TOP_K, CHUNK = 3, 200, 5, 64


def settings(url, ref, tokdir, **kw):
    return AccuracySettings.resolve(None, None, **{"probe": "kld", "url": url, "compare_url": ref, "tokenizer": str(tokdir),
                                                   "kld_windows": WINDOWS, "kld_window_tokens": LENGTH, "kld_top_k": TOP_K,
                                                   "kld_chunk": CHUNK, "batch_size": 2, **kw})


def vocab(tokdir):
    return Tokenizer.from_file(str(tokdir / "tokenizer.json")).get_vocab_size()


def test_the_probe_reports_the_kld_of_the_two_models(tokdir):
    ref_m, cand_m = Model(vocab(tokdir)), Model(vocab(tokdir), shift=0.15)
    with serve(ref_m) as (ref, seen_ref), serve(cand_m, kv="fp8_e4m3") as (cand, seen_cand):
        doc, findings = probes.run_kld(settings(cand, ref, tokdir))
    by_id = {f.id: f for f in findings}
    wins = scoring.windows(Tokenizer.from_file(str(tokdir / "tokenizer.json")), WINDOWS, LENGTH)
    want = truth(ref_m, cand_m, wins, TOP_K)
    c = doc["candidate"]["overall"]
    assert c["positions"] == WINDOWS * (LENGTH - 1)
    assert c["kld_mean"] == pytest.approx(want.mean(), rel=1e-9)
    assert c["kld_max"] == pytest.approx(want.max(), rel=1e-9)
    assert c["kld_share_above"] == (want > kld.TAIL_KLD).mean()                # the tail, counted
    assert doc["floor"]["overall"]["kld_mean"] == 0 and doc["floor"]["overall"]["same_top1"] == 1
    assert doc["floor_batch"]["overall"]["kld_mean"] == 0
    assert [(b["from"], b["to"]) for b in doc["candidate"]["by_depth"]] == [(1, 128), (128, 200)]
    assert by_id["accuracy.kld.floor"].status == "info"
    v = by_id["accuracy.kld.verdict"]
    assert v.status == doc["verdict"]["status"] != "pass"
    assert "KV cache dtype: auto vs fp8_e4m3" in v.title
    # the reference: one request per window; the candidate: ceil(199 / 64) chunks of positions per window
    assert sum(p == "/generate" for p, _ in seen_ref) == WINDOWS + 2 * WINDOWS * 4
    assert sum(p == "/generate" for p, _ in seen_cand) == WINDOWS * 4


def test_the_same_model_is_inside_the_floor(tokdir):
    m = Model(vocab(tokdir))
    with serve(m) as (ref, _), serve(Model(vocab(tokdir))) as (cand, _):
        doc, findings = probes.run_kld(settings(cand, ref, tokdir))
    assert doc["candidate"]["overall"]["kld_mean"] == 0
    assert {f.id: f.status for f in findings}["accuracy.kld.verdict"] == "pass"


@pytest.mark.parametrize("mode,match", [
    ("no_logprobs", "no input_token_logprobs"),
    ("nan", "logprob nan"),
    ("echo", "echoed token id"),
    ("ragged", "entries, 5 asked for"),
    ("missing_named", "no logprob for token id"),
])
def test_a_broken_candidate_answer_is_one_finding(tokdir, mode, match):
    with serve(Model(vocab(tokdir))) as (ref, _), serve(Model(vocab(tokdir)), mode=mode) as (cand, _):
        doc, findings = probes.run_kld(settings(cand, ref, tokdir, kld_windows=1))
    assert doc == {} and len(findings) == 1
    f = findings[0]
    assert (f.id, f.status) == ("accuracy.kld.scoring", "fail")
    assert match in f.detail and "\n" not in f.detail and cand in f.detail


def test_a_server_without_generate_is_a_skip_saying_why(tokdir):
    """llama-server has no /generate and returns logprobs of generated tokens only."""
    with serve(Model(vocab(tokdir))) as (ref, _), serve(Model(vocab(tokdir)), generate=False) as (cand, _):
        _, findings = probes.run_kld(settings(cand, ref, tokdir))
    (f,) = findings
    assert (f.id, f.status) == ("accuracy.kld.scoring", "skip")
    assert "cannot score prompt tokens" in f.title and "llama-server" in f.remedy


def test_a_window_longer_than_the_context_is_refused_before_any_request(tokdir):
    with serve(Model(vocab(tokdir))) as (ref, seen_ref), serve(Model(vocab(tokdir)), context=128) as (cand, seen_cand), \
            pytest.raises(InputError, match=r"200-token window is longer than the server's context of 128 tokens") as e:
        probes.run_kld(settings(cand, ref, tokdir))
    assert "\n" not in str(e.value)
    assert not any(p == "/generate" for p, _ in seen_ref + seen_cand)


def test_a_window_the_server_keeps_no_room_for_is_refused(tokdir):
    """SGLang takes fewer input ids than its context: 0.5.23 refuses len(input_ids) >= max_req_input_len."""
    with serve(Model(vocab(tokdir))) as (ref, _), serve(Model(vocab(tokdir)), context=205) as (cand, seen), \
            pytest.raises(InputError, match=r"200-token window is more input than the server takes in one request \(198 ids"):
        probes.run_kld(settings(cand, ref, tokdir))
    assert not any(p == "/generate" for p, _ in seen)
    with serve(Model(vocab(tokdir))) as (ref, _):
        assert scoring.longest_input(ref) == 4096 - 7


def test_an_unreachable_candidate_is_a_skip(tokdir):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    with serve(Model(vocab(tokdir))) as (ref, _):
        doc, findings = probes.run_kld(settings(dead, ref, tokdir))
    (f,) = findings
    assert (f.id, f.status) == ("accuracy.kld.endpoint", "skip") and dead in f.title


def test_without_two_endpoints_or_a_tokenizer_it_skips(tokdir):
    assert probes.run_kld(settings("http://127.0.0.1:1", None, tokdir))[1][0].id == "accuracy.kld.endpoint"
    s = AccuracySettings.resolve(None, None, probe="kld", url="http://127.0.0.1:1", compare_url="http://127.0.0.1:2")
    (f,) = probes.run_kld(s)[1]
    assert f.status == "skip" and "tokenizer" in f.title


def test_a_corpus_too_short_for_the_windows_is_an_input_error(tokdir):
    tok = Tokenizer.from_file(str(tokdir / "tokenizer.json"))
    with pytest.raises(InputError, match="lower kld_windows or kld_window_tokens"):
        scoring.windows(tok, 10_000, 10_000)


def test_the_api_key_never_appears_in_an_error(tokdir, monkeypatch):
    monkeypatch.setenv("KLD_TEST_KEY", "sk-very-secret-123")
    rq = scoring.Request("http://127.0.0.1:1/sk-very-secret-123", "sk-very-secret-123", 5)
    with pytest.raises(scoring.ScoringError) as e:
        from runbook.endpoint.reach import run_sync
        run_sync(scoring.score_reference(rq, [[1, 2, 3]]))
    assert "sk-very-secret-123" not in str(e.value)


def test_parse_checks_every_field():
    ok = {"meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None]],
                        "input_top_logprobs": [None, [[-0.1, 7, None], [-2.0, 2, None]]]}}
    actual, top_ids, top_lp, _ = scoring.parse(ok, "u", [1, 2], 0, 2, None)
    assert actual.tolist() == [-0.5] and top_ids.tolist() == [[7, 2]] and np.allclose(top_lp, [[-0.1, -2.0]])
    later = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-0.7, 3, None]],      # start 1: its entry is null
                           "input_top_logprobs": [None, [[-0.2, 3, None], [-1.9, 4, None]]]}}
    assert scoring.parse(later, "u", [1, 2, 3], 1, 2, None)[0].tolist() == [-0.7]
    for doc, match in (({"text": "x"}, "no meta_info"),
                       ({"meta_info": {**ok["meta_info"], "input_top_logprobs": [None]}}, "ragged"),
                       ({"meta_info": {**ok["meta_info"], "input_token_logprobs": [[None, 1], ["x", 2]]}}, "logprob 'x'"),
                       ({"meta_info": {**ok["meta_info"], "input_token_logprobs": [[None, 1], [-1.0, "2"]]}},
                        "not \\[logprob, token_id, text\\]")):
        with pytest.raises(scoring.ScoringError, match=match):
            scoring.parse(doc, "u", [1, 2], 0, 2, None)


def test_cli_kld_json(cli, tokdir):
    ref_m, cand_m = Model(vocab(tokdir)), Model(vocab(tokdir), shift=0.15)
    with serve(ref_m) as (ref, _), serve(cand_m) as (cand, _):
        r = cli("accuracy", "kld", "--url", cand, "--compare-url", ref, "--tokenizer", tokdir, "--kld-windows", WINDOWS,
                "--kld-window-tokens", LENGTH, "--kld-top-k", TOP_K, "--batch-size", 1, "--json")
    doc = json.loads(r.stdout)
    assert {f["id"] for f in doc["findings"]} == {"accuracy.kld.floor", "accuracy.kld.verdict"}
    assert doc["kld"]["floor_batch"] is None and doc["kld"]["candidate"]["overall"]["positions"] == WINDOWS * (LENGTH - 1)
    status = doc["kld"]["verdict"]["status"]
    assert status in ("warn", "fail") and r.returncode == (1 if status == "fail" else 0)
    assert set(doc["kld"]["candidate"]) >= {"overall", "by_depth", "top_k", "truncation", "window_kld_sum"}
    assert doc["kld"]["verdict"]["thresholds"]["fail_kld"] == kld.FAIL_KLD


def test_identity_judges_its_a_b_by_kld_too(tokdir):
    """`accuracy identity`: greedy identity stays the first-divergence finding; the KLD verdict comes with it."""
    from runbook.accuracy.stage import STAGE, AccuracyOptions

    with serve(Model(vocab(tokdir))) as (ref, _), serve(Model(vocab(tokdir), shift=0.15)) as (cand, _):
        o = AccuracyOptions(probe="identity", url=cand, compare_url=ref, tokenizer=str(tokdir), kld_windows=1,
                            kld_window_tokens=LENGTH, kld_top_k=TOP_K, batch_size=1, prompts=1, max_tokens=4)
        out = STAGE.actions["identity"](None, o)
    ids = {f.id for f in out.findings}
    assert {"accuracy.identity.mismatch", "accuracy.kld.floor", "accuracy.kld.verdict"} <= ids
    assert out.payload["kld"]["reference_url"] == ref and out.payload["kld"]["candidate_url"] == cand


def test_kld_defaults_to_the_deployments_server_and_tokenizer(tmp_path, tokdir):
    from runbook.core import spec as specmod
    from runbook.demo import realmodel

    dep = specmod.load(realmodel.spec_path())
    model = tmp_path / "m"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((tokdir / "tokenizer.json").read_bytes())
    dep = dep.model_copy(update={"model": dep.model.model_copy(update={"path": str(model)})})
    s = AccuracySettings.resolve(dep, None, probe="kld", compare_url="http://127.0.0.1:9")
    assert (s.url, s.tokenizer) == (dep.serving.local_url, str(model))
    assert AccuracySettings.resolve(dep, None, probe="report").tokenizer is None     # other probes: unchanged


def test_the_run_summary_takes_the_kld_figures():
    from runbook.accuracy.stage import figures

    data = {"kld": {"candidate": {"overall": {"kld_mean": 0.0123456789, "same_top1": 0.95, "ppl_ratio": 1.0123}}}}
    assert figures(data) == {"kld_mean": 0.012346, "kld_same_top1": 0.95, "kld_ppl_ratio": 1.0123}
    assert figures({"kld": {}}) == {}
