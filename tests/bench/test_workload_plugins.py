"""Issue 28 item 4: workloads are plug-ins. Each module of runbook/bench/workloads declares its selection,
description, options and checks, regression key, and request source or session driver; a new one is one
module (here written outside the repository and found by the same discovery), and runs end to end."""
import re
import sys
import textwrap
from pathlib import Path

import pytest

from bench.rawsse import RawServer, Reply, completion_stream
from runbook.bench import regression, workloads
from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.core import spec
from runbook.core.errors import InputError
from runbook.endpoint.client import RequestSpec

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SPEC = REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4.yaml"
OPTION_FIELDS = set(BenchSettings.model_fields)

# A whole new workload: this text is the only thing its author writes (plus this test).
ECHO_MODULE = '''
"""echo: asks the server to repeat a numbered word (a plug-in written for the test)."""
from runbook.bench.workloads.base import BASE_KEY, LazyRequests, Workload, WorkloadType
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.endpoint.client import RequestSpec


class Echo(WorkloadType):
    name = "echo"
    description = "repeat-after-me prompts of --input-len words"
    options = ("input_len", "output_len", "seed")
    regression_key = (*BASE_KEY, "seed")
    order = 45

    def check(self, o):
        if o.input_len > 64:
            raise InputError(f"--workload echo: --input-len at most 64 words (got {o.input_len})")

    def build(self, o, n, ctx):
        reqs = LazyRequests(n, lambda i: RequestSpec(i, "say: " + " ".join(f"w{o.seed}-{i}" for _ in range(o.input_len)),
                                                     o.output_len, None, ctx.ignore_eos))
        return Workload(self.name, reqs, False, f"echo of {o.input_len} words", f"echo-seed{o.seed}")

    def summary(self, o, run):
        return {"echo_words": o.input_len}

    def findings(self, summary_levels):
        return [Finding("bench.workload", "info", f"echo prompts on {len(summary_levels)} level(s): not a real load")]


WORKLOAD = Echo()
'''


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry as it is, restored after the test (a registered plug-in must not leak into other tests)."""
    monkeypatch.setattr(workloads.registry, "WORKLOADS", dict(workloads.WORKLOADS))
    yield workloads.registry.WORKLOADS
    sys.modules.pop("runbook.bench.workloads.echo", None)


@pytest.fixture
def echo(tmp_path, monkeypatch, fresh_registry):
    """The echo module dropped into a directory on the package's path, then found by discover()."""
    (tmp_path / "echo.py").write_text(textwrap.dedent(ECHO_MODULE))
    monkeypatch.setattr(workloads, "__path__", [*workloads.__path__, str(tmp_path)])
    assert "echo" in workloads.discover()
    return workloads.resolve("echo")


@pytest.fixture
def server():
    srv = RawServer(lambda body: Reply(completion_stream(int(body.get("max_tokens", 2)), 0.005, 0.001))).start()
    yield srv
    srv.stop()


def test_every_workload_keeps_the_contract():
    assert workloads.names() == ["random", "code", "longctx", "prefix", "agentic", "trace", "file"]
    package = Path(workloads.__file__).parent
    modules = {p.stem for p in package.glob("*.py") if re.search(r"^WORKLOAD = ", p.read_text(), re.M)}
    assert modules == set(workloads.names())          # one module each, every one found
    for w in workloads.WORKLOADS.values():
        assert workloads.contract_gaps(w) == [], w.name
        assert w.description and w.regression_key[:len(workloads.BASE_KEY)] == workloads.BASE_KEY
        assert w.is_source != w.is_driver
        assert set(w.options) <= OPTION_FIELDS
    assert [w.name for w in workloads.WORKLOADS.values() if w.is_driver] == ["agentic"]


def test_help_line_and_resolution_come_from_the_registry():
    # The CLI's --workload help of before, now built from the modules.
    assert workloads.help_text() == ("random | code | longctx | prefix | agentic | trace:FILE (Mooncake JSONL; "
                                     "trace:synthetic) | FILE.jsonl")
    assert [workloads.resolve(x).name for x in ("code", "trace:synthetic", "trace", "my.jsonl", "")] == \
        ["code", "trace", "file", "file", "file"]
    assert workloads.regression_key("agentic", "trace:x")[-5:] == ("turns", "think_time_s", "think_dist", "tool_result_len",
                                                                    "trace_speed")
    with pytest.raises(InputError, match="not random|code|longctx|prefix|agentic|trace:FILE and not a file"):
        workloads.build("nonsense", 1)
    with pytest.raises(InputError, match="runs sessions as they go"):
        workloads.build("agentic", 1)


