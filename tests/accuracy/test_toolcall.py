"""The tool-call probe against a scripted server that reproduces each failure mode, a correct one, and
(when built) llama-server with --jinja."""
import json

import pytest
from bench.rawsse import RawServer, Reply, sse

from runbook.accuracy import toolcall
from runbook.accuracy.settings import AccuracySettings
from runbook.core.errors import InputError

ARGS = {"read_file": {"path": "src/server/config.py", "start_line": 1, "end_line": 40},
        "apply_patch": {"path": "src/server/config.py",
                        "patch": "--- a/src/server/config.py\n+++ b/src/server/config.py\n@@ -1,7 +1,8 @@\n"
                                 + "".join(f"-old line {i}\n+new line {i}\n" for i in range(12))},
        "run_tests": {"paths": ["tests/test_config.py", "tests/test_server.py"], "keyword": "config", "verbose": True}}


def _tool(body):
    text = body["messages"][-1]["content"]
    return next(t for t in ("apply_patch", "read_file", "run_tests") if t in text)


def scripted(mode="ok"):
    """mode: ok | in_content | in_reasoning | bad_json | missing_required | one_chunk | wrong_finish | prose | drops_tools"""
    def handler(body):
        tool = _tool(body)
        if body.get("max_tokens") == 1:     # the template check: the prompt counted with and without the tools
            n = 120 + (0 if mode == "drops_tools" or "tools" not in body else 340)
            doc = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "I"}, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": n, "completion_tokens": 1}}
            return Reply([(0.0, json.dumps(doc).encode())], headers={"Content-Type": "application/json"})
        if mode == "prose":
            text = f"I would use {tool.replace('_', ' ')}, but here is my answer in words instead."
            if not body.get("stream"):
                doc = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
                return Reply([(0.0, json.dumps(doc).encode())], headers={"Content-Type": "application/json"})
            return Reply([(0.0, sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})),
                          (0.001, sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})),
                          (0.002, b"data: [DONE]\n\n")])
        args = dict(ARGS[tool])
        if mode == "missing_required":
            args.pop("path" if tool != "run_tests" else "paths")
        arg_text = json.dumps(args)
        if mode == "bad_json":
            arg_text = arg_text[:-1] + ",}"
        call_text = f"<tool_call>\n{json.dumps({'name': tool, 'arguments': args})}\n</tool_call>"
        finish = "stop" if mode == "wrong_finish" else "tool_calls"
        unparsed = mode in ("in_content", "in_reasoning")
        if not body.get("stream"):
            msg = {"role": "assistant", "content": None}
            if mode == "in_content":
                msg["content"] = call_text
            elif mode == "in_reasoning":
                msg.update(content="", reasoning_content="I should call the tool. " + call_text)
            else:
                msg["tool_calls"] = [{"id": "call_0", "type": "function", "function": {"name": tool, "arguments": arg_text}}]
            doc = {"choices": [{"index": 0, "message": msg, "finish_reason": "stop" if unparsed else finish}]}
            return Reply([(0.0, json.dumps(doc).encode())], headers={"Content-Type": "application/json"})
        w = []
        if unparsed:
            key = "content" if mode == "in_content" else "reasoning_content"
            for i in range(0, len(call_text), 16):
                w.append(sse({"choices": [{"index": 0, "delta": {key: call_text[i:i + 16]}, "finish_reason": None}]}))
            w.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        else:
            w.append(sse({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
                {"index": 0, "id": "call_0", "type": "function", "function": {"name": tool, "arguments": ""}}]},
                "finish_reason": None}]}))
            if mode == "one_chunk":
                w.append(sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arg_text}}]},
                                           "finish_reason": finish}]}))
            else:
                for i in range(0, len(arg_text), 24):
                    w.append(sse({"choices": [{"index": 0, "delta": {"tool_calls": [
                        {"index": 0, "function": {"arguments": arg_text[i:i + 24]}}]}, "finish_reason": None}]}))
                w.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        w.append(b"data: [DONE]\n\n")
        return Reply([(0.001 * i, x) for i, x in enumerate(w)])
    return handler


@pytest.fixture
def server():
    started = []

    def start(mode):
        s = RawServer(scripted(mode), real_gap_s=0.0).start()
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


def _status(rep):
    return {f.id.rsplit(".", 1)[1]: f.status for f in rep.findings}


