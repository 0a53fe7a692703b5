"""Injection into the rendered systemd unit: every spec value is validated for its directive or escaped.

The oracle is systemd itself: `systemd --test --system` (run as an unprivileged user, as systemd
requires) loads the rendered unit from a private unit path and dumps what it parsed: User=, Group=,
WorkingDirectory=, Environment=, EnvironmentFile= and each command line's argv (before the
exec-time ${VAR}/$$ expansion, which `_exec_time` below applies as systemd's replace_env_argv does).
"""
from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import spec_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook import service
from runbook.core import spec
from runbook.core.errors import SpecError
from runbook.service import unitfile

API_KEY = "sk-test-value-1234"


def dep(source: str | None = None, **changes: Any) -> spec.Deployment:
    data = spec_data(**changes)
    return spec.from_dict(data, source or str(spec.DEFAULT_SPEC))


# ---------------------------------------------------------------- the systemd oracle

def _systemd_cmd() -> list[str] | None:
    exe = shutil.which("systemd") or ("/usr/lib/systemd/systemd" if os.path.exists("/usr/lib/systemd/systemd") else None)
    if not exe:
        return None
    cmd = [exe, "--test", "--system", "--log-target=console", "--no-pager"]
    if os.geteuid() == 0:  # "Don't run test mode as root."
        runuser = shutil.which("runuser") or shutil.which("setpriv")
        if not runuser:
            return None
        pre = [runuser, "-u", "nobody", "--"] if runuser.endswith("runuser") else \
              [runuser, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        cmd = pre + cmd
    return cmd


SYSTEMD = _systemd_cmd()
needs_systemd = pytest.mark.skipif(SYSTEMD is None, reason="systemd (for `systemd --test`) not installed")
_STUBS = ("sysinit.target", "basic.target", "shutdown.target")


def _unquote_words(line: str) -> list[str]:
    """Words of a dumped `Command Line:` (systemd's shell_maybe_quote: "..." with C/shell escapes)."""
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
              "'": "'", "$": "$", "`": "`"}
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        if line[i] == " ":
            i += 1
            continue
        buf = []
        if line[i] == '"':
            i += 1
            while line[i] != '"':
                c = line[i]
                if c != "\\":
                    buf.append(c)
                    i += 1
                    continue
                e = line[i + 1]
                if e in simple:
                    buf.append(simple[e])
                    i += 2
                elif e == "x":
                    buf.append(chr(int(line[i + 2:i + 4], 16)))
                    i += 4
                elif e in "01234567":
                    buf.append(chr(int(line[i + 1:i + 4], 8)))
                    i += 4
                elif e in "uU":
                    k = 4 if e == "u" else 8
                    buf.append(chr(int(line[i + 2:i + 2 + k], 16)))
                    i += 2 + k
                else:
                    raise AssertionError(f"unexpected escape \\{e} in {line!r}")
            i += 1
            assert i >= n or line[i] == " ", line
        else:
            while i < n and line[i] != " ":
                buf.append(line[i])
                i += 1
        words.append("".join(buf))
    return words


def _exec_time(argv: list[str], env: dict[str, str]) -> list[str]:
    """systemd's replace_env_argv (252): a whole-word braceless $NAME splits; ${NAME} and $$ in words."""
    out: list[str] = []
    for w in argv:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            out += env.get(m.group(1), "").split()
            continue
        buf, i = [], 0
        while i < len(w):
            if w.startswith("$$", i):
                buf.append("$")
                i += 2
            elif w.startswith("${", i) and "}" in w[i:]:
                j = w.index("}", i)
                buf.append(env.get(w[i + 2:j], ""))
                i = j + 1
            else:
                buf.append(w[i])
                i += 1
        out.append("".join(buf))
    return out


