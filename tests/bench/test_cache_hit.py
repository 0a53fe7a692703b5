"""Issue 15 item 1: the prefix-cache hit rate per level, from usage where the server reports cached
tokens, else from SGLang's /metrics counters (names checked against the installed SGLang's source)."""
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from verify import sglang_formats

from runbook.bench import run as bench
from runbook.bench.sweep import Level, LevelResult, parse_prometheus, server_deltas
from runbook.endpoint.client import RequestRecord

MODEL = {"model_name": "qwen"}


def exposition(prompt: dict[str, int], cached: dict[str, int]) -> str:
    """/metrics text as SGLang's collector would write it (same names and labels)."""
    reg = CollectorRegistry()
    p = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", ["model_name", "is_streaming"], registry=reg)
    c = Counter("sglang:cached_tokens", "Number of cached prompt tokens by source.", ["model_name", "cache_source"], registry=reg)
    for k, v in prompt.items():
        p.labels(is_streaming=k, **MODEL).inc(v)
    for k, v in cached.items():
        c.labels(cache_source=k, **MODEL).inc(v)
    return generate_latest(reg).decode()


def level(records, before, after) -> LevelResult:
    return LevelResult(Level("c2", 2), records, {}, {}, 0.0, False, server_deltas(parse_prometheus(before), parse_prometheus(after)))


def rec(prompt, cached=None) -> RequestRecord:
    usage = {"prompt_tokens": prompt, "completion_tokens": 4}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return RequestRecord(1, usage=usage, chunk_times=[1.0])


@pytest.mark.skipif(sglang_formats.SRT is None, reason="no .venv-serving")
def test_the_counter_names_are_sglangs():
    src = (sglang_formats.SRT / "observability" / "metrics_collector.py").read_text()
    for name in ('"sglang:prompt_tokens_total"', '"sglang:cached_tokens_total"', '"cache_source"', '"is_streaming"'):
        assert name in src


def test_usage_first_then_metrics_deltas_over_every_source():
    before = exposition({"true": 1000}, {"device": 100})
    after = exposition({"true": 1000 + 3000, "false": 1000}, {"device": 100 + 1500, "host": 500})
    # usage carries cached tokens: that is the figure (3 of 10 prompt tokens cached)
    assert bench.cache_hit(level([rec(6, 3), rec(4, 0)], before, after)) == (pytest.approx(0.3), "usage")
    # no cached tokens in usage: the counters' deltas, every cache_source and is_streaming summed (2000/4000)
    assert bench.cache_hit(level([rec(6), rec(4)], before, after)) == (pytest.approx(0.5), "metrics")
    # neither (llama-server's /metrics has no such counters)
    assert bench.cache_hit(level([rec(6)], "", "")) == (None, None)
    s = bench.level_summary(level([rec(6), rec(4)], before, after))
    assert s["cache_hit_rate"] == pytest.approx(0.5) and s["cache_hit_source"] == "metrics"
