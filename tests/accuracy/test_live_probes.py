"""Recall and identity against the real CPU engine. A random-weight model scores near zero, so these
assert prompt construction, exact token lengths, scoring and the A/B arithmetic, not accuracy."""
import json

from runbook.accuracy import identity, probes, recall
from runbook.accuracy.settings import AccuracySettings
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer


def test_items_are_deterministic_and_exact(llama):
    tok = load_tokenizer(llama.model_dir)
    a = recall.build_items(AccuracySettings(lengths=[256, 512], depths=[0.1, 0.5, 0.9], seed=7), tok)
    b = recall.build_items(AccuracySettings(lengths=[256, 512], depths=[0.1, 0.5, 0.9], seed=7), tok)
    assert [i.prompt for i in a] == [i.prompt for i in b] and len(a) == 6
    assert [i.prompt_tokens for i in a] == [256] * 3 + [512] * 3
    text = tok.decode(a[2].prompt)
    assert a[2].needle in text and text.index(a[2].needle) > len(text) * 0.6   # depth 0.9 sits late


def test_recall_against_llama_server(llama, tmp_path):
    doc, f = probes.run_recall(AccuracySettings(url=llama.url, lengths=[256, 512], depths=[0.25, 0.75],
                                                 tokenizer=str(llama.model_dir), seed=1, out=str(tmp_path)))
    assert [(c["length"], c["depth"], c["total"]) for c in doc["grid"]] == [(256, 0.25, 1), (256, 0.75, 1), (512, 0.25, 1), (512, 0.75, 1)]
    assert [r["prompt_tokens_server"] for r in doc["results"]] == [256, 256, 512, 512]   # exact lengths on the server
    assert all(r["error"] is None for r in doc["results"])
    assert len((tmp_path / "recall_prompts.jsonl").read_text().splitlines()) == 4
    assert f[0].id == "accuracy.recall.score" and "exact" in f[0].detail


def test_scoring_and_grid_and_ab_arithmetic():
    assert recall.score("48213", " 48213\n# more") and recall.score("48213", "`48213`.")
    assert not recall.score("48213", "4821") and not recall.score("48213", "")
    answers = [(0.1, True), (0.1, False), (0.9, True), (0.9, True)]
    res = [{"id": i, "length": 8, "depth": d, "correct": c} for i, (d, c) in enumerate(answers)]
    assert recall.grid(res) == [{"length": 8, "depth": 0.1, "correct": 1, "total": 2},
                                {"length": 8, "depth": 0.9, "correct": 2, "total": 2}]
    b = [dict(r, correct=False) for r in res]
    ab = recall.paired(res, b)
    assert ab["pairs"] == 4 and ab["recall_a"] == 0.75 and ab["recall_b"] == 0.0 and ab["diff_b_minus_a"] == -0.75
    assert ab["ci95"][1] < 0
    f = {x.id: x for x in recall.findings(recall.grid(b), ab)}
    assert f["accuracy.recall.ab"].status == "warn" and f["accuracy.recall.misses"].status == "warn"
    named = {x.id: x for x in recall.findings(recall.grid(b), ab, tested="KV cache dtype: auto vs fp8_e4m3")}
    assert named["accuracy.recall.ab"].title.endswith("over 4 items — KV cache dtype: auto vs fp8_e4m3")


def test_identity_same_server_is_identical_and_diff_positions(llama):
    rows, f = run_sync(identity.compare(AccuracySettings(max_tokens=16), llama.url, llama.url,
                                        ["def add(a, b):", "SELECT name FROM"], load_tokenizer(llama.model_dir)))
    assert f[0].status == "pass" and all(r["identical"] for r in rows)
    assert identity.first_difference("abcdef", "abcxef") == 3
    assert identity.first_difference("same", "same") is None
    assert identity.first_difference("abc", "abcd") == 3


def test_live_parts_skip_without_endpoints():
    assert probes.run_recall(AccuracySettings(lengths=[8], depths=[0.5]))[1][0].status == "skip"
    assert probes.run_recall(AccuracySettings(url="http://127.0.0.1:9", lengths=[8], depths=[0.5]))[1][0].status == "skip"
    assert probes.run_identity(AccuracySettings(url="http://x")).findings[0].status == "skip"


def test_cli_recall_json_keys(llama, cli):
    cp = cli("accuracy", "recall", "--url", llama.url, "--lengths", "256", "--depths", "0.5", "--tokenizer", llama.model_dir, "--json")
    j = json.loads(cp.stdout)
    assert j["recall"]["grid"] == [{"length": 256, "depth": 0.5, "correct": j["recall"]["grid"][0]["correct"], "total": 1}]
