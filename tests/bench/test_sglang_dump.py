"""Issue 15 item 2: SGLang's own request dumps replayed as a trace. The dumps here are written by
SGLang 0.5.23's own TokenizerManager._dump_data_to_file (tests/oracle/sglang_dump.py, in
.venv-serving) with real GenerateReqInput objects; the runbook reads them without SGLang installed
and without running anything a pickle names."""
import json
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.rawsse import Reply, completion_stream
from runbook.bench import run as bench
from runbook.bench import sglang_dump, workloads
from runbook.bench.settings import BenchSettings
from runbook.core.errors import InputError
from runbook.demo import llama as demo

REPO = Path(__file__).resolve().parents[2]
SERVING_PY = Path(os.environ.get("RUNBOOK_SERVING_PYTHON") or REPO / ".venv-serving" / "bin" / "python")


def sglang_dump_file(tmp_path: Path, spec: list) -> Path:
    if not SERVING_PY.is_file():
        pytest.skip("no .venv-serving (make serving-env) to write a dump with SGLang's own code")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "dump" / "2026-12-03_10-00-00.pkl"
    cp = subprocess.run([str(SERVING_PY), str(REPO / "tests" / "oracle" / "sglang_dump.py"), str(out), str(tmp_path / "spec.json")],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and out.is_file(), cp.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def real_dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("dump")
    shared = list(range(100, 100 + 512))
    spec = [
        {"created": 1764756000.50, "finished": 1764756001.0, "input_ids": shared + [7] * 100, "max_new_tokens": 8,
         "prompt_tokens": 612, "completion_tokens": 5},
        {"created": 1764756000.00, "finished": 1764756000.9, "input_ids": shared + [9] * 20, "max_new_tokens": 4,
         "prompt_tokens": 532, "completion_tokens": 4},
        {"created": 1764756001.25, "finished": 1764756002.0, "text": "def f(): pass", "max_new_tokens": 6,
         "prompt_tokens": 30, "completion_tokens": None},
    ]
    return sglang_dump_file(d, spec)


@pytest.mark.serving
def test_a_dump_written_by_sglang_reads_as_a_trace(real_dump):
    rows, skipped = sglang_dump.rows(real_dump.read_bytes(), str(real_dump), workloads.TRACE_BLOCK)
    assert skipped == 0
    assert [r["t"] - rows[0]["t"] for r in rows] == pytest.approx([0.0, 0.5, 1.25])     # sorted by created time
    assert [(r["input"], r["output"]) for r in rows] == [(532, 4), (612, 5), (30, 6)]    # no completion count: max_new_tokens
    a, b, c = (r["hash_ids"] for r in rows)
    assert a[0] == b[0] and a[1] != b[1] and len(a) == len(b) == 2   # the shared 512-token prefix is one shared id
    assert c == []                                                   # a text prompt: no token ids, no prefix ids


@pytest.mark.serving
def test_a_dump_replays_at_its_recorded_times(real_dump, raw):
    tok = demo.train_tokenizer(vocab_size=2048)
    wl = workloads.build(f"trace:{real_dump}", 100, tokenizer=tok)
    assert wl.schedule == pytest.approx([0.0, 0.5, 1.25])
    r0, r1, r2 = wl.requests
    assert [len(r.prompt) for r in wl.requests] == [532, 612, 30]
    assert r0.prompt[:512] == r1.prompt[:512] and r0.prompt[512:532] != r1.prompt[512:532]
    assert "SGLang request dump" in wl.description
    srv = raw(lambda body: Reply(completion_stream(int(body.get("max_tokens", 2)), 0.002, 0.001)))
    res = bench.run(BenchSettings(url=srv.url, model="raw", workload=f"trace:{real_dump}", warmup=0,
                                       telemetry=False, timeout=30.0))
    (lv,) = res.summary["levels"]
    assert lv["label"] == "trace" and lv["completed"] == 3
    err = np.array([r.meta["schedule_error_ms"] for r in res.levels[0].records])
    assert err.min() > -1.0 and np.median(err) < 20.0


class _Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_hostile_pickle_runs_nothing(tmp_path):
    sentinel = tmp_path / "ran"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"requests": [(_Boom(sentinel), {"meta_info": {"prompt_tokens": 5, "completion_tokens": 2}},
                                                 1.0, 2.0)], "x": _Boom(sentinel)}))
    rows, _ = sglang_dump.rows(evil.read_bytes(), str(evil), 512)     # placeholders only: the entry still has its counts
    assert not sentinel.exists() and rows[0]["input"] == 5
    evil.write_bytes(pickle.dumps(_Boom(sentinel)))
    with pytest.raises(InputError, match=r"evil.pkl: a pickle, but not an SGLang request dump"):
        workloads.build(f"trace:{evil}", 10)
    assert not sentinel.exists()


@pytest.mark.parametrize("raw, match", [
    (b"\x80\x04garbage", "not a readable SGLang request dump"),
    (pickle.dumps([1, 2, 3]), "not an SGLang request dump"),
    (pickle.dumps({"requests": [("x",), (None, {}, float("nan"), 1.0)]}), r"no request with a time and token counts \(2 entries"),
    (pickle.dumps({"requests": [(None, {"meta_info": {"prompt_tokens": True, "completion_tokens": -1}}, 1.0, 2.0)]}),
     "no request with a time"),
    (b"\x80\x04" + b"(" * 200000, "not a readable SGLang request dump|nests too deep"),
])
def test_broken_dumps_are_one_line_errors(tmp_path, raw, match):
    p = tmp_path / "d.pkl"
    p.write_bytes(raw)
    with pytest.raises(InputError, match=match) as e:
        workloads.build(f"trace:{p}", 10)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
