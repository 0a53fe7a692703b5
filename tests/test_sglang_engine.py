"""The real SGLang server on CPU as the project starts it (runbook.demo.sglang): it streams through the project's
own client, reports itself in /server_info, stops with every process of its session, and refuses or explains
what it cannot do in one line. The model has random weights: these tests check protocol, counts and processes."""
import asyncio
import os
import socket
import stat
import sys

import aiohttp
import psutil
import pytest
from conftest import left_after_parent_killed

from runbook.core import SGLANG_VERSION, oscalls, ports
from runbook.demo import sglang
from runbook.endpoint.client import Client
from runbook.endpoint.reach import fetch_json
from runbook.endpoint.records import RequestSpec
from runbook.model.tokenizer import load_tokenizer

pytestmark = [pytest.mark.sglang]


def _send(url: str, chat: bool, prompt, max_tokens: int):
    async def go():
        c = Client(url, sglang.SERVED_NAME, chat=chat)
        async with aiohttp.ClientSession() as s:
            return await c.send(s, RequestSpec(0, prompt, max_tokens))
    return asyncio.run(go())


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streams_through_the_projects_client(sglang_server, chat):
    prompt = [{"role": "user", "content": "def add(a, b):"}] if chat else "def add(a, b):"
    rec = _send(sglang_server.url, chat, prompt, 16)
    assert rec.ok, rec.error
    assert rec.usage["completion_tokens"] == 16 and rec.finish_reason == "length"       # ignore_eos honoured
    assert len(rec.chunk_times) > 1 and sum(rec.chunk_tokens) == 16                     # streamed, every token counted
    tok = load_tokenizer(sglang_server.model_dir)
    if not chat:
        assert rec.usage["prompt_tokens"] == len(tok.encode("def add(a, b):", add_special_tokens=False).ids)


def test_chat_template_renders_tools(sglang_server):
    """The template lists the tools in the prompt: the same message with a tool costs more prompt tokens."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    plain = _send(sglang_server.url, True, msgs, 2)

    async def go():
        c = Client(sglang_server.url, sglang.SERVED_NAME, chat=True, extra_body={"tools": [tool]})
        async with aiohttp.ClientSession() as s:
            return await c.send(s, RequestSpec(0, msgs, 2))
    with_tool = asyncio.run(go())
    assert plain.ok and with_tool.ok, (plain.error, with_tool.error)
    assert with_tool.usage["prompt_tokens"] > plain.usage["prompt_tokens"] + 20


def test_server_info_names_its_version_and_pool(sglang_server):
    info = sglang_server.server_info()
    assert info["version"] == SGLANG_VERSION
    pool = info["max_total_num_tokens"]
    assert isinstance(pool, int) and pool > 0
    mem = info["internal_states"][0]["memory_usage"]
    assert mem["token_capacity"] == pool and mem["kvcache"] > 0
    assert info["mem_fraction_static"] == sglang_server.spec.serving.flags["mem-fraction-static"]
    models = fetch_json(sglang_server.url + "/v1/models")
    assert [m["id"] for m in models["data"]] == [sglang.SERVED_NAME]


def test_server_that_exits_during_startup_says_how_in_one_line(tmp_path):
    with pytest.raises(sglang.EngineError) as e:
        sglang.start(flags={"attention-backend": "no_such_backend"}, log_path=tmp_path / "server.log", ready_timeout=180)
    msg = str(e.value)
    assert "\n" not in msg and "SGLang exited with code 2 during start-up" in msg and "no_such_backend" in msg, msg


def test_port_in_use_is_refused_before_launch(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        with pytest.raises(sglang.EngineError, match=rf"^port {port} on 127.0.0.1 is in use \(held by pid {os.getpid()} "
                                                     r"\(.*\)\); SGLang was not started"):
            sglang.start(port=port, log_path=tmp_path / "server.log")
        assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    assert not (tmp_path / "server.log").exists()


def _fake_python(path, body: str):
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("case", ["missing", "no sglang", "other version"])
def test_broken_engine_is_one_line_naming_interpreter_and_target(tmp_path, case):
    body = {"no sglang": "echo \"ModuleNotFoundError: No module named 'sglang'\" >&2; exit 1", "other version": "echo 0.4.0"}
    py = _fake_python(tmp_path / "python", body[case]) if case in body else tmp_path / "nope" / "python"
    dep = sglang.deployment(ports.free_port(), python=py)
    with pytest.raises(sglang.EngineError) as e:
        sglang.start(dep, log_path=tmp_path / "server.log")
    msg = str(e.value)
    assert "\n" not in msg and str(py) in msg and "make serving-env" in msg, msg
    assert {"missing": "is not there", "no sglang": "No module named 'sglang'", "other version": "SGLang 0.4.0"}[case] in msg


def test_the_real_interpreter_passes_the_check():
    assert sglang.check_engine() == SGLANG_VERSION and sys.executable != str(sglang.serving_python())


def test_the_tiny_model_is_built_the_same_every_time(tmp_path, sglang_server):
    """Built again from nothing, it is the cached model byte for byte: weights, tokenizer and chat template."""
    import hashlib

    fresh = sglang.tiny_model(tmp_path / "model")
    names = sorted(p.name for p in sglang_server.model_dir.iterdir())
    assert names == sorted(p.name for p in fresh.iterdir()) and "model.safetensors" in names
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()   # noqa: E731
    assert {n: digest(fresh / n) for n in names} == {n: digest(sglang_server.model_dir / n) for n in names}
    assert "tools" in (fresh / "chat_template.jinja").read_text()


def test_a_server_outlives_no_killed_parent(tmp_path):
    """The process that started SGLang is SIGKILLed (a test run killed, `serve` stopped): the server in its own session
    gets SIGTERM from the kernel and every process of that session exits."""
    code = ("import sys, time; from runbook.demo import sglang; "
            f"s = sglang.start(log_path=sglang.Path({str(tmp_path / 'server.log')!r})); print(s.pid, flush=True); time.sleep(600)")
    before, left = left_after_parent_killed(code, oscalls.group_pids, 60)
    assert len(before) >= 3 and not left
