"""Tool-call probe: a coding agent's tools (read_file, apply_patch, run_tests) sent with chat completions,
streaming and not, and what an agent loop needs checked on each answer:

- `parsed`: the call arrives as `tool_calls`, not as text left in `content` or `reasoning_content`
  (what a missing or wrong `--tool-call-parser` looks like);
- `arguments`: the arguments are valid JSON that matches the tool's schema (required keys, types);
- `streaming`: a large string argument (apply_patch's patch) streams as several argument deltas, not
  all at once in the final chunk (an agent UI shows nothing until the end otherwise);
- `finish_reason`: the choice ends with `tool_calls`.

A model that answers in prose without any trace of a call is reported as such (`warn`: the model, not
the parser); under `tool_choice="required"` (`--tool-choice required`) the server must call a tool, so prose
there is a `fail` (the server ignored the tools: e.g. a chat template that does not render them).
Reads are bounded (bytes and time); the API key never appears in the output.
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from runbook.accuracy.identity import server_config
from runbook.accuracy.settings import AccuracySettings
from runbook.core.findings import Finding, Status
from runbook.core.numeric import is_int
from runbook.core.secrets import redact_text
from runbook.endpoint.client import Client
from runbook.endpoint.reach import BadResponse, decode_json, model_name, read_bounded, run_sync
from runbook.endpoint.reach import probe as reachable
from runbook.endpoint.sse import SSEParser

if TYPE_CHECKING:
    import aiohttp

MAX_BODY_BYTES = 8 << 20          # one answer (or one whole stream) larger than this is not a tool call
MAX_EVENTS = 100_000
LARGE_ARG_CHARS = 200             # a string argument at least this long should stream in pieces
MIN_DELTAS = 3                    # "several" argument deltas before the end
HEAD_CHARS = 60                   # of an answer without a call, shown as evidence
PARSER_REMEDY = ("Start SGLang with the tool-call parser for this model family, e.g. `--tool-call-parser qwen3_coder` "
                 "(Qwen3-Coder), `qwen` (Qwen2.5), `llama3`, `deepseekv3`, `glm`, `kimi_k2`; check the chat template renders tools.")

# SGLang constrains tool_choice=required (and a named function) with its grammar backend; without one it refuses.
GRAMMAR_REMEDY = ("The server refused constrained decoding: tool_choice=required needs a grammar backend, and it was "
                  "started with `--grammar-backend none`. Start it with one (xgrammar, SGLang's default), or probe with "
                  "tool_choice auto.")

_PATCH_FILE = """\
def load_config(path):
    with open(path) as f:
        return parse_config(f.read())