def test_correct_server_passes_everything(server, monkeypatch):
    s = server("ok")
    monkeypatch.setenv("RB_TEST_API_KEY", "sk-secret-value-123")
    rep = toolcall.run(AccuracySettings(url=s.url, api_key_env="RB_TEST_API_KEY"))
    st = _status(rep)
    assert st == {"template": "pass", "parsed": "pass", "arguments": "pass", "streaming": "pass", "finish_reason": "pass"}, rep.findings
    assert rep.template == {"prompt_tokens_with_tools": 460, "prompt_tokens_without_tools": 120}
    assert len(rep.cases) == 6 and all(c.called and c.arguments_valid and not c.schema_errors for c in rep.cases)
    patch = next(c for c in rep.cases if c.tool == "apply_patch" and c.stream)
    assert patch.argument_deltas > 3 and patch.last_delta_share < 0.5
    body = s.bodies[0]
    assert body["model"] == "raw" and [t["function"]["name"] for t in body["tools"]] == ["read_file", "apply_patch", "run_tests"]
    j = rep.to_json()
    assert set(j) == {"toolcall", "findings"} and set(j["toolcall"]) == {"url", "model", "tool_choice", "server", "template", "cases"}
    assert j["toolcall"]["tool_choice"] == "auto"
    assert "sk-secret-value-123" not in json.dumps(j)


def _respelled(handler):
    """The same events as SSE also allows them: a comment, an event name, CRLF line ends, each JSON document
    over two data lines (the second without the space), every write cut into 7-byte reads."""
    def respell(body):
        reply = handler(body)
        if not body.get("stream"):
            return reply
        out = b""
        for _, w in reply.writes:
            data = w.removeprefix(b"data: ").removesuffix(b"\n\n")
            head, sep, tail = data.partition(b", \"")     # between two JSON tokens: the joining newline is whitespace
            lines = [b"data: " + head + sep[:1], b"data:" + sep[1:] + tail] if sep else [b"data: " + data]
            out += b": keep-alive\r\nevent: message\r\n" + b"\r\n".join(lines) + b"\r\n\r\n"
        reply.writes = [(0.0, out[i:i + 7]) for i in range(0, len(out), 7)]
        return reply
    return respell


def test_sse_as_the_specification_allows_it_parses_like_the_plain_stream():
    """The probe reads SSE through endpoint/sse.py: multi-line data, CRLF, comments and event names (the
    hand-rolled line splitter took each data line for a whole JSON document)."""
    plain, spelled = RawServer(scripted("ok"), real_gap_s=0.0).start(), RawServer(_respelled(scripted("ok")), real_gap_s=0.0).start()
    try:
        a, b = toolcall.run(AccuracySettings(url=plain.url, model="raw")), toolcall.run(AccuracySettings(url=spelled.url, model="raw"))
    finally:
        plain.stop()
        spelled.stop()
    assert _status(b) == _status(a) == {"template": "pass", "parsed": "pass", "arguments": "pass", "streaming": "pass",
                                        "finish_reason": "pass"}, b.findings
    streamed = [c for c in b.cases if c.stream]
    assert streamed and all(c.error is None and c.arguments_valid for c in streamed)
    assert [c.argument_deltas for c in streamed] == [c.argument_deltas for c in a.cases if c.stream]


@pytest.mark.parametrize("mode, check, status", [
    ("in_content", "parsed", "fail"),
    ("in_reasoning", "parsed", "fail"),
    ("bad_json", "arguments", "fail"),
    ("missing_required", "arguments", "fail"),
    ("one_chunk", "streaming", "fail"),
    ("wrong_finish", "finish_reason", "fail"),
])
def test_each_failure_mode_is_caught(server, mode, check, status):
    rep = toolcall.run(AccuracySettings(url=server(mode).url))
    st = _status(rep)
    assert st[check] == status, rep.findings
    f = next(f for f in rep.findings if f.id == f"accuracy.toolcall.{check}")
    assert "--tool-call-parser" in f.remedy and f.evidence
    others = {k: v for k, v in st.items() if k != check and v != "skip"}
    if mode in ("bad_json", "missing_required", "one_chunk", "wrong_finish"):
        assert set(others.values()) <= {"pass"}, rep.findings     # one defect, one failing check


def test_schema_errors_name_each_wrong_argument_by_its_path():
    sch = toolcall.schema_of("run_tests")
    assert toolcall.schema_errors({"paths": ["a"]}, sch) == []
    assert toolcall.schema_errors({"keyword": "x"}, sch) == ["arguments: 'paths' is a required property"]
    assert toolcall.schema_errors({"paths": ["a", 3], "verbose": 1}, sch) == [
        "arguments.paths[1]: 3 is not of type 'string'", "arguments.verbose: 1 is not of type 'boolean'"]


def test_skips_without_endpoint():
    assert toolcall.run(AccuracySettings()).findings[0].status == "skip"
    assert toolcall.run(AccuracySettings(url="http://127.0.0.1:9")).findings[0].status == "skip"


