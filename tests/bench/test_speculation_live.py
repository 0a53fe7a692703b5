"""The speculation study on llama-server with the real model (SmolLM2-135M-Instruct Q4_1) and n-gram drafting:
real text and random tokens give different acceptance, the figure the story never measured. Small on purpose (a few
short requests: CI runs the whole suite on 2 cores); benchmarks/speculation_real_vs_random.py measures the full table."""
import pytest

from runbook.bench import speculation_study
from runbook.bench.settings import BenchSettings

pytestmark = pytest.mark.llama

# n-gram lookup over the prompt and the output so far: 3-token keys, drafts of up to 8 (no second model)
MODE = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
# greedy on a fixed model, prompts and binary: the counts repeat run to run; the gap measured on these prompts
# (benchmarks/speculation_real_vs_random.py) is far wider than this
ACCEPT_GAP = 0.25


@pytest.fixture(scope="module")
def ngram_server(real_model, tmp_path_factory):
    from runbook.demo import llama as demo
    from runbook.demo import realmodel

    exe = demo.llama_server_path()
    if not exe.is_file():
        pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    d = tmp_path_factory.mktemp("smollm2-gguf")
    (d / "model.gguf").symlink_to(realmodel.gguf_path())        # start_llama_server serves DIR/model.gguf
    # --no-repack: the Q4_1 repack path of this llama.cpp segfaults at start-up on these CPUs
    srv = demo.start_llama_server(exe, d, parallel=1, ctx=2048, threads=1, ready_timeout=180,
                                  extra_args=["--no-repack", *MODE])
    yield srv
    srv.stop()


def test_real_text_and_random_tokens_give_different_acceptance(ngram_server, real_model):
    from runbook.demo import realmodel

    o = BenchSettings.resolve(None, url=ngram_server.url, speculation=True, speculation_contexts=[256],
                              speculation_requests=2, output_len=32, tokenizer=str(realmodel.hf_dir()))
    buckets = speculation_study.plan(o, kinds=("code", "random"))
    st = speculation_study.summarise(buckets, speculation_study.collect(ngram_server.url, buckets, tokenizer_dir=o.tokenizer), None,
                              speculation_study.server_mode(ngram_server.url))
    assert st.mode == "on"            # /slots' flag: 0.3.36's /props reports `none` per slot even while speculating
    assert not [f for f in st.findings if f.id.startswith("bench.spec.responses")], [f.detail for f in st.findings]
    code, rnd = st.rows
    assert code["requests"] == rnd["requests"] == 2
    assert code["drafted"] > 0 and code["accept_length"] is not None       # /metrics' steps cross-checked the responses
    assert rnd["drafted"] > 0, rnd         # the model loops on random tokens, and the lookup copies its own loop
    assert abs(code["acceptance"] - rnd["acceptance"]) >= ACCEPT_GAP, (code, rnd)
    verdict = st.findings[0]
    assert verdict.id == "bench.spec.real_vs_random" and f"{100 * code['acceptance']:.0f} %" in verdict.title
