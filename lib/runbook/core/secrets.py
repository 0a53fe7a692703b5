"""What counts as a secret, and scrubbing secret values out of text before it is archived or printed.

A secret value is scrubbed in every spelling it can take in the runner's output: raw, JSON-escaped
(how it sits inside an .ipynb or a results file), HTML-escaped (nbconvert's and jinja2's spellings of
& < > " '), URL-encoded (quote, quote_plus, lower-case hex), and the JSON-escaped form of each.
Minimum secret length scrubbed: 6 characters (``MIN_LEN``); shorter values are not scrubbed, because
masking them would mask ordinary words, so keys and tokens must be at least that long.
"""
from __future__ import annotations

import html
import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Key names that look secret (vLLM's collect_env skips the same family of names).
# "token" and "key" only as whole name components: HF_TOKEN and api_key are secrets, tokenizer and
# max_tokens are not.
_SECRET_KEY = re.compile(r"(secret|passw(or)?d|api[_-]?key|authori[sz]ation|credential|(^|[_-])(token|key)($|[_-]))", re.I)
MASK = "***redacted***"
MIN_LEN = 6  # shorter values would redact ordinary words


def is_secret_key(name: str) -> bool:
    """True for names such as HF_TOKEN, api_key, OPENAI_API_KEY, password, Authorization."""
    return bool(_SECRET_KEY.search(name))


def secret_values(env: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> set[str]:
    """Values of secret-looking environment variables plus any extra known secrets."""
    env = os.environ if env is None else env
    vals = {v for k, v in env.items() if is_secret_key(k) and v and len(v) >= MIN_LEN}
    vals.update(v for v in extra if v and len(v) >= MIN_LEN)
    return vals


def of_spec(spec: Any) -> set[str]:
    """A deployment's secret values to scrub: secret-looking environment variables, the value of the API key
    variable the spec names, and the values in serving.env_file (relative to the spec file)."""
    extra: list[str] = []
    if spec.serving.api_key_env and os.environ.get(spec.serving.api_key_env):
        extra.append(os.environ[spec.serving.api_key_env])
    if spec.serving.env_file:
        extra += read_env_file(spec.resolve_path(spec.serving.env_file)).values()
    return secret_values(extra=extra)


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """KEY=value pairs of a systemd EnvironmentFile (comments and blank lines skipped).

    A relative path is relative to the working directory here: callers holding a spec resolve it
    against the spec file first (``Deployment.resolve_path``)."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        out[k.strip()] = v
    return out


def _html_forms(s: str) -> set[str]:
    amp = s.replace("&", "&amp;")
    lt = amp.replace("<", "&lt;").replace(">", "&gt;")
    out = {html.escape(s, quote=False), html.escape(s, quote=True), lt}
    for dq in ("&quot;", "&#34;", "&#x22;"):
        for sq in ("&#x27;", "&#39;", "&apos;"):
            out.add(lt.replace('"', dq).replace("'", sq))
    return out


def _url_forms(s: str) -> set[str]:
    out = {urllib.parse.quote(s, safe=""), urllib.parse.quote(s), urllib.parse.quote_plus(s)}
    out |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), v) for v in list(out)}
    return out


def forms(secret: str) -> set[str]:
    """Every spelling of one secret value that output may contain (see the module docstring)."""
    base = {secret} | _html_forms(secret) | _url_forms(secret)
    out = set(base)
    for b in base:
        out.add(json.dumps(b)[1:-1])
        out.add(json.dumps(b, ensure_ascii=False)[1:-1])
    return {f for f in out if f}


def expand(secrets: Iterable[str]) -> list[str]:
    """All forms of all secrets, longest first (so a longer spelling is masked before a substring)."""
    allf = {f for s in secrets if s and len(s) >= MIN_LEN for f in forms(s)}
    return sorted(allf, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for s in expand(secrets):
        if s in text:
            text = text.replace(s, MASK)
    return text


def redact_mapping(d: Mapping[str, object]) -> dict[str, object]:
    """Copy of d with values of secret-looking keys masked (recursively)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        if is_secret_key(str(k)) and v not in (None, "", False):
            out[k] = MASK
        elif isinstance(v, Mapping):
            out[k] = redact_mapping(v)
        else:
            out[k] = v
    return out


def redact_tree(root: str | os.PathLike, secrets: Iterable[str]) -> list[Path]:
    """Replace every form of each secret value in every file under root, in place; returns files changed."""
    encoded = [s.encode() for s in expand(secrets)]
    changed: list[Path] = []
    if not encoded:
        return changed
    mask = MASK.encode()
    for p in Path(root).rglob("*"):
        if p.is_symlink() or not p.is_file():
            continue
        data = p.read_bytes()
        if not any(e in data for e in encoded):
            continue
        for e in encoded:
            data = data.replace(e, mask)
        tmp = p.with_name(f".{p.name}.redact")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, p.stat().st_mode & 0o777)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, p)
        changed.append(p)
    return changed