@pytest.mark.slow  # CLI processes against the scripted server
def test_cli_json(server, cli):
    cp = cli("accuracy", "toolcall", "--url", server("wrong_finish").url, "--model", "m", "--json")
    j = json.loads(cp.stdout)
    assert cp.returncode == 1 and j["toolcall"]["model"] == "m" and len(j["toolcall"]["cases"]) == 6
    assert {f["id"] for f in j["findings"]} >= {"accuracy.toolcall.finish_reason", "accuracy.toolcall.parsed"}


@pytest.mark.slow  # the whole stage and the CLI, ~10 s
def test_stage_50_runs_the_probe_with_the_other_live_probes(server, cli):
    # the same entry point as `accuracy toolcall`: the stage report carries its findings and cases
    from runbook import accuracy
    from runbook.core import spec as spec_mod

    dep = spec_mod.load(spec_mod.DEFAULT_SPEC)
    offline = accuracy.assess(dep, accuracy.AccuracySettings.resolve(dep))
    assert {f.id: f.status for f in offline.findings}["accuracy.toolcall.endpoint"] == "skip"
    srv = server("wrong_finish")
    rep = accuracy.assess(dep, accuracy.AccuracySettings.resolve(dep, url=srv.url, lengths=[256], depths=[0.5]))
    f = {x.id: x.status for x in rep.findings}
    assert f["accuracy.toolcall.finish_reason"] == "fail" and len(rep.data()["toolcall"]["cases"]) == 6
    assert rep.data()["toolcall"]["tool_choice"] == "auto"
    n = len(srv.bodies)
    j = json.loads(cli("accuracy", "report", "--url", srv.url, "--lengths", "256", "--depths", "0.5",
                       "--tool-choice", "required", "--json").stdout)
    assert {x["id"]: x["status"] for x in j["findings"]}["accuracy.toolcall.finish_reason"] == "fail"
    assert len(j["toolcall"]["cases"]) == 6 and j["toolcall"]["tool_choice"] == "required"
    assert [b["tool_choice"] for b in srv.bodies[n:] if "tools" in b and b["max_tokens"] > 1] == ["required"] * 6


@pytest.mark.slow  # CLI processes against the scripted server
def test_tool_choice_is_sent_and_checked(server, cli):
    srv = server("ok")
    rep = toolcall.run(AccuracySettings(url=srv.url, model="m", tool_choice="required"), tools=["read_file"])
    assert srv.bodies and all(b["tool_choice"] == "required" for b in srv.bodies if "tools" in b)
    assert rep.data()["tool_choice"] == "required" and _status(rep)["parsed"] == "pass"
    for bad in ("any", "required\n", ""):
        with pytest.raises(InputError, match="tool_choice must be 'auto' or 'required'"):
            AccuracySettings.resolve(None, url=srv.url, model="m", tool_choice=bad)
    n = len(srv.bodies)
    j = json.loads(cli("accuracy", "toolcall", "--url", srv.url, "--tool-choice", "required", "--json").stdout)
    assert j["toolcall"]["tool_choice"] == "required"
    assert [b["tool_choice"] for b in srv.bodies[n:] if "tools" in b and b["max_tokens"] > 1] == ["required"] * 6
    assert cli("accuracy", "toolcall", "--url", srv.url, "--tool-choice", "any").returncode == 2


def test_prose_is_the_models_choice_under_auto_and_a_fault_under_required(server):
    srv = server("prose")
    auto = toolcall.run(AccuracySettings(url=srv.url, model="m"), tools=["read_file"])
    assert _status(auto) == {"template": "pass", "parsed": "warn", "arguments": "skip", "streaming": "skip", "finish_reason": "skip"}
    req = toolcall.run(AccuracySettings(url=srv.url, model="m", tool_choice="required"), tools=["read_file"])
    f = next(f for f in req.findings if f.id == "accuracy.toolcall.parsed")
    assert f.status == "fail" and "tool_choice=required" in f.evidence and "chat template" in f.remedy


def test_a_template_that_drops_the_tools_is_named(server):
    """The same conversation counted with and without the tools: equal counts mean the model never saw a tool (what
    SmolLM2's own ChatML template does), a warn under auto and a fail under required."""
    srv = server("drops_tools")
    auto = toolcall.run(AccuracySettings(url=srv.url, model="m"), tools=["read_file"])
    f = next(f for f in auto.findings if f.id == "accuracy.toolcall.template")
    assert f.status == "warn" and "120 tokens with the tools and 120 without" in f.title and "--chat-template" in f.remedy
    req = toolcall.run(AccuracySettings(url=srv.url, model="m", tool_choice="required"), tools=["read_file"])
    assert _status(req)["template"] == "fail"
    bare = [b for b in srv.bodies if b["max_tokens"] == 1 and "tools" not in b]
    assert bare and all("tool_choice" not in b for b in bare)
    assert toolcall.template_finding({"prompt_tokens_with_tools": None, "prompt_tokens_without_tools": 3}).status == "skip"