def systemd_view(r: service.Rendered) -> dict[str, list[Any]]:
    """What systemd parsed from the unit: {"User": [...], ..., "ExecStart": [argv, ...]} (argv at exec time)."""
    assert SYSTEMD is not None
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        for stub in _STUBS:
            Path(d, stub).write_text("[Unit]\nDefaultDependencies=no\n")
        name = f"{r.unit_name}.service"
        Path(d, name).write_text(r.text, encoding="utf-8")
        for p in Path(d).iterdir():
            os.chmod(p, 0o644)
        cp = subprocess.run([*SYSTEMD, f"--unit={name}"], env={"SYSTEMD_UNIT_PATH": d, "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    bad = [ln for ln in cp.stderr.splitlines() if name in ln and "Special user nobody" not in ln]
    assert not bad, bad  # systemd complained about a line of the unit
    view: dict[str, list[Any]] = {}
    inside, cmd = False, None
    for ln in cp.stdout.split("\n"):
        if ln == f"\t-> Unit {name}:":
            inside = True
            continue
        if not inside:
            continue
        if ln.startswith("\t-> Unit ") or (ln and not ln.startswith("\t\t")):
            break
        m = re.match(r"\t\t-> (Exec\w+):$", ln)
        if m:
            cmd = m.group(1)
            continue
        if ln.startswith("\t\t\tCommand Line: ") and cmd:
            view.setdefault(cmd, []).append(_exec_time(_unquote_words(ln[len("\t\t\tCommand Line: "):]),
                                                       {"SGLANG_API_KEY": API_KEY}))
            continue
        m = re.match(r"\t\t([A-Za-z]+): (.*)$", ln)
        if m:
            cmd = None
            view.setdefault(m.group(1), []).append(m.group(2))
    assert "ExecStart" in view, cp.stdout[-2000:]
    return view


def intended_argv(r: service.Rendered) -> list[str]:
    """The argv the server must get: the renderer's own --api-key ${VAR} expanded, nothing else."""
    argv = list(r.argv)
    assert argv[-2:] == ["--api-key", "${SGLANG_API_KEY}"]
    return argv[:-1] + [API_KEY]


# ---------------------------------------------------------------- named cases

REFUSED = {
    "newline in user": ({"systemd.user": "theuser\nExecStartPre=/bin/touch /tmp/pwned"}, None, "systemd.user"),
    "newline in group": ({"systemd.group": "g\nExecStartPre=/bin/true"}, None, "systemd.group"),
    "shell in user": ({"systemd.user": "root;id"}, None, "systemd.user"),
    "newline in working_directory": ({"systemd.working_directory": "/srv\nExecStartPre=/bin/true"}, None,
                                     "systemd.working_directory"),
    "relative working_directory": ({"systemd.working_directory": "models"}, None, "systemd.working_directory"),
    "trailing backslash in working_directory": ({"systemd.working_directory": "/srv\\"}, None, "systemd.working_directory"),
    "newline in env_file": ({"serving.env_file": "/etc/x.env\nExecStartPre=/bin/true"}, None, "serving.env_file"),
    "newline in unit_name": ({"systemd.unit_name": "sglang\nExecStartPre=/bin/true"}, None, "systemd.unit_name"),
    "shell in host": ({"serving.host": "127.0.0.1/x;touch${IFS}/tmp/p;#"}, None, "serving.host"),
    "url in host": ({"serving.host": "http://127.0.0.1"}, None, "serving.host"),
    "newline in node address": ({"parallelism.tp": 16, "parallelism.nodes": [
        {"name": "a", "address": "10.0.0.1\nExecStartPre=/bin/true"}, {"name": "b", "address": "10.0.0.2"}]}, None,
        "parallelism.nodes[0].address"),
    "relative python": ({"serving.python": "python3"}, None, "serving.python"),
    "newline in model path": ({"model.path": "m\nExecStartPre=/bin/true"}, None, "model.path"),
    "newline in served name": ({"model.served_name": "q\nExecStartPre=/bin/true"}, None, "model.served_name"),
    "api_key_env not a name": ({"serving.api_key_env": "X} --evil ${Y"}, None, "serving.api_key_env"),
    "admin-api-key flag": ({"serving.flags": {"admin-api-key": "sk-live-123456"}}, None, "serving.flags.admin-api-key"),
    "secret flag token": ({"serving.flags": {"hf-token": "hf_123456"}}, None, "serving.flags.hf-token"),
    "newline in --arg value": ({}, ["chat-template=a\nExecStartPre=/bin/true"], "--arg chat-template"),
    "vertical tab in flag": ({"serving.flags": {"chat-template": "a\x0bb"}}, None, "serving.flags.chat-template"),
    "newline in env value": ({"serving.env": {"X": "a\nExecStartPre=/bin/true"}}, None, "serving.env.X"),
}


@pytest.mark.parametrize("changes,args,field", REFUSED.values(), ids=REFUSED.keys())
def test_refused_with_one_line_naming_the_field(changes, args, field):
    with pytest.raises(SpecError) as e:
        service.render(dep(**changes), service.parse_args(args) if args else None)
    msg = str(e.value)
    assert field in msg, msg
    assert "\n" not in msg and "\r" not in msg


def test_admin_api_key_message_points_to_env_file():
    with pytest.raises(SpecError, match=r"serving\.flags\.admin-api-key: secrets belong in serving\.env_file"):
        service.render(dep(**{"serving.flags": {"admin-api-key": "sk-live-123456"}}))


@needs_systemd
def test_percent_in_working_directory_and_env_file_is_literal():
    r = service.render(dep(**{"systemd.working_directory": "/srv/%h/my models", "serving.env_file": "/etc/sglang/%i.env"}))[0]
    v = systemd_view(r)
    assert v["WorkingDirectory"] == ["/srv/%h/my models"]
    assert v["EnvironmentFile"][0].split(" (")[0] == "/etc/sglang/%i.env"


@needs_systemd
def test_dollar_home_in_arg_value_reaches_the_server_verbatim():
    r = service.render(dep(), service.parse_args(["chat-template=${HOME}", "tool-call-parser=$HOME/x %h 100%"]))[0]
    argv = systemd_view(r)["ExecStart"][0]
    assert argv == intended_argv(r)
    assert argv[argv.index("--chat-template") + 1] == "${HOME}"
    assert argv[argv.index("--tool-call-parser") + 1] == "$HOME/x %h 100%"


@needs_systemd
def test_env_values_and_every_directive_as_systemd_reads_them():
    env = {"A": "has space", "B": 'quote"d', "C": "50%h", "D": "back\\slash", "E": "${NOT_EXPANDED}", "F": "tab\there"}
    d = dep(**{"serving.env": env})
    r = service.render(d)[0]
    v = systemd_view(r)
    assert dict(x.split("=", 1) for x in v["Environment"]) == env
    assert v["User"] == [d.systemd.user] and v["Group"] == [d.systemd.group]
    assert v["WorkingDirectory"] == [d.systemd.working_directory]
    assert v["EnvironmentFile"][0].split(" (")[0] == d.serving.env_file
    assert v["TimeoutStartSec"] == ["30min"] and v["RestartSec"] == ["30s"]
    assert v["ExecStart"] == [intended_argv(r)]


@needs_systemd
def test_readiness_check_is_the_serving_python_without_a_shell():
    """No curl (--retry-all-errors needs curl >= 7.71: not on Ubuntu 20.04 or RHEL 8), no shell; systemd
    hands the probe program, the URL and the tries over as written (tests/adversarial/test_edges.py runs it)."""
    d = dep(**{"systemd.timeout_start_sec": 600, "serving.host": "0.0.0.0", "serving.port": 31000})
    r = service.render(d)[0]
    assert "/bin/sh" not in r.text and "curl" not in r.text
    [argv] = systemd_view(r)["ExecStartPost"]
    assert argv[:3] == [d.serving.python, "-I", "-c"] and argv[4:] == ["http://127.0.0.1:31000/ready", "120"]  # 120 tries, 5 s apart
    assert argv[3] == importlib.import_module("runbook.service.render")._ready_argv(d)[3]
    assert "\\n" in argv[3] and "\n" not in argv[3]   # Python's escapes in one word, no newline in the unit


def test_ipv6_host_is_bracketed_in_the_ready_url():
    r = service.render(dep(**{"serving.host": "::1"}))[0]
    post = unitfile.split_words(unitfile.values(unitfile.parse(r.text), "Service", "ExecStartPost")[0])
    assert post[-2] == "http://[::1]:30000/ready"   # then the number of tries


@needs_systemd
def test_control_chars_in_spec_file_name_stay_in_the_comment():
    r = service.render(dep(source="/tmp/x\nExecStartPre=/bin/touch /tmp/pwned\n.yaml"))[0]
    assert "ExecStartPre" not in systemd_view(r)
    assert "\nExecStartPre" not in r.text


@needs_systemd
@pytest.mark.parametrize("value", ["a\u2028b", "x\u2029", "semi;colon", ";", "", "  lead", "trail\\", '"', "'", "`id`",
                                   "$(id)", "${IFS}", "%%", "\\n", "é"])
def test_awkward_flag_values_round_trip(value):
    r = service.render(dep(**{"serving.flags": {"chat-template": value}}))[0]
    argv = systemd_view(r)["ExecStart"][0]
    assert argv == intended_argv(r) and argv[argv.index("--chat-template") + 1] == value
    assert unitfile.split_words(unitfile.values(unitfile.parse(r.text), "Service", "ExecStart")[0]) == r.argv


# ---------------------------------------------------------------- property: render -> systemd -> argv

# Printable text (no control characters, no surrogates), salted with the fragments systemd treats specially.
_values = st.lists(st.one_of(st.characters(blacklist_categories=("Cc", "Cs")),
                             st.sampled_from(["${HOME}", "$HOME", "$$", "%h", "%%", "\\", '"', "'", " ", ";", "\u2028", "\\n"])),
                   max_size=20).map("".join)


@pytest.mark.slow  # 50 examples, one `systemd --test` each
@needs_systemd
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=_values, b=_values, c=_values)
def test_random_flag_values_round_trip_through_systemd(a, b, c):
    r = service.render(dep(**{"serving.flags": {"chat-template": a, "kv-cache-dtype": b}}),
                       service.parse_args([f"tool-call-parser={c}"]))[0]
    argv = systemd_view(r)["ExecStart"][0]
    assert argv == intended_argv(r)
    assert argv[argv.index("--chat-template") + 1] == a and argv[argv.index("--kv-cache-dtype") + 1] == b
    assert unitfile.split_words(unitfile.values(unitfile.parse(r.text), "Service", "ExecStart")[0]) == r.argv


@pytest.mark.parametrize("launch", [
    "--model-path x --api-key  sk-live-SECRET-123456 --tp-size 8",
    "--model-path x --api-key\tsk-live-SECRET-123456",
    "--model-path x --admin-api-key=sk-live-SECRET-123456",
    ["--model-path", "x", "--api-key", "sk-live-SECRET-123456", "--tp-size", "8"],
    ["--model-path", "x", "--admin-api-key=sk-live-SECRET-123456"],
    {"argv": ["--api-key", "sk-live-SECRET-123456"]},
])
def test_drift_redacts_launch_command_in_every_shape(launch):
    from runbook.service import redact_server_info

    out = redact_server_info({"launch_command": launch, "nested": {"cmd": launch}, "tp_size": 8})
    assert "SECRET" not in json.dumps(out) and out["tp_size"] == 8
    # the key itself, wherever it appears, when the runbook knows it
    assert "SECRET" not in json.dumps(redact_server_info({"note": "key sk-live-SECRET-123456"}, "sk-live-SECRET-123456"))


def test_drift_keeps_numbers_under_secret_like_names_and_masks_the_rest():
    """SGLang's memory_usage.token_capacity is named like a secret (token_…) but is a count; a string, list or object
    under such a name is still masked."""
    from runbook.core.secrets import MASK
    from runbook.service import redact_server_info

    out = redact_server_info({"internal_states": [{"memory_usage": {"token_capacity": 214182, "token_capacity_swa": None}}],
                              "api_key": "sk-live-SECRET-123456", "api_keys": ["sk-live-SECRET-123456"],
                              "hf_token": {"v": "sk-live-SECRET-123456"}})
    assert out["internal_states"][0]["memory_usage"]["token_capacity"] == 214182
    assert out["api_key"] == out["api_keys"] == out["hf_token"] == MASK and "SECRET" not in json.dumps(out)
