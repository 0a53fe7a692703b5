"""Stage 50's live probes on a model that can answer: SmolLM2-135M-Instruct on SGLang's CPU server (BF16 KV, and the
story's FP8 E4M3 KV without scales beside it). On random weights recall was never seen to pass and the tool-call
probe never met a model that calls tools; here recall passes at short depths (the probe can pass) and the tool-call
probe says what this model does through SGLang's parser and chat template."""
import pytest

from runbook.accuracy import probes, toolcall
from runbook.accuracy.settings import AccuracySettings
from runbook.demo import realmodel

pytestmark = pytest.mark.sglang


def test_recall_passes_with_bf16_kv_and_fp8_is_measured_beside_it(real_sglang, real_sglang_fp8):
    s = AccuracySettings(probe="recall", url=real_sglang.url, compare_url=real_sglang_fp8.url, lengths=[512, 1024],
                         depths=[0.1, 0.5, 0.9], tokenizer=str(realmodel.hf_dir()))
    doc, findings = probes.run_recall(s)
    a = sum(c["correct"] for c in doc["grid"])
    b = sum(c["correct"] for c in doc["grid_b"])
    assert doc["exact_lengths"] and sum(c["total"] for c in doc["grid"]) == 6
    assert a >= 5, doc["results"]           # the probe can pass: 6/6 here (greedy, CPU)
    assert all(r["error"] is None for r in doc["results"] + doc["results_b"])
    ab = next(f for f in findings if f.id == "accuracy.recall.ab")
    assert "KV cache dtype" in ab.title, ab            # named by what differs, read from both servers
    assert doc["ab"]["recall_a"] == a / 6 and doc["ab"]["recall_b"] == b / 6


def test_toolcall_says_what_this_model_does(real_sglang):
    """SmolLM2's own ChatML template has no tool section: SGLang counts the same prompt with and without the tools,
    so the probe says the model never saw them — a result about this model, not a parser fault."""
    rep = toolcall.run(AccuracySettings(probe="toolcall", url=real_sglang.url, toolcall_max_tokens=16), ["read_file"])
    st = {f.id.rsplit(".", 1)[1]: f for f in rep.findings}
    assert st["template"].status == "warn", rep.template
    assert rep.template["prompt_tokens_with_tools"] == rep.template["prompt_tokens_without_tools"] > 20
    assert [c.error for c in rep.cases] == [None, None]
    assert not any(c.called for c in rep.cases) and st["parsed"].status == "warn"
    assert rep.server.get("tool_call_parser")           # the parser the answers went through, from /server_info
