"""Stage 50 against the real SGLang server on CPU (runbook.demo.sglang), through the entry points the CLI and notebook
50 call (runbook.accuracy.probes, toolcall.run, `runbook accuracy identity`): greedy identity between two
configurations of it, named by what differs in their /server_info; batch invariance; the tool-call probe through
SGLang's own --tool-call-parser; recall within (and beyond) the tiny model's context.

Three SGLang launches: the session's BF16 server (radix cache on, shared with the engine's tests), one with the radix
cache off and the tool-call parser, one with an FP8 KV cache. Each class holds its server, so at most two run at
once. The model has random weights: what is asserted is what the probes report about it, not that it is good."""
import json
import re
from pathlib import Path

import pytest

from runbook.accuracy import identity, probes, toolcall
from runbook.accuracy.settings import AccuracySettings
from runbook.core import SGLANG_VERSION
from runbook.corpus import code_prompts
from runbook.demo import sglang
from runbook.endpoint.reach import fetch_json, run_sync

pytestmark = [pytest.mark.sglang]

PROMPTS = 8
MAX_TOKENS = 32
# The demo model's chat template lists tools and writes calls as <tool_call>{json}</tool_call>: SGLang's qwen25
# parser (reported back as "qwen") reads that format.
PARSER = "qwen25"


def _size(log: Path) -> int:
    return log.stat().st_size


def _since(log: Path, offset: int) -> str:
    with open(log, errors="replace") as f:
        f.seek(offset)
        return f.read()


def _by_id(findings):
    return {f.id: f for f in findings}


@pytest.fixture(scope="class")
def radix_off(tmp_path_factory):
    srv = sglang.start(flags={"disable-radix-cache": True, "tool-call-parser": PARSER},
                       log_path=tmp_path_factory.mktemp("sglang-radix-off") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="class")
def fp8(tmp_path_factory):
    srv = sglang.start(flags={"kv-cache-dtype": "fp8_e4m3"}, log_path=tmp_path_factory.mktemp("sglang-fp8") / "server.log")
    yield srv
    srv.stop()


class TestRadixCacheAndToolCalls:
    def test_radix_cache_on_and_off_give_identical_greedy_output(self, sglang_server, radix_off):
        a, b = sglang_server, radix_off
        # A holds every prompt in its cache
        run_sync(identity.greedy_outputs(AccuracySettings(max_tokens=MAX_TOKENS), a.url, code_prompts()[:PROMPTS]))
        at_a, at_b = _size(a.log), _size(b.log)
        res = probes.run_identity(AccuracySettings(probe="identity", url=a.url, compare_url=b.url, prompts=PROMPTS,
                                                     max_tokens=MAX_TOKENS, tokenizer=str(a.model_dir), batch_size=1))
        f = _by_id(res.findings)["accuracy.identity.mismatch"]
        assert f.status == "pass", (f.title, f.evidence)
        assert f.title == f"greedy outputs identical on all {PROMPTS} prompts — radix cache: on vs off"
        assert [d["key"] for d in res.differences if d["effect"] == "output"] == ["disable_radix_cache"]
        assert "tool_call_parser (None vs qwen)" in f.detail        # differs too, and is said to change nothing here
        assert len(res.rows) == PROMPTS and all(r["identical"] and r["error"] is None for r in res.rows)
        # the check exercised the cache: A prefilled every prompt from cached prefixes, B from none
        hits_a = [int(n) for n in re.findall(r"#cached-token: (\d+)", _since(a.log, at_a))]
        hits_b = [int(n) for n in re.findall(r"#cached-token: (\d+)", _since(b.log, at_b))]
        assert len(hits_a) >= PROMPTS and min(hits_a) > 0, hits_a
        assert hits_b and max(hits_b) == 0, hits_b
        print(f"\nradix on/off: {f.status}: {f.title}")

    def test_batch_invariance_is_its_own_finding(self, sglang_server):
        """Concurrency 1 vs 8 on one server: accuracy under load. Whatever SGLang on CPU does, the finding reports
        it with the prompts that differ."""
        a = sglang_server
        at = _size(a.log)
        res = probes.run_identity(AccuracySettings(url=a.url, prompts=PROMPTS, max_tokens=MAX_TOKENS,
                                                     tokenizer=str(a.model_dir), batch_size=PROMPTS))
        found = _by_id(res.findings)
        assert found["accuracy.identity.endpoint"].status == "skip" and not res.rows      # one server: no pair check
        f = found["accuracy.identity.batch"]
        assert len(res.batch) == PROMPTS and all(r["error"] is None for r in res.batch)
        # the server did batch them: a prefill of several new requests, or one beside running ones, or a decode of several
        assert re.search(r"Prefill batch, #new-seq: ([2-9]|\d\d)|Prefill batch.*#running-req: [1-9]"
                         r"|Decode batch, #running-req: ([2-9]|\d\d)", _since(a.log, at))
        differ = [r["id"] for r in res.batch if not r["identical"]]
        if differ:
            assert f.status == "warn", f
            assert f.title == (f"greedy outputs change under load: {len(differ)} of {PROMPTS} prompts differ between "
                               f"concurrency 1 and {PROMPTS}")
            assert all(f"prompt {i} " in f.evidence for i in differ[:6]) and "deterministic" in f.remedy
        else:
            assert f.status == "pass"
            assert f.title == f"batch invariant: greedy outputs identical at concurrency 1 and {PROMPTS} on all {PROMPTS} prompts"
        print(f"\nbatch invariance: {f.status}: {f.title}; differing prompts {differ}; {f.evidence}")

    def test_tool_call_probe_through_sglangs_parser_reports_the_random_model_failing(self, radix_off):
        rep = toolcall.run(AccuracySettings(url=radix_off.url, toolcall_max_tokens=MAX_TOKENS))
        assert rep.server == {"version": SGLANG_VERSION, "tool_call_parser": "qwen", "grammar_backend": "none"}
        assert len(rep.cases) == 6 and all(c.error is None and not c.called for c in rep.cases)
        found = _by_id(rep.findings)
        p = found["accuracy.toolcall.parsed"]
        assert p.status == "warn" and p.title == "tool calls parsed into tool_calls: 0 of 6 answers pass"
        assert "tool_call_parser: qwen" in p.detail
        # what came back instead of a call is the evidence
        first = rep.cases[0]
        assert first.content_chars > 0 and f"no tool call: the model answered in prose ({first.content_chars} chars, " \
            f"finish {first.finish_reason!r}: {toolcall._came_back(first)})" in p.evidence
        assert {found[k].status for k in ("accuracy.toolcall.arguments", "accuracy.toolcall.finish_reason")} == {"skip"}
        print(f"\ntool calls (auto): {p.status}: {p.title}; {p.evidence[:200]}")

        # tool_choice=required needs SGLang's grammar backend, which the CPU flags turn off: a finding, not a crash
        req = toolcall.run(AccuracySettings(url=radix_off.url, toolcall_max_tokens=MAX_TOKENS, tool_choice="required"),
                           tools=["read_file"])
        r = _by_id(req.findings)["accuracy.toolcall.requests"]
        assert r.status == "fail" and r.title == "2 of 2 tool-call requests failed"
        assert "HTTP 400" in r.evidence and "--grammar-backend none" in r.evidence and r.remedy == toolcall.GRAMMAR_REMEDY
        print(f"tool calls (required): {r.status}: {r.title}")


