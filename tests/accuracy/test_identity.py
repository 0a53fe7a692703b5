"""Greedy identity's findings name the difference actually tested, read from the two servers' /server_info: scripted
servers that answer /server_info as SGLang 0.5.23 does (its keys) and stream fixed completions, and the
classification of /server_info differences on its own."""
import json

import pytest
from aiohttp import web
from bench.rawsse import RawServer, Reply, sse

from runbook.accuracy import identity, probes
from runbook.accuracy.settings import AccuracySettings
from runbook.core.secrets import MASK
from runbook.corpus import code_prompts
from runbook.endpoint.reach import run_sync

PROMPTS = code_prompts()[:4]
# A few of the 556 keys SGLang 0.5.23's /server_info returns, as a BF16 server on CPU reports them.
BASE = {"version": "0.5.23", "model_path": "/m/tiny", "dtype": "bfloat16", "kv_cache_dtype": "auto",
        "quantization": None, "speculative_algorithm": None, "speculative_num_steps": None, "disable_radix_cache": False,
        "attention_backend": "torch_native", "chunked_prefill_size": 4096, "tool_call_parser": None, "port": 30000,
        "random_seed": 1, "api_key": None, "max_total_num_tokens": 176038, "mem_fraction_static": 0.02,
        "internal_states": [{"memory_usage": {"kvcache": 0.336, "token_capacity": 176038}}]}
FP8 = dict(BASE, kv_cache_dtype="fp8_e4m3", port=30001, random_seed=2, max_total_num_tokens=352076,
           internal_states=[{"memory_usage": {"kvcache": 0.336, "token_capacity": 352076}}])


