"""What counts as a secret, and scrubbing secret values out of text before it is archived."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Mapping

# Key names that look secret (vLLM's collect_env skips the same family of names).
# "token" and "key" only as whole name components: HF_TOKEN and api_key are secrets, tokenizer and
# max_tokens are not.
_SECRET_KEY = re.compile(r"(secret|passw(or)?d|api[_-]?key|authori[sz]ation|credential|(^|[_-])(token|key)($|[_-]))", re.I)
MASK = "***redacted***"
_MIN_LEN = 6  # shorter values would redact ordinary words


def is_secret_key(name: str) -> bool:
    """True for names such as HF_TOKEN, api_key, OPENAI_API_KEY, password, Authorization."""
    return bool(_SECRET_KEY.search(name))


def secret_values(env: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> set[str]:
    """Values of secret-looking environment variables plus any extra known secrets."""
    env = os.environ if env is None else env
    vals = {v for k, v in env.items() if is_secret_key(k) and v and len(v) >= _MIN_LEN}
    vals.update(v for v in extra if v and len(v) >= _MIN_LEN)
    return vals


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """KEY=value pairs of a systemd EnvironmentFile (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        out[k.strip()] = v
    return out


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for s in sorted(secrets, key=len, reverse=True):
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
    """Replace secret values in every text file under root, in place; returns files changed."""
    import json

    # Also catch the JSON-escaped spelling, which is how a value sits inside an .ipynb.
    secrets = {v for s in secrets if s for v in (s, json.dumps(s)[1:-1])}
    changed: list[Path] = []
    if not secrets:
        return changed
    encoded = [s.encode() for s in secrets]
    for p in Path(root).rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        data = p.read_bytes()
        if not any(e in data for e in encoded):
            continue
        for s in sorted(secrets, key=len, reverse=True):
            data = data.replace(s.encode(), MASK.encode())
        tmp = p.with_name(f".{p.name}.redact")
        tmp.write_bytes(data)
        os.replace(tmp, p)
        changed.append(p)
    return changed