class TestFP8KV:
    def test_fp8_kv_vs_bf16_differs_and_is_named_by_the_kv_dtype(self, sglang_server, fp8, cli):
        """The story on a real server: `runbook accuracy identity` between an FP8-KV server (no scales) and a BF16 one."""
        log = fp8.log.read_text()
        assert "Using FP8 KV cache but no scaling factors provided" in log and "dtype: torch.float8_e4m3fn" in log
        cp = cli("accuracy", "identity", "--deployment", sglang.spec_path(), "--url", fp8.url, "--compare-url",
                 sglang_server.url, "--tokenizer", sglang_server.model_dir, "--prompts", PROMPTS, "--max-tokens", MAX_TOKENS,
                 "--batch-size", 1, "--json")
        j = json.loads(cp.stdout)
        f = _by_id_dict(j["findings"])["accuracy.identity.mismatch"]
        differ = [r for r in j["identity"] if not r["identical"]]
        assert differ, "FP8 KV gave BF16's greedy output on every prompt"
        # the verdict is the KL divergence's against the reference's noise floor; identity says where outputs part
        kv = _by_id_dict(j["findings"])["accuracy.kld.verdict"]
        assert kv["status"] in ("warn", "fail") and kv["title"].endswith("KV cache dtype: auto vs fp8_e4m3"), kv
        assert cp.returncode == (1 if kv["status"] == "fail" else 0)
        assert f["status"] == "info" and f"accuracy.kld.verdict: {kv['status']}" in f["detail"]
        assert f["title"] == f"greedy outputs differ on {len(differ)} of {PROMPTS} prompts — KV cache dtype: fp8_e4m3 vs auto"
        assert "speculative" not in (kv["remedy"] + f["remedy"]).lower()
        assert [d["key"] for d in j["identity_differences"] if d["effect"] == "output"] == ["kv_cache_dtype"]
        assert all(f"prompt {r['id']} " in f["evidence"] for r in differ[:6])
        assert all(r["first_diff"] is not None and r["error"] is None for r in differ)
        print(f"\nFP8 vs BF16: {f['status']}: {f['title']}\n  evidence: {f['evidence']}\n  remedy: {f['remedy']}")

    def test_recall_on_the_real_server_with_an_fp8_ab(self, sglang_server, fp8):
        ctx = fetch_json(sglang_server.url + "/v1/models")["data"][0]["max_model_len"]
        lengths = [512, 1024, ctx + 256]          # the last beyond the model's context: SGLang refuses it
        doc, fs = probes.run_recall(AccuracySettings(url=sglang_server.url, lengths=lengths, depths=[0.5],
                                                    tokenizer=str(sglang_server.model_dir), compare_url=fp8.url, seed=3))
        res = doc["results"]
        assert [r["prompt_tokens_server"] for r in res[:2]] == [512, 1024] and all(r["error"] is None for r in res[:2])
        assert res[2]["error"] and not res[2]["correct"]
        found = _by_id(fs)
        assert found["accuracy.recall.errors"].status == "fail"
        assert found["accuracy.recall.errors"].title == "1 of 3 recall requests failed (counted as misses)"
        assert f"{ctx + 256} tokens:" in found["accuracy.recall.errors"].evidence
        correct = sum(r["correct"] for r in res)
        assert found["accuracy.recall.score"].title.startswith(f"recall {correct}/3 ")
        assert doc["ab"]["pairs"] == 3 and found["accuracy.recall.ab"].title.startswith("A/B recall: B − A = ")
        assert found["accuracy.recall.ab"].title.endswith(" — KV cache dtype: auto vs fp8_e4m3")     # what the A/B compared
        print(f"\nrecall: {found['accuracy.recall.score'].title}; errors: {found['accuracy.recall.errors'].evidence[:160]}; "
              f"{found['accuracy.recall.ab'].title}")


def _by_id_dict(findings):
    return {f["id"]: f for f in findings}
