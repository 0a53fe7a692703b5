"""What SGLang logs under load, read as findings: retractions when the KV pool fills, the pool's out-of-memory lines,
requests aborted under memory pressure, a pool smaller than one request at the context length. The lines come from
SGLang 0.5.23's own format strings, and from a real log: the CPU server with a 1,024-token pool
(`--max-total-tokens 1024 --schedule-conservativeness 0.1`) under 8 concurrent requests, kept as a fixture."""
from __future__ import annotations

from pathlib import Path

import pytest

from runbook.demo import sglang as demo
from runbook.verify import compare, logparse, stage

from .sglang_formats import SRT, line, render

FIXTURE = Path(__file__).parent / "fixtures" / "sglang-0.5.23-cpu-small-pool.log"


def _ids(facts):
    return {f.id: f for f in compare.log_findings({}, {}, facts)}


def test_a_real_small_pool_log_gives_its_retraction_and_pool_findings():
    facts = logparse.parse(FIXTURE.read_text().splitlines())
    assert facts.ready and facts.scheduler["max_total_num_tokens"] == 1024
    rt = facts.warnings["retraction"]
    assert rt.count == 1 and rt.groups == [("1", "104")]
    f = _ids(facts)
    assert f["verify.retraction"].status == "warn" and "1 requests retracted" in f["verify.retraction"].detail
    assert f["verify.pool_below_context"].status == "warn"
    assert "1024 tokens" in f["verify.pool_below_context"].title and "(4096)" in f["verify.pool_below_context"].title
    assert not {"verify.kv_pool_oom", "verify.oom_abort", "verify.oom"} & set(f)


def test_verify_reads_the_saved_log_of_that_server():
    """The whole stage on the saved log, with the demo spec at the pool it ran with: the retraction is a finding."""
    spec = demo.deployment(30000, flags={"max-total-tokens": 1024, "schedule-conservativeness": 0.1})
    rep = stage.assess(spec, log=FIXTURE)
    got = {f.id: f.status for f in rep.findings}
    assert got["verify.retraction"] == "warn" and got["verify.pool_below_context"] == "warn"
    assert {"id": "retraction", "line": FIXTURE.read_text().splitlines()[42]} in rep.warnings()


@pytest.mark.skipif(SRT is None, reason="no .venv-serving with SGLang's sources (make serving-env)")
def test_sglangs_own_format_strings_read_right():
    """Each line rendered from the installed SGLang's source, as its logger writes it (the allocator's message has
    three lines: only the first carries the prefix)."""
    retract = (render("managers/scheduler.py", "KV cache pool is full. Retract requests. ")
               + render("managers/scheduler.py", "#retracted_reqs: {}, #new_tokens_gained: {}",
                        {"len(retracted_reqs)": 3, "new_token_gained": 420})
               + render("managers/scheduler.py", ", #new_token_ratio: {} -> {}", {"old_ratio": 0.07, "new_token_ratio": 0.5}))
    values = {"num_tokens": 12, "extend_num_tokens": 12, "len(seq_lens) * token_per_req": 12,
              "available_and_evictable_str(tree_cache)": "Available tokens: 0"}
    oom = [render("mem_cache/allocation.py", needle, values).splitlines()[0]
           for needle in ("Prefill out of memory. Try to lower", "Decode out of memory. Try to lower",
                          "Out of memory. Try to lower")]
    abort_last = render("managers/schedule_batch.py", "retract_decode: aborted last request", args=("rid-7",))
    abort = render("managers/schedule_batch.py", "retract_decode: aborted request %s: %s",
                   args=("rid-8", "Retracted under decode memory pressure without a KV backup. Retry later."))
    slots = render("mem_cache/allocation.py", "alloc_req_slots runs out of memory. ",
                   {"req_to_token_pool.available_size()": 0, "num_reqs": 2})
    small = render("managers/tp_worker.py", "KV pool holds %d tokens", args=(2048, 8192))
    facts = logparse.parse([line(m) for m in [retract, *oom, abort_last, abort, slots, small]])
    w = facts.warnings
    assert w["retraction"].groups == [("3", "420")]
    assert w["kv_pool_oom"].count == 3 and [g[0] for g in w["kv_pool_oom"].groups] == ["Prefill", "Decode", ""]
    assert w["oom_abort"].count == 2 and w["oom_abort"].groups[0][0] == "rid-7"
    assert w["req_slots_oom"].count == 1 and w["pool_below_context"].groups == [("2048", "8192")]
    assert "oom" not in w                       # the pool's own lines are not a device out-of-memory
    f = _ids(facts)
    assert f["verify.kv_pool_oom"].status == "fail" and "decode and prefill" in f["verify.kv_pool_oom"].title
    assert f["verify.oom_abort"].status == "warn" and f["verify.req_slots_oom"].status == "fail"
