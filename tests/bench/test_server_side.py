"""The server's own figures from two /metrics scrapes, in SGLang 0.5.23's exposition (label sets per streaming
mode and rank), parsed by prometheus_client: deltas, exact means, and Prometheus' histogram_quantile."""
import pytest

from runbook.bench import level_findings, server_side
from runbook.bench.sweep import parse_prometheus, server_deltas

LABELS = 'engine_type="unified",model_name="tiny"'


def _scrape(ttft: dict[str, list[int]], ttft_sum: float, retracted: float, gen: float) -> dict[str, float]:
    """ttft: is_streaming -> cumulative counts at le 0.1, 0.2, 0.4, +Inf."""
    lines = ["# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
             "# TYPE sglang:time_to_first_token_seconds histogram"]
    for streaming, counts in ttft.items():
        for le, n in zip(("0.1", "0.2", "0.4", "+Inf"), counts, strict=True):
            lines.append(f'sglang:time_to_first_token_seconds_bucket{{{LABELS},is_streaming="{streaming}",le="{le}"}} {n}')
        lines.append(f'sglang:time_to_first_token_seconds_count{{{LABELS},is_streaming="{streaming}"}} {counts[-1]}')
        lines.append(f'sglang:time_to_first_token_seconds_sum{{{LABELS},is_streaming="{streaming}"}} {ttft_sum / len(ttft)}')
    lines += ["# TYPE sglang:num_retracted_requests counter",
              f'sglang:num_retracted_requests_total{{{LABELS},tp_rank="0"}} {retracted}',
              "# TYPE sglang:generation_tokens counter",
              f'sglang:generation_tokens_total{{{LABELS},is_streaming="true"}} {gen}']
    return parse_prometheus("\n".join(lines) + "\n")


def test_deltas_means_and_quantiles():
    before = _scrape({"true": [1, 1, 1, 1], "false": [0, 0, 0, 0]}, 0.05, 2, 100)
    after = _scrape({"true": [3, 7, 8, 9], "false": [0, 0, 0, 1]}, 0.05 + 2.0, 5, 420)
    d = server_deltas(before, after)
    h = d["histograms"]["time_to_first_token_seconds"]
    assert h["count"] == 9 and h["sum"] == pytest.approx(2.0)
    assert h["buckets"] == [[0.1, 2.0], [0.2, 6.0], [0.4, 7.0], [float("inf"), 9.0]]
    assert d["counters"] == {"retracted_requests": 3.0, "generation_tokens": 320.0}
    lv = server_side.level(d)
    assert lv["ttft_ms"]["mean"] == pytest.approx(2000 / 9) and lv["ttft_ms"]["n"] == 9
    # rank 4.5 of 9 lies in (0.1, 0.2] holding ranks 3..6: 0.1 + 0.1 · (4.5 − 2) / 4
    assert lv["ttft_ms"]["p50"] == pytest.approx(162.5)
    assert lv["ttft_ms"]["p99"] == pytest.approx(400.0)        # in the +Inf bucket: the highest finite bound
    assert lv["retracted_requests"] == 3 and "tpot_ms" not in lv


def test_quantile_edges():
    assert server_side.quantile([], 0.5) is None
    assert server_side.quantile([[0.1, 0.0], [float("inf"), 0.0]], 0.5) is None
    assert server_side.quantile([[0.1, 4.0], [float("inf"), 4.0]], 0.5) == pytest.approx(0.05)   # from 0 in the first bucket


def test_no_metrics_no_figures_and_no_findings():
    assert server_side.level({}) is None and server_deltas(None, {"x": 1.0}) == {}
    s = {"label": "c1", "server_side": None, "ttft_ms": {"mean": 10.0}}
    assert server_side.beside(s) == [] and level_findings.server_findings([s]) == []


def test_findings_for_queueing_and_retraction():
    s = {"label": "c8", "ttft_ms": {"mean": 30.0, "p50": 25.0, "p99": 90.0, "n": 8},
         "tpot_ms": {"mean": 5.0, "p50": 5.0, "p99": 6.0, "n": 8},
         "server_side": {"ttft_ms": {"mean": 28.0, "p50": 24.0, "p99": 80.0, "n": 8},
                         "tpot_ms": {"mean": 5.1, "p50": 5.0, "p99": 6.5, "n": 8},
                         "queue_ms": {"mean": 900.0, "p50": 300.0, "p90": 1500.0, "p99": 2400.0, "n": 8},
                         "retracted_requests": 2},
         "telemetry": {"num_queue_reqs": {"max": 3.0}}}
    f = {x.id: x for x in level_findings.server_findings([s])}
    assert f["bench.server_side.c8"].title == "c8: TTFT mean ours 30.0 ms, server 28.0 ms; TPOT mean ours 5.0 ms, server 5.1 ms"
    assert f["bench.queue.c8"].status == "warn" and "p99 2400 ms, up to 3 waiting" in f["bench.queue.c8"].title
    assert f["bench.retracted.c8"].status == "warn" and "retracted 2 running requests" in f["bench.retracted.c8"].title
    rows = server_side.beside(s)
    assert [r["metric"] for r in rows] == ["TTFT", "TPOT"] and rows[0]["ratio_mean"] == pytest.approx(30 / 28)
