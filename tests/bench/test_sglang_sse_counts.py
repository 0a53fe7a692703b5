"""Token counts from SGLang 0.5.23's own streams (recorded from the demo server: the tiny random-weight Llama on
CPU, stream_options include_usage + continuous_usage_stats). Each chunk's usage is cumulative, the finish chunk of a
stop string carries no text but its count, and a usage-only chunk ends the stream. The client's own count must be
the server's per-chunk count, equal to its final usage: the random model's text does not re-tokenize to the tokens
it was decoded from (" limit limit" is 2 tokens generated, 3 re-tokenized), so a tokenizer count would differ."""
from pathlib import Path

import pytest

from runbook.bench import level_findings, metrics
from runbook.demo import llama as demo
from runbook.demo.sglang import MODEL_CONFIG
from runbook.endpoint.client import Client
from runbook.endpoint.records import RequestRecord, RequestSpec
from runbook.endpoint.transport import Stream

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sglang-sse"


def replay(name: str, chat: bool, max_tokens: int, ignore_eos: bool = True, tokenizer=None) -> RequestRecord:
    """The recorded bytes through the client's own event handler, one read per event, 10 ms apart, the first 10 ms
    after the send."""
    c = Client("http://recorded", "tiny-llama", chat=chat, tokenizer=tokenizer)
    rec = RequestRecord(id=0)
    st = Stream(c._event, rec)
    done = False
    for i, event in enumerate((FIXTURES / name).read_bytes().split(b"\n\n")):
        done = st.feed(event + b"\n\n", 0.01 * (i + 1)) or done
    st.join()
    c._finish(rec, RequestSpec(0, "recorded", max_tokens, ignore_eos=ignore_eos), st.cum, done)
    return rec


@pytest.fixture(scope="module")
def tok():
    return demo.train_tokenizer(MODEL_CONFIG["vocab_size"])     # the demo model's tokenizer


@pytest.mark.parametrize("name, chat", [("completions-ignore-eos-32.sse", False), ("chat-ignore-eos-32.sse", True)])
def test_the_clients_count_is_the_servers_per_chunk_usage(tok, name, chat):
    r = replay(name, chat, 32, tokenizer=tok)
    assert r.ok and r.count_source == "usage" and r.usage["completion_tokens"] == 32
    assert r.output_tokens_client == r.output_tokens == sum(r.chunk_tokens) == 32
    s = metrics.summarise([r])
    assert s["output_token_discrepancy"] == 0 and s["itl_exact"]
    assert not [f for f in level_findings.level_findings([{**s, "label": "c1", "client_bound": False}], "random", None)
                if f.id.startswith("bench.token_")]


def test_the_re_tokenized_text_would_have_miscounted(tok):
    """Why the tokenizer is not the client's count under continuous usage: this stream's text re-tokenizes to 33."""
    r = replay("completions-ignore-eos-32.sse", False, 32, tokenizer=tok)
    assert len(tok.encode(r.text, add_special_tokens=False).ids) == 33
    # SGLang sent " limit limit" as one chunk of 2 tokens (cumulative 1 -> 3): per-token ITL splits its gap in two
    assert r.chunk_tokens[:3] == [1, 2, 1] and len(r.chunk_times) == 30
    assert metrics.itl_per_token_s(r)[:3] == pytest.approx([0.005, 0.005, 0.01])


def test_a_stop_strings_finish_chunk_counts_without_text(tok):
    """The stop string's tokens are counted on a finish chunk with empty text: credited to the last output chunk."""
    r = replay("completions-stop-string.sse", False, 32, ignore_eos=False, tokenizer=tok)
    assert r.ok and r.finish_reason == "stop" and r.count_source == "usage"
    assert r.output_tokens_client == r.output_tokens == sum(r.chunk_tokens) == 9 and r.chunk_tokens[-1] == 2


def test_per_chunk_usage_that_disagrees_with_the_final_says_so(tok):
    """A server whose final usage exceeds its last per-chunk count: the finding names the server's two counts, and
    does not send the user to --tokenizer (which was given)."""
    r = replay("completions-ignore-eos-32.sse", False, 32, tokenizer=tok)
    r.usage, r.max_tokens = {**r.usage, "completion_tokens": 40}, 64     # up to 64 asked: 40 is a count, not impossible
    s = {**metrics.summarise([r]), "label": "c1", "client_bound": False}
    assert (s["output_tokens"], s["output_tokens_client"]) == (40, 32)
    (f,) = [f for f in level_findings.level_findings([s], "random", None) if f.id == "bench.token_count.c1"]
    assert "server's two counts disagree" in f.remedy and "--tokenizer" not in f.remedy