class InfoServer(RawServer):
    """Streams `texts[i]` for the i-th prompt of PROMPTS and answers GET /server_info with `info` (None: 404, as
    llama-server)."""

    def __init__(self, texts, info):
        super().__init__(self._reply, real_gap_s=0.0)
        self.texts, self.info = texts, info

    def _reply(self, body):
        text = self.texts[PROMPTS.index(body["prompt"])]
        return Reply([(0.0, sse({"choices": [{"index": 0, "text": text, "finish_reason": None}]})),
                      (0.0, sse({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": len(text.split())}})),
                      (0.0, b"data: [DONE]\n\n")])

    async def _any(self, request):
        if request.method == "GET" and request.path == "/server_info":
            self.seen.append((request.method, request.path))
            return web.json_response(self.info) if self.info is not None else web.Response(status=404)
        return await super()._any(request)


@pytest.fixture
def servers():
    started = []

    def start(texts, info):
        s = InfoServer(texts, info).start()
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


SAME = ["one two three", "four five six", "seven eight", "nine ten"]
OTHER = ["one two three", "four FIVE six", "seven eight", "nine TEN"]


def test_fp8_vs_bf16_is_named_the_kv_dtype_not_speculative_decoding(servers):
    """The story's servers differ in their KV dtype: the finding and its remedy say so (they once blamed speculative
    decoding whatever the servers differed in)."""
    a, b = servers(SAME, BASE), servers(OTHER, FP8)
    rows, (f,) = run_sync(identity.compare(AccuracySettings(max_tokens=8), a.url, b.url, PROMPTS))
    assert f.status == "fail" and f.title.startswith("greedy outputs differ on 2 of 4 prompts")
    assert "KV cache dtype: auto vs fp8_e4m3" in f.title
    assert "KV cache dtype" in f.remedy and "speculative" not in f.remedy.lower(), f.remedy
    assert "prompt 1 " in f.evidence and "prompt 3 " in f.evidence and "prompt 0 " not in f.evidence
    assert [r["identical"] for r in rows] == [True, False, True, False] and PROMPTS[1].startswith(rows[1]["prompt"])
    assert ("GET", "/server_info") in a.seen and ("GET", "/server_info") in b.seen
    # what the pool size and the seed say is no part of what was tested
    assert "max_total_num_tokens" not in f.title and "random_seed" not in f.title


def test_entry_point_carries_the_differences_and_a_batch_finding_of_its_own(servers):
    spec = dict(BASE, speculative_algorithm="EAGLE", speculative_num_steps=3)
    a, b = servers(OTHER, spec), servers(SAME, BASE)
    res = probes.run_identity(AccuracySettings(probe="identity", url=a.url, compare_url=b.url, prompts=4, max_tokens=8, batch_size=4))
    f = {x.id: x for x in res.findings}
    mism = f["accuracy.identity.mismatch"]
    assert mism.status == "fail" and "speculative decoding: EAGLE vs off" in mism.title
    assert mism.remedy.startswith("Speculative decoding changed greedy output")
    assert {d["key"] for d in res.differences if d["effect"] == "output"} == {"speculative_algorithm", "speculative_num_steps"}
    # a scripted server answers the same text at any concurrency
    assert f["accuracy.identity.batch"].status == "pass" and len(res.batch) == 4
    assert "concurrency 1 and 4" in f["accuracy.identity.batch"].title


def test_batch_variance_is_a_warn_naming_the_prompts(servers):
    calls = {"n": 0}
    a = servers(SAME, BASE)
    orig = a._reply

    def flaky(body):   # the second pass (the concurrent one) answers prompt 2 differently
        calls["n"] += 1
        r = orig(body)
        if calls["n"] > len(PROMPTS) and PROMPTS.index(body["prompt"]) == 2:
            r = InfoServer(["", "", "seven EIGHT", ""], None)._reply(body)
        return r
    a.handler = flaky
    res = probes.run_identity(AccuracySettings(url=a.url, prompts=4, max_tokens=8, batch_size=4))
    f = {x.id: x for x in res.findings}
    assert f["accuracy.identity.endpoint"].status == "skip"          # no second server: no pair check
    bf = f["accuracy.identity.batch"]
    assert bf.status == "warn" and bf.title == "greedy outputs change under load: 1 of 4 prompts differ between concurrency 1 and 4"
    assert bf.evidence.startswith("prompt 2 ") and "first differing character 6" in bf.evidence
    assert "deterministic" in bf.remedy


def test_a_server_without_server_info_makes_the_difference_unknown(servers):
    a, b = servers(SAME, None), servers(OTHER, BASE)
    rows, (f,) = run_sync(identity.compare(AccuracySettings(max_tokens=8), a.url, b.url, PROMPTS))
    assert f.status == "fail" and "what differs is unknown" in f.title
    assert a.url in f.remedy and "speculative" not in f.remedy.lower()


def _diff(**changes):
    return identity.config_differences(BASE, dict(BASE, **changes))


@pytest.mark.parametrize(("changes", "tested", "remedy_start"), [
    ({"disable_radix_cache": True}, "radix cache: on vs off", "Prefix caching must not change greedy output"),
    ({"version": "0.5.24"}, "SGLang version: 0.5.23 vs 0.5.24", "Greedy output changed between SGLang versions"),
    ({"attention_backend": "triton"}, "kernels: torch_native vs triton", "Different kernels round differently"),
    ({"enable_torch_compile": True}, "enable_torch_compile: None vs True", "The servers differ in enable_torch_compile"),
    ({"port": 1, "random_seed": 9, "tool_call_parser": "qwen"}, "no difference in their configuration",
     "Both servers report the same configuration"),
])
def test_each_difference_gets_its_own_words_and_remedy(changes, tested, remedy_start):
    d = _diff(**changes)
    assert identity.tested_difference(d) == tested
    assert identity.remedy_for(d).startswith(remedy_start)


def test_two_differences_are_both_named_and_the_remedy_says_so():
    d = _diff(kv_cache_dtype="fp8_e4m3", speculative_algorithm="EAGLE")
    assert identity.tested_difference(d) == "KV cache dtype: auto vs fp8_e4m3; speculative decoding: off vs EAGLE"
    r = identity.remedy_for(d)
    assert r.startswith("The servers differ in more than one way (KV cache dtype, speculative decoding)") and "KV cache" in r


def test_auto_kv_dtype_resolved_differently_is_found_by_bytes_per_token():
    """Both say `--kv-cache-dtype auto`, but one pool holds half the bytes per token: `auto` took a checkpoint's
    FP8 (the story)."""
    a = dict(BASE, kv_bytes_per_token=identity.kv_bytes_per_token(BASE))
    b = dict(FP8, kv_cache_dtype="auto", kv_bytes_per_token=identity.kv_bytes_per_token(FP8))
    assert (a["kv_bytes_per_token"], b["kv_bytes_per_token"]) == (2048, 1024)
    d = identity.config_differences(a, b)
    assert identity.tested_difference(d) == "KV cache dtype (bytes per token): 2,048 B/token vs 1,024 B/token"
    assert identity.remedy_for(d).startswith("The KV cache dtype changed greedy output")


def test_secrets_in_server_info_never_show(servers):
    key = "sk-live-0123456789abcdef"
    launch = f"python -m sglang.launch_server --api-key {key} --port 30000"
    a = servers(SAME, dict(BASE, api_key=key, admin_api_key=key, launch_command=launch))
    b = servers(OTHER, dict(BASE, api_key=key + "x", launch_command=launch.replace("30000", "30001")))
    rows, (f,) = run_sync(identity.compare(AccuracySettings(max_tokens=8), a.url, b.url, PROMPTS))
    d = identity.config_differences(identity.server_config(a.url), identity.server_config(b.url))
    text = json.dumps([f.to_dict(), d, rows])
    assert key[:10] not in text and MASK in json.dumps(d)     # not even the start of it


def test_identity_is_information_where_the_kl_divergence_judged_the_same_pair():
    """On a real model greedy identity fails under any numeric change; where the KLD judged the same two servers its
    mismatch becomes where outputs part (info), the verdict the KLD's. Without a KLD verdict, identity still judges."""
    from runbook.accuracy.probes import judged_by_kld
    from runbook.core.findings import Finding

    ident = [Finding("accuracy.identity.mismatch", "fail", "greedy outputs differ on 5 of 8 prompts", remedy="r"),
             Finding("accuracy.identity.batch", "fail", "batch")]
    for st in ("pass", "warn", "fail"):
        got = judged_by_kld(ident, [Finding("accuracy.kld.verdict", st, "kld")])
        assert (got[0].status, got[0].remedy) == ("info", "") and f"accuracy.kld.verdict: {st}" in got[0].detail
        assert got[1].status == "fail"                       # batch invariance is its own question
    assert judged_by_kld(ident, []) == ident
    assert judged_by_kld(ident, [Finding("accuracy.kld.endpoint", "skip", "no")]) == ident
