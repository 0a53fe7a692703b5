"""The KLD probe against the real SGLang server on CPU serving the real model (SmolLM2-135M-Instruct, BF16 weights):
the reference (BF16 KV) reproduces its own next-token distributions (the noise floor), and an FP8 E4M3 KV cache
without scales moves them measurably. The reference is the session's BF16 server (real_sglang); its scores are
kept, and written as a record, and the FP8 server is scored against them, as tune's guard would. Small on purpose
(2 windows × 1,024 tokens); benchmarks/kld_fp8_kv.py measures more."""
import numpy as np
import pytest
import yaml

from runbook.accuracy import identity, kld, kldprobe, record, scoring, stage
from runbook.accuracy.settings import AccuracySettings
from runbook.core.spec import load as load_spec
from runbook.demo import realmodel
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer

pytestmark = [pytest.mark.sglang]

WINDOWS, TOKENS = 2, 1024


def settings(url):
    return AccuracySettings.resolve(None, None, probe="kld", url=url, tokenizer=str(realmodel.hf_dir()), kld_windows=WINDOWS,
                                    kld_window_tokens=TOKENS, kld_chunk=256, batch_size=2)


def test_bf16_is_its_own_floor_and_fp8_kv_moves_the_distribution(real_model, real_sglang, real_sglang_fp8, tmp_path):
    wins = scoring.windows(load_tokenizer(realmodel.hf_dir()), WINDOWS, TOKENS)
    s = settings(real_sglang.url)
    scoring.check_fits(real_sglang.url, TOKENS)                   # /v1/models' max_model_len: 8,192
    with pytest.raises(Exception, match="longer than the server's context of 8,192"):
        scoring.check_fits(real_sglang.url, 8193)
    assert scoring.longest_input(real_sglang.url) == 8185       # SGLang keeps 7 of the 8,192 positions for output
    with pytest.raises(Exception, match=r"more input than the server takes in one request \(8,185 ids"):
        scoring.check_fits(real_sglang.url, 8186)
    ref = kldprobe.measure_reference(s, wins, real_sglang.url)
    # The same BF16 server, the same positions at other shapes (chunks over a cached prefix vs one pass; two windows
    # at once): BF16 rounding alone moves the distribution (0.0003 nats measured for the floor used). What the
    # sample guarantees, not a point estimate's side of a line: a KLD is never negative, and the floor's interval stays below the shift
    # that fails a candidate (else nothing could be measured above it). Same top-1 between two BF16 passes is not
    # gated (vLLM's FP8-KV study, PR 54705: ill-posed; the small model's near-ties flip either way).
    for name, floor in ref.floors.items():
        o = floor.overall
        assert o["positions"] == WINDOWS * (TOKENS - 1), name
        assert o["kld_mean"] >= 0 and o["kld_ci"][1] < kld.FAIL_KLD, (name, o)
    # a trained model on real code: perplexity is a meaningful number, far below the vocabulary's 49,152
    assert 1.5 < ref.floors["second_pass"].overall["ppl_ref"] < 30

    cand = run_sync(scoring.score_candidate(scoring.Request(real_sglang_fp8.url, None, s.kld_top_k, s.kld_chunk), ref.scores))
    result = kld.compare(ref.scores, cand)                               # the session's FP8 E4M3 KV server
    used = ref.floor_used
    floor = ref.floors[used]
    v = kld.judge(result, floor)
    o = result.overall
    # measurable, and by more than Q8_0 moves a model: the paired interval's lower bound (every window's excess over
    # the floor; 0.0086-0.0091 nats measured) clears PASS_KLD, so the verdict cannot be pass. PPL ratio and same
    # top-1 are reported, not gated: over 2 × 1,024 tokens their direction is noise's (CI once saw a PPL ratio of 0.99983).
    assert v.excess_ci[0] > kld.PASS_KLD, (o, v)
    assert o["ppl_ratio"] == pytest.approx(o["ppl_cand"] / o["ppl_ref"])
    assert [(b["from"], b["to"]) for b in result.by_depth] == [(1, 128), (128, 512), (512, 1024)]
    f = kldprobe.findings(ref, result, "KV cache dtype: auto vs fp8_e4m3")[1]
    assert f.status == v.status != "pass" and "fp8_e4m3" in f.title
    print(f"\nfloor {floor.overall['kld_mean']:.5f} {floor.overall['kld_ci']}, fp8 excess {v.excess_kld:.5f} {v.excess_ci}, "
          f"windows {result.sums['kld'].sum(axis=1) / result.sums['count'].sum(axis=1)}, ppl ratio {o['ppl_ratio']:.5f}, "
          f"same top-1 {o['same_top1']:.4f}")

    # The recorded reference (accuracy/record.py): SGLang's logprobs are float32, so the file holds them exactly, and
    # the FP8 server compared with the file gets the very figures the live reference gave.
    made = record.made_by(record.model_identity(realmodel.hf_dir()), identity.server_config(real_sglang.url), WINDOWS,
                          TOKENS, s.kld_top_k, s.kld_chunk, real_sglang.url)
    rec = record.read(record.write(tmp_path / "bf16.safetensors", ref, made).path)
    for mine, kept in zip(ref.scores, rec.reference.scores, strict=True):
        assert np.array_equal(mine.top_lp, kept.top_lp) and np.array_equal(mine.actual, kept.actual)
    from_file = kld.compare(rec.reference.scores, cand)
    assert from_file.overall == result.overall and kld.judge(from_file, rec.reference.floors[used]) == v
    assert rec.made["server_info"]["kv_cache_dtype"] in ("auto", "bf16") and rec.made["model"]["weights_sha256"]
    # Per replica (a topology; the spec names the record): each server against the record at its own URL. The BF16
    # server is inside its own record's floor; the one started with an FP8 KV cache is named.
    doc = yaml.safe_load(realmodel.spec_path().read_text())
    port = lambda u: int(u.rsplit(":", 1)[1])       # noqa: E731
    doc["topology"] = {"replicas": [{"name": "bf16", "host": "127.0.0.1", "port": port(real_sglang.url)},
                                    {"name": "fp8", "host": "localhost", "port": port(real_sglang_fp8.url)}]}
    doc["model"]["path"], doc["accuracy"] = str(realmodel.hf_dir()), {"record": rec.path.name}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
    spec = load_spec(tmp_path / "fleet.yaml")
    kl, found = stage._kld_per_replica(spec, AccuracySettings.resolve(spec, None))
    by_id = {f.id: f for f in found}
    assert by_id["accuracy.kld.verdict.bf16"].status == "pass", kl["replicas"]
    assert by_id["accuracy.kld.verdict.fp8"].status != "pass" and "fp8_e4m3" in by_id["accuracy.kld.verdict.fp8"].title
    assert [r["replica"] for r in kl["replicas"]] == ["bf16", "fp8"]
    assert kl["candidate_url"] == real_sglang_fp8.url.replace("127.0.0.1", "localhost")      # the worst replica's document
    print(f"record {rec.bytes:,} bytes; replicas: {kl['replicas']}")
