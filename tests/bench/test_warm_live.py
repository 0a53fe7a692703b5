"""Issue 50 item 3: `--find-max warm` on SGLang's own CPU server, its pool pinned small (`--max-total-tokens`) so the
knee falls within reach on two cores: the measured knee is within one step of the plan's prediction.

Its own server, not the shared `sglang_server`: the pinned pool is the point of the test, and the shared server's
(~500,000 tokens) would put the knee at hundreds of sessions."""
import pytest

from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings

POOL = 3400            # tokens: four sessions of ~760 tokens (the tiny model's count) fit, five do not


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    from runbook.demo import sglang as demo

    srv = demo.start(flags={**demo.BESIDE_SIBLINGS, "max-total-tokens": POOL},
                     log_path=tmp_path_factory.mktemp("sglang-warm") / "server.log")
    yield srv
    srv.stop()


def settings(srv, **kw):
    base = dict(url=srv.url, concurrency=[1], workload="agentic", turns=3, input_len=160, tool_result_len=48,
                output_len=8, warmup=0, telemetry=False, timeout=120.0, find_max="warm", find_max_levels=8,
                tokenizer=str(srv.model_dir))
    return BenchSettings(**dict(base, **kw))


@pytest.mark.sglang
@pytest.mark.slow  # a server of its own (~45 s start-up), then ~8 levels of sessions
def test_the_knee_on_sglang_is_within_one_step_of_the_plan(pinned):
    res = bench.run(settings(pinned))
    r = res.summary["warm_sessions"]
    why = f"{r['levels']} (pool {r['pool_tokens']}, context {r['context_tokens']}, predicted {r['predicted_sessions']})"
    assert r["pool_tokens"] == POOL and r["page_size"] == 1 and r["eviction_policy"] == "lru", why
    # the plan's estimate before anything ran (local tokenizer through the chat template) is the server's count
    assert abs(r["context_estimate"] - r["context_tokens"]) <= 0.1 * r["context_tokens"], why
    assert r["reached"] and r["knee_sessions"] is not None and abs(r["knee_sessions"] - r["predicted_sessions"]) <= 1, why
    rows = {x["sessions"]: x for x in r["levels"]}
    warm_row, cold_row = rows[r["knee_sessions"]], rows[r["first_cold"]]
    # past the knee SGLang prefilled turns again: fewer cached tokens, more prefilled per turn
    assert cold_row["cache_hit_rate"] < warm_row["cache_hit_rate"], why
    assert cold_row["reprefill_tokens_per_turn"] > warm_row["reprefill_tokens_per_turn"], why
    f = {x.id: x for x in res.findings}["bench.warm_sessions"]
    assert f.status in ("pass", "warn") and "agent sessions stay warm" in f.title