def test_a_broken_plugin_is_refused(fresh_registry):
    class Nothing(workloads.WorkloadType):
        name = "nothing"
    with pytest.raises(ValueError, match="one-line description.*request source"):
        workloads.register(Nothing())
    assert "nothing" not in workloads.names()


def test_a_new_workload_is_one_module(echo, server, tmp_path):
    """Dropped in, it is in the help, its check run by workloads.check, keyed for the regression check and run by
    bench.assess against a server — with no other file changed."""
    assert "| prefix | echo | agentic |" in workloads.help_text()
    with pytest.raises(InputError, match="--input-len at most 64 words"):
        workloads.check(BenchSettings.resolve(None, url=server.url, workload="echo", input_len=65))
    workloads.check(BenchSettings.resolve(None, url=server.url, workload="echo", input_len=3, workers=2))   # a source: workers allowed
    dep = spec.load(DEFAULT_SPEC)
    o = BenchSettings.resolve(dep, url=server.url, workload="echo", input_len=3, output_len=2, concurrency=[2], requests=4,
                              warmup=0, telemetry=False, seed=7)
    res = bench.assess(dep, o, archive_root=tmp_path / "archive")
    s = res.summary
    assert s["workload"] == "echo" and s["workload_description"] == "echo of 3 words" and s["corpus_version"] == "echo-seed7"
    assert s["echo_words"] == 3 and [lv["completed"] for lv in s["levels"]] == [4]
    assert sorted(b["prompt"] for b in server.bodies) == [f"say: w7-{i} w7-{i} w7-{i}" for i in range(4)]
    assert [(f.id, f.status) for f in res.findings if f.id in ("bench.workload", "bench.regression")] == \
        [("bench.workload", "info"), ("bench.regression", "info")]
    # Its regression key: another seed is other work for echo, not for code (whose key has no seed).
    again = dict(s, seed=8, levels=[dict(lv) for lv in s["levels"]])
    f = regression.compare_previous(again, s, 10)
    assert [(x.id, x.status) for x in f] == [("bench.regression", "skip")] and "seed: 7 then, 8 now" in f[0].detail
    code = dict(s, workload="code", corpus_version="c")
    assert regression.compare_previous(dict(code, seed=8), code, 10)[0].status == "pass"


def test_a_session_driver_registers_in_code(fresh_registry, server):
    """A workload whose requests depend on the run (a driver), registered without a module; one process only."""
    class Pairs(workloads.WorkloadType):
        name = "pairs"
        description = "two requests per session, the second after the first"
        options = ("output_len",)
        one_process = "pair sessions"
        paired = False

        def sessions(self, o, run, lv, tokenizer):
            async def drive(send, deadline):
                for k in range(lv.concurrency):
                    for t in (1, 2):
                        await send(RequestSpec(2 * k + t, f"pair {k} turn {t}", o.output_len, None, True, {"session": k, "turn": t}))
            return workloads.LevelLoad([RequestSpec(-1, "warm", 1, None, True)], False, drive)

    workloads.register(Pairs())
    with pytest.raises(InputError, match=r"pair sessions run in one process: drop workers"):
        workloads.check(BenchSettings.resolve(None, url=server.url, workload="pairs", workers=2))
    with pytest.raises(InputError, match="does not take the agentic or trace or pairs workloads"):
        workloads.check(BenchSettings.resolve(None, url=server.url, workload="pairs", compare_url=server.url))
    res = bench.run(BenchSettings(url=server.url, model="raw", workload="pairs", concurrency=[2], output_len=2,
                                       warmup=1, telemetry=False, timeout=30.0))
    (lv,) = res.summary["levels"]
    assert lv["completed"] == 4 and res.summary["workload_description"] == Pairs.description
    assert [b["prompt"] for b in server.bodies] == ["warm", "pair 0 turn 1", "pair 0 turn 2", "pair 1 turn 1", "pair 1 turn 2"]
