"""systemd unit-file syntax: quoting for ExecStart= and Environment=, and reading units back.

systemd.syntax(7) / systemd.service(5): words are split on whitespace; "…" or '…' quote a whole
word; C escapes (\\\\, \\", \\n …) are decoded; `%` starts a specifier (write `%%`); in command lines
`$VAR`/`${VAR}` expand (write `$$`); a trailing backslash continues a line. There is no maintained
Python library for this, so the few rules needed are here, with a round-trip test.
"""
from __future__ import annotations

import re

from runbook.core.errors import SpecError

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "s": " ", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


_UNREPRESENTABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # control characters but tab
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}


def _reject_unrepresentable(value: str, what: str) -> None:
    m = _UNREPRESENTABLE.search(value)
    if m:
        name = _NAMES.get(m.group(), f"a control character ({m.group()!r})")
        raise SpecError(f"{what}: contains {name}, which a systemd unit line cannot carry; remove it")


def quote_word(value: str, what: str = "value", expand: bool = False) -> str:
    """One ExecStart word. `%` -> `%%`; `$` -> `$$` unless expand (a deliberate ${VAR})."""
    _reject_unrepresentable(value, what)
    v = value.replace("%", "%%")
    if not expand:
        v = v.replace("$", "$$")
    if v and _SAFE.match(v) and v != ";":
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_assignment(name: str, value: str) -> str:
    """The argument of one Environment= line: the whole assignment quoted when it must be."""
    _reject_unrepresentable(value, f"environment variable {name}")
    v = f"{name}={value}".replace("%", "%%")
    if _SAFE.match(v):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def split_words(line: str, expand_env: dict[str, str] | None = None) -> list[str]:
    """Split a command line or Environment= value into words as systemd does (specifiers left as %%→%)."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        buf: list[str] = []
        quote = line[i] if line[i] in "\"'" else None
        if quote:
            i += 1
        while i < n:
            c = line[i]
            if quote and c == quote:
                i += 1
                break
            if not quote and c in " \t":
                break
            if c == "\\" and i + 1 < n:
                nxt = line[i + 1]
                if nxt == "x" and i + 3 < n:
                    buf.append(chr(int(line[i + 2:i + 4], 16)))
                    i += 4
                    continue
                buf.append(_ESCAPES.get(nxt, nxt))
                i += 2
                continue
            if c == "%" and i + 1 < n and line[i + 1] == "%":
                buf.append("%")
                i += 2
                continue
            if c == "$" and i + 1 < n and line[i + 1] == "$":
                buf.append("$")
                i += 2
                continue
            if c == "$" and expand_env is not None and i + 1 < n and line[i + 1] == "{":
                j = line.index("}", i)
                buf.append(expand_env.get(line[i + 2:j], ""))
                i = j + 1
                continue
            buf.append(c)
            i += 1
        words.append("".join(buf))
    return words


def parse(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> [(key, value)] in order, continuation lines joined, comments dropped."""
    sections: dict[str, list[tuple[str, str]]] = {}
    cur: str | None = None
    # systemd ends lines at \n, \r\n, \r or NUL only (str.splitlines also splits at U+2028, \x0c …).
    lines = re.split(r"\r\n|\r|\n|\0", text)
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            cur = line[1:-1]
            sections.setdefault(cur, [])
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        if "=" in line and cur is not None:
            k, v = line.split("=", 1)
            sections[cur].append((k.strip(), v.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def environment(unit: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for v in values(unit, "Service", "Environment"):
        if not v:
            env.clear()  # an empty Environment= resets the list
            continue
        for word in split_words(v):
            if "=" in word:
                k, val = word.split("=", 1)
                env[k] = val
    return env


def flags_of(argv: list[str]) -> dict[str, str]:
    """--flag value pairs of a launch_server argv; switches map to "true"; repeats are joined."""
    out: dict[str, str] = {}
    key: str | None = None
    for a in argv:
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
                out[k], key = v, None
            else:
                key = a[2:]
                out[key] = "true"
        elif key is not None:
            out[key] = a if out[key] == "true" else out[key] + " " + a
    return out