# A chat template that renders tools and tool calls (Functionary-style `<function=NAME>{json}</function>`). The
# tiny model's GGUF has none: llama-server then falls back to plain ChatML, drops `tools` from the prompt and builds
# no grammar, so even tool_choice=required gives prose (checked: 0 of 6 calls, finish `length`). With this template
# llama-server's template analysis finds the call format, and under `required` its grammar starts the answer with a
# call (no room for text before it: the format has no opening marker to wait for).
TOOLS_TEMPLATE = """\
{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] }}
{%- if tools %}{{- '\\n\\n# Tools\\n' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n\\nTo call a function answer <function=NAME>{ARGUMENTS JSON}</function>' }}{%- endif %}
{{- '<|im_end|>\\n' }}{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}{{- '<|im_start|>assistant' }}
{%- for tc in message.tool_calls %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}
{{- '\\n<function=' + tc.name + '>' + (tc.arguments | tojson) + '</function>' }}{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- elif not (message.role == 'system' and loop.first) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


@pytest.mark.llama
def test_real_tool_call_against_llama_server_jinja(monkeypatch):
    """Real tool calls from llama-server --jinja with tool_choice=required, streamed and not: parsed into
    `tool_calls`, arguments JSON matching the schema, streamed in many deltas, finish reason `tool_calls`;
    without a tool-aware chat template the same request gets prose, which `required` makes a `fail`."""
    import copy

    from runbook.demo import llama as demo

    exe = demo.llama_server_path()
    if not exe.is_file():
        pytest.skip("llama-server not built: `make test` builds it (python -m runbook.demo build)")
    # The random-weight model never closes a JSON string on its own: inside the grammar it writes string
    # characters until max_tokens (checked: `{ "path": "}DatastDatast...`, finish `length`, arguments not JSON,
    # whatever max_tokens). A maxLength in the schema makes llama-server's grammar close the string, so the call
    # completes; 300 keeps the arguments above LARGE_ARG_CHARS so the streaming check has a row. Only read_file:
    # at temperature 0 the model calls read_file whatever the prompt (checked: apply_patch and run_tests prompts
    # also got read_file, which the arguments check rightly fails as the wrong tool).
    plain = demo.start_llama_server(exe, demo.tiny_model(), parallel=1, extra_args=["--jinja"])
    try:   # the GGUF's own (absent) template: the tools never reach the prompt, so `required` cannot be honoured
        bare = toolcall.run(AccuracySettings(url=plain.url, toolcall_max_tokens=32, tool_choice="required"), ["read_file"], 120)
    finally:
        plain.stop()
    assert [c.called for c in bare.cases] == [False, False] and all(c.error is None for c in bare.cases), bare.cases
    assert {f.id: f.status for f in bare.findings}["accuracy.toolcall.parsed"] == "fail", bare.findings
    # why: llama-server's fallback ChatML drops the tools, counted by llama-server itself
    assert {f.id: f.status for f in bare.findings}["accuracy.toolcall.template"] == "fail", bare.template

    tools = copy.deepcopy(toolcall.TOOLS)
    tools[0]["function"]["parameters"]["properties"]["path"]["maxLength"] = 300
    monkeypatch.setattr(toolcall, "TOOLS", tools)
    srv = demo.start_llama_server(exe, demo.tiny_model(), parallel=1, extra_args=["--jinja", "--chat-template", TOOLS_TEMPLATE])
    try:
        rep = toolcall.run(AccuracySettings(url=srv.url, toolcall_max_tokens=512, tool_choice="required"), ["read_file"], 120)
    finally:
        srv.stop()
    assert [(c.tool, c.stream) for c in rep.cases] == [("read_file", False), ("read_file", True)]
    assert all(c.error is None for c in rep.cases), [c.error for c in rep.cases]
    for c in rep.cases:
        assert c.called and c.name == "read_file" and not (c.in_content or c.in_reasoning), c.to_dict()
        assert c.arguments_valid and c.schema_errors == [] and c.finish_reason == "tool_calls", c.to_dict()
        assert len(c.arguments) >= toolcall.LARGE_ARG_CHARS
    streamed = rep.cases[1]
    assert streamed.argument_deltas >= toolcall.MIN_DELTAS and (streamed.last_delta_share or 1) < 0.5
    status = {f.id: f.status for f in rep.findings}
    assert status == {"accuracy.toolcall.template": "pass", "accuracy.toolcall.parsed": "pass", "accuracy.toolcall.arguments": "pass",
                      "accuracy.toolcall.streaming": "pass", "accuracy.toolcall.finish_reason": "pass"}, rep.findings