def parse_config(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


def save_config(path, cfg):
    with open(path, "w") as f:
        for key, value in sorted(cfg.items()):
            f.write(f"{key} = {value}\\n")
"""

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the repository, optionally a range of lines.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "path relative to the repository root"},
            "start_line": {"type": "integer", "description": "first line, 1-based"},
            "end_line": {"type": "integer", "description": "last line, inclusive"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "apply_patch", "description": "Apply a unified diff to one file of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "the file the patch changes"},
            "patch": {"type": "string", "description": "the whole unified diff, with ---/+++ headers and @@ hunks"}},
            "required": ["path", "patch"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite, or some of its files, with pytest.",
        "parameters": {"type": "object", "properties": {
            "paths": {"type": "array", "items": {"type": "string"}, "description": "test files or directories"},
            "keyword": {"type": "string", "description": "pytest -k expression"},
            "verbose": {"type": "boolean"}},
            "required": ["paths"]}}},
]

PROMPTS: dict[str, str] = {
    "read_file": "Use the read_file tool to read lines 1 to 40 of src/server/config.py. Call the tool now; do not answer in prose.",
    "apply_patch": ("Here is src/server/config.py:\n\n```python\n" + _PATCH_FILE + "```\n\n"
                    "Rename parse_config to parse_config_text everywhere in this file and add a docstring to each "
                    "function. Make the change with the apply_patch tool: one call whose patch is the complete unified "
                    "diff. Call the tool now; do not answer in prose."),
    "run_tests": ("Use the run_tests tool to run tests/test_config.py and tests/test_server.py with the keyword "
                  "expression 'config' and verbose output. Call the tool now; do not answer in prose."),
}
SYSTEM = "You are a coding agent working in a Python repository. You act only through the tools you are given."
# Text a tool-call parser should have consumed (Qwen/Hermes XML, Qwen3-Coder, Mistral, Llama, DeepSeek, Kimi, GLM markers).
_MARKERS = re.compile(r"<tool_call>|</tool_call>|<function=|<parameter=|\[TOOL_CALLS\]|<\|tool_call|<\|python_tag\|>"
                      r"|<｜tool▁call|<\|tool_calls_section|<arg_key>")
_NAME_JSON = re.compile(r"[\"']name[\"']\s*:\s*[\"'](read_file|apply_patch|run_tests)[\"']")


def schema_of(tool: str) -> dict[str, Any]:
    for t in TOOLS:
        if t["function"]["name"] == tool:
            return dict(t["function"]["parameters"])
    raise KeyError(tool)


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """What is wrong with `value` against `schema`, one line per error (empty when it matches)."""
    import jsonschema  # lazy: ~1.2 s to import here, more than `runbook --help` takes in all
    v = jsonschema.Draft202012Validator(schema)
    return [f"arguments{''.join(f'.{p}' if isinstance(p, str) else f'[{p}]' for p in e.absolute_path)}: {e.message}"
            for e in sorted(v.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))]


@dataclass
class Case:
    tool: str
    stream: bool
    called: bool = False              # a tool_calls entry came back
    name: str | None = None
    arguments: str = ""
    in_content: bool = False          # call text left in content
    in_reasoning: bool = False        # call text left in reasoning_content
    content_chars: int = 0
    content_head: str = ""            # what came back instead, when no call did (the first characters)
    arguments_valid: bool | None = None
    schema_errors: list[str] = field(default_factory=list)
    argument_deltas: int = 0          # streaming: chunks that carried argument text
    last_delta_share: float | None = None   # streaming: fraction of the argument text in the last delta
    finish_reason: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "stream": self.stream, "called": self.called, "name": self.name,
                "in_content": self.in_content, "in_reasoning": self.in_reasoning, "content_chars": self.content_chars,
                "content_head": self.content_head,
                "arguments_valid": self.arguments_valid, "schema_errors": self.schema_errors,
                "arguments_chars": len(self.arguments), "argument_deltas": self.argument_deltas,
                "last_delta_share": self.last_delta_share, "finish_reason": self.finish_reason, "error": self.error}


@dataclass
class ToolCallReport:
    settings: AccuracySettings                               # its url and tool_choice
    model: str | None                                        # the one asked: s.model, else the server's first
    cases: list[Case] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)     # what /server_info says of tool calls (SGLang)
    template: dict[str, Any] = field(default_factory=dict)   # prompt tokens with and without the tools (rendered_tools)

    def data(self) -> dict[str, Any]:
        return {"url": self.settings.url, "model": self.model, "tool_choice": self.settings.tool_choice, "server": dict(self.server),
                "template": dict(self.template), "cases": [c.to_dict() for c in self.cases]}

    def to_json(self) -> dict[str, Any]:
        return {"toolcall": self.data(), "findings": [f.to_dict() for f in self.findings]}


def _looks_like_call(text: str) -> bool:
    return bool(text) and bool(_MARKERS.search(text) or _NAME_JSON.search(text))


def _body(s: AccuracySettings, tool: str, stream: bool, model: str | None) -> dict[str, Any]:
    b: dict[str, Any] = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[tool]}],
                         "tools": TOOLS, "tool_choice": s.tool_choice, "temperature": 0.0, "max_tokens": s.toolcall_max_tokens,
                         "stream": stream}
    if model:
        b["model"] = model
    return b


def _finish_args(case: Case) -> None:
    if not case.called:
        return
    try:
        args = json.loads(case.arguments) if case.arguments.strip() else {}
    except (ValueError, RecursionError) as e:
        case.arguments_valid = False
        case.schema_errors = [f"not JSON: {' '.join(str(e).split())[:120]}"]
        return
    case.arguments_valid = True
    case.schema_errors = schema_errors(args, schema_of(case.tool)) if case.name == case.tool else \
        [f"called {case.name!r}, not {case.tool!r}"]


def _one_call(calls: Any) -> dict[str, Any] | None:
    if not isinstance(calls, list) or not calls:
        return None
    first = calls[0] if isinstance(calls[0], dict) else {}
    fn = first.get("function")
    return fn if isinstance(fn, dict) else {}


async def _plain(s: aiohttp.ClientSession, url: str, headers: dict[str, str], case: Case, body: dict[str, Any]) -> None:
    async with s.post(url, json=body, headers=headers, allow_redirects=False) as r:
        raw = await read_bounded(r, str(r.url), MAX_BODY_BYTES)
        if r.status >= 400:
            case.error = f"HTTP {r.status}: {raw[:200].decode('utf-8', 'replace')}"
            return
    doc = decode_json(url, raw)
    choice = (doc.get("choices") or [{}])[0]
    if not isinstance(choice, dict):
        raise BadResponse(url, "choices[0] is not an object")
    msg = choice.get("message") or {}
    content = msg.get("content") or ""
    reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
    case.finish_reason = choice.get("finish_reason")
    fn = _one_call(msg.get("tool_calls"))
    if fn is not None:
        case.called, case.name = True, fn.get("name")
        a = fn.get("arguments")
        case.arguments = a if isinstance(a, str) else json.dumps(a)
    _text(case, str(content), str(reasoning))


def _text(case: Case, content: str, reasoning: str) -> None:
    case.content_chars = len(content)
    case.content_head = content[:HEAD_CHARS]
    case.in_content = _looks_like_call(content)
    case.in_reasoning = _looks_like_call(reasoning)


@dataclass
class _Stream:
    """What the streamed deltas carried, in arrival order."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)   # argument text of the first call, one entry per chunk that carried some
    events: int = 0


def _event(url: str, case: Case, st: _Stream, data: bytes) -> bool:
    """One SSE event's data; False when the stream is over ([DONE] or an error object)."""
    data = data.strip()
    if data == b"[DONE]":
        return False
    st.events += 1
    if st.events > MAX_EVENTS:
        raise BadResponse(url, f"more than {MAX_EVENTS:,} events")
    msg = decode_json(url, data)
    if msg.get("error"):
        case.error = f"server error mid-stream: {str(msg['error'])[:200]}"
        return False
    for ch in msg.get("choices") or []:
        if not isinstance(ch, dict):
            continue
        d = ch.get("delta") or {}
        st.content.append(str(d.get("content") or ""))
        st.reasoning.append(str(d.get("reasoning_content") or d.get("reasoning") or ""))
        for tc in d.get("tool_calls") or []:
            if not isinstance(tc, dict) or tc.get("index", 0) not in (0, None):
                continue
            fn = tc.get("function") or {}
            case.called = True
            if fn.get("name"):
                case.name = fn["name"]
            a = fn.get("arguments")
            if a:
                st.pieces.append(a if isinstance(a, str) else json.dumps(a))
        if ch.get("finish_reason"):
            case.finish_reason = ch["finish_reason"]
    return True


def _events(url: str, case: Case, st: _Stream, events: list[tuple[bytes, bytes]]) -> bool:
    """The events one read completed (their `event:` names play no part); False once the stream is over."""
    return all(_event(url, case, st, data) for _, data in events)


async def _streamed(s: aiohttp.ClientSession, url: str, headers: dict[str, str], case: Case, body: dict[str, Any]) -> None:
    st = _Stream()
    got = 0
    parser = SSEParser()    # events as the SSE specification cuts them: multi-line data, CR or CRLF, comments
    async with s.post(url, json=body, headers=headers, allow_redirects=False) as r:
        if r.status >= 400:
            case.error = f"HTTP {r.status}: {(await r.content.read(300)).decode('utf-8', 'replace')}"
            return
        async for piece in r.content.iter_any():
            got += len(piece)
            if got > MAX_BODY_BYTES:
                raise BadResponse(url, f"stream larger than the {MAX_BODY_BYTES:,} bytes allowed (stopped reading)")
            if not _events(url, case, st, parser.feed(piece)):
                break
        else:
            _events(url, case, st, parser.close())
    if case.error:
        return
    case.arguments = "".join(st.pieces)
    case.argument_deltas = len(st.pieces)
    if st.pieces and case.arguments:
        case.last_delta_share = round(len(st.pieces[-1]) / len(case.arguments), 3)
    _text(case, "".join(st.content), "".join(st.reasoning))


async def probe(s: AccuracySettings, url: str, model: str | None, tools: list[str] | None = None,
                timeout_s: float = 180.0) -> list[Case]:
    """Every tool (or `tools`), non-streaming then streaming, one request at a time, to `model` at `url`."""
    import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
    api_key = s.api_key
    c = Client(url, model, chat=True, api_key=api_key)
    headers = c.headers()
    cases: list[Case] = []
    # a fresh connection per request: llama-server closes its end after each stream
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        for tool in tools or list(PROMPTS):
            for stream in (False, True):
                case = Case(tool, stream)
                try:
                    await (_streamed if stream else _plain)(session, c.url, headers, case, _body(s, tool, stream, model))
                except BadResponse as e:
                    case.error = f"not an OpenAI chat answer: {e.reason}"
                except asyncio.TimeoutError:
                    case.error = f"no complete answer within {timeout_s:g} s"
                except (aiohttp.ClientError, OSError, ValueError) as e:
                    case.error = f"{type(e).__name__}: {e}"[:300]
                if case.error and api_key:
                    case.error = redact_text(case.error, [api_key])
                _finish_args(case)
                cases.append(case)
    return cases


async def _prompt_tokens(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict[str, Any]) -> int | None:
    """usage.prompt_tokens of a one-token answer to `body`; None when the server reports none."""
    async with session.post(url, json={**body, "max_tokens": 1, "stream": False}, headers=headers, allow_redirects=False) as r:
        raw = await read_bounded(r, str(r.url), MAX_BODY_BYTES)
        if r.status >= 400:
            return None
    n = (decode_json(url, raw).get("usage") or {}).get("prompt_tokens")
    return n if is_int(n) and n >= 0 else None


async def rendered_tools(s: AccuracySettings, url: str, model: str | None, timeout_s: float = 180.0) -> dict[str, Any]:
    """The same conversation with and without the tools, counted by the server (usage.prompt_tokens): equal counts
    mean the chat template dropped the tools, so the model never saw one and cannot call it, whatever the parser."""
    import aiohttp  # lazy: aiohttp (~0.15 s) only when a request is sent (the CLI's start-up stays light)
    c = Client(url, model, chat=True, api_key=s.api_key)
    body = _body(s, "read_file", False, model)
    bare = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            with_tools = await _prompt_tokens(session, c.url, c.headers(), body)
            without = await _prompt_tokens(session, c.url, c.headers(), bare)
    except (BadResponse, asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError):
        with_tools = without = None
    return {"prompt_tokens_with_tools": with_tools, "prompt_tokens_without_tools": without}


def template_finding(t: dict[str, Any], tool_choice: str = "auto") -> Finding:
    a, b = t.get("prompt_tokens_with_tools"), t.get("prompt_tokens_without_tools")
    fid, title = "accuracy.toolcall.template", "the chat template renders the tools"
    if a is None or b is None:
        return Finding(fid, "skip", f"{title}: not measured (the server reported no prompt token count)")
    if a > b:
        return Finding(fid, "pass", f"{title}: the prompt is {a - b} tokens longer with them ({b} → {a})")
    return Finding(fid, "fail" if tool_choice == "required" else "warn",
                   f"{title}: no — the prompt is {a} tokens with the tools and {b} without: the model never sees them",
                   detail="so no answer can be a tool call, whatever the model or the parser",
                   remedy="Serve a chat template that renders tools (SGLang: --chat-template FILE; llama-server: --jinja "
                          "with a tool-aware template), or a tool-trained model whose own template does.")


def _came_back(c: Case) -> str:
    head = " ".join(c.content_head.split())[:40]
    return repr(head + ("…" if c.content_chars > len(head) else "")) if head else "no text"


def _label(c: Case) -> str:
    return f"{c.tool} ({'stream' if c.stream else 'non-stream'})"


def _agg(fid: str, title: str, rows: list[tuple[Case, Status, str]], remedy: str, na: str) -> Finding:
    """One finding over the cases: the worst status, the failing cases as evidence."""
    if not rows:
        return Finding(fid, "skip", f"{title}: {na}")
    order = ("fail", "warn", "pass")
    worst: Status = min((st for _, st, _ in rows), key=order.index)
    bad = [f"{_label(c)}: {why}" for c, st, why in rows if st != "pass"]
    n_ok = sum(1 for _, st, _ in rows if st == "pass")
    return Finding(fid, worst, f"{title}: {n_ok} of {len(rows)} answers pass", evidence="; ".join(bad)[:600],
                   remedy=remedy if worst != "pass" else "")


def findings(cases: list[Case], tool_choice: str = "auto") -> list[Finding]:
    """Under `required` an answer without a call is a server fault (`fail`), under `auto` the model's choice (`warn`)."""
    out: list[Finding] = []
    errs = [c for c in cases if c.error]
    if errs:
        grammar = any("grammar" in (c.error or "").lower() for c in errs)
        out.append(Finding("accuracy.toolcall.requests", "fail", f"{len(errs)} of {len(cases)} tool-call requests failed",
                           evidence="; ".join(f"{_label(c)}: {c.error}" for c in errs)[:600],
                           remedy=GRAMMAR_REMEDY if grammar else
                           "A 400 on `tools` means the server was started without a tool-call parser "
                           "or the chat template has no tools: " + PARSER_REMEDY))
    live = [c for c in cases if not c.error]
    parsed: list[tuple[Case, Status, str]] = []
    for c in live:
        if c.called and not (c.in_content or c.in_reasoning):
            parsed.append((c, "pass", ""))
        elif c.in_content or c.in_reasoning:
            where = " and ".join(w for w, f in (("content", c.in_content), ("reasoning_content", c.in_reasoning)) if f)
            parsed.append((c, "fail", f"call text left in {where}" + (" (beside tool_calls)" if c.called else "")))
        elif tool_choice == "required":
            parsed.append((c, "fail", f"no tool call although tool_choice=required ({c.content_chars} chars of prose, "
                                      f"finish {c.finish_reason!r}: {_came_back(c)})"))
        else:
            parsed.append((c, "warn", f"no tool call: the model answered in prose ({c.content_chars} chars, "
                                      f"finish {c.finish_reason!r}: {_came_back(c)})"))
    out.append(_agg("accuracy.toolcall.parsed", "tool calls parsed into tool_calls", parsed,
                    "Text left in content/reasoning_content is an unparsed call: " + PARSER_REMEDY
                    + " Prose without a call: the model did not use the tool (try a tool-trained model or tool_choice)."
                    + " Prose under tool_choice=required: the server ignored the tools — its chat template does not"
                    " render them (llama-server without a tool-aware template) or no parser constrains the output.",
                    "no answers"))
    called = [c for c in live if c.called]
    args: list[tuple[Case, Status, str]] = [
        (c, "pass" if c.arguments_valid and not c.schema_errors else "fail",
         "; ".join(c.schema_errors[:3]) if c.schema_errors else ("" if c.arguments_valid else "arguments not JSON"))
        for c in called]
    out.append(_agg("accuracy.toolcall.arguments", "tool-call arguments are JSON matching the schema", args,
                    "Invalid or incomplete arguments usually mean the parser does not match the model's call format "
                    "(or the streamed fragments do not add up): " + PARSER_REMEDY, "no tool calls to check"))
    stream_rows: list[tuple[Case, Status, str]] = []
    for c in called:
        if not c.stream or len(c.arguments) < LARGE_ARG_CHARS:
            continue
        share = c.last_delta_share if c.last_delta_share is not None else 1.0
        if c.argument_deltas <= 1 or share > 0.9:
            st: Status = "fail"
        elif c.argument_deltas < MIN_DELTAS:
            st = "warn"
        else:
            st = "pass"
        stream_rows.append((c, st, f"{len(c.arguments)} argument chars in {c.argument_deltas} deltas, "
                                   f"{share:.0%} in the last"))
    out.append(_agg("accuracy.toolcall.streaming", "large arguments stream progressively", stream_rows,
                    "The whole argument arrived at the end: the parser buffers until the call closes. Use a parser "
                    "that streams parameters, e.g. `--tool-call-parser qwen3_coder` for Qwen3-Coder, on a current SGLang.",
                    f"no streamed call with an argument of {LARGE_ARG_CHARS}+ chars"))
    fin: list[tuple[Case, Status, str]] = [
        (c, "pass" if c.finish_reason == "tool_calls" else "fail", f"finish_reason {c.finish_reason!r}") for c in called]
    out.append(_agg("accuracy.toolcall.finish_reason", "finish reason is tool_calls", fin,
                    "Agent loops stop on a finish reason other than tool_calls: " + PARSER_REMEDY
                    + " A 'length' finish means max_tokens cut the call off.", "no tool calls to check"))
    return out


def run(s: AccuracySettings, tools: list[str] | None = None, timeout_s: float = 180.0) -> ToolCallReport:
    """The probe at s.url as one call (CLI, notebook): a `skip` finding without a reachable endpoint."""
    url, api_key = s.url, s.api_key
    if not url:
        return ToolCallReport(s, s.model, findings=[Finding("accuracy.toolcall.endpoint", "skip",
                                                            "tool-call probe skipped: no endpoint given", remedy="Give --url.")])
    why = run_sync(reachable(url))
    if why:
        return ToolCallReport(s, s.model, findings=[Finding(
            "accuracy.toolcall.endpoint", "skip", f"tool-call probe skipped: no server at {url}",
            evidence=redact_text(why, [api_key]) if api_key else why, remedy="Start the server, or give its URL.")])
    model = s.model or run_sync(model_name(url, api_key))
    cases = run_sync(probe(s, url, model, tools, timeout_s))
    template = run_sync(rendered_tools(s, url, model, timeout_s))
    server = server_settings(url, api_key)
    out = [template_finding(template, s.tool_choice), *findings(cases, s.tool_choice)]
    if server:
        said = "; ".join(f"{k}: {v}" for k, v in server.items())
        out = [replace(f, detail=f"{f.detail + '; ' if f.detail else ''}server's {said}")
               if f.id == "accuracy.toolcall.parsed" else f for f in out]
    return ToolCallReport(s, model, cases, out, server, template)


def server_settings(url: str, api_key: str | None = None) -> dict[str, Any]:
    """The server's own tool-call settings from /server_info (SGLang): the parser the calls went through, the
    grammar backend that tool_choice=required needs, the version; empty for a server without /server_info."""
    cfg = server_config(url, api_key) or {}
    return {k: cfg[k] for k in ("version", "tool_call_parser", "grammar_backend") if k in cfg}
