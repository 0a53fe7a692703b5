"""The model's tokenizer, when a tokenizer.json is on this machine (exact prompt lengths)."""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from runbook.core.errors import InputError
from runbook.core.fsutil import FileRefused, read_regular


def load_tokenizer(path: str | Path | None, option: str = "--tokenizer") -> Any:
    """A `tokenizers.Tokenizer` from DIR/tokenizer.json (or the file itself); None when no path is given.

    A path given but holding no readable tokenizer is an InputError naming it (lengths would silently be
    approximate otherwise)."""
    from tokenizers import Tokenizer  # lazy: the tokenizers library only when a tokenizer is loaded
    if not path:
        return None
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise InputError(f"{option} {path}: no tokenizer.json there; give the model's directory (with tokenizer.json) "
                         f"or the file, or leave {option} out (lengths are then approximate)")
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # the tokenizers library raises its own Exception for any bad file
        why = " ".join(str(e).split())[:160]
        raise InputError(f"{option} {f}: not a tokenizer the tokenizers library reads ({why}); "
                         "give the model's own tokenizer.json") from None


MAX_TEMPLATE_BYTES = 1 << 20


def _special(v: Any) -> str:
    """tokenizer_config's bos/eos: a string, or an AddedToken-style {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


def chat_template(path: str | Path | None) -> tuple[str, dict[str, str]] | None:
    """The model's chat template and its special tokens: DIR/chat_template.jinja, else
    tokenizer_config.json's `chat_template` (a string, or a list of named templates: "default");
    None when the directory has neither or they are unreadable."""
    if not path or not Path(path).is_dir():
        return None
    d = Path(path)
    try:
        cfg = json.loads(read_regular(d / "tokenizer_config.json", MAX_TEMPLATE_BYTES * 8, what="tokenizer_config.json"))
    except (OSError, FileRefused, ValueError, RecursionError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    specials = {"bos_token": _special(cfg.get("bos_token")), "eos_token": _special(cfg.get("eos_token"))}
    try:
        return read_regular(d / "chat_template.jinja", MAX_TEMPLATE_BYTES, what="chat_template.jinja").decode(), specials
    except (OSError, FileRefused, UnicodeDecodeError):
        pass
    t = cfg.get("chat_template")
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return (t, specials) if isinstance(t, str) and t else None


class ChatCounter:
    """Prompt tokens of a chat request as the server counts them: the messages rendered with the
    model's chat template (add_generation_prompt, as SGLang's chat endpoint does) in a sandboxed Jinja
    environment like transformers' `apply_chat_template`, then tokenized without adding special
    tokens (the template writes them). `count` is None when the template refuses the messages."""

    def __init__(self, tokenizer: Any, template: str, specials: dict[str, str]):
        from jinja2.ext import loopcontrols  # lazy: jinja2's sandbox only when a chat template is rendered
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # lazy: jinja2's sandbox only when a chat template is rendered
        def raise_exception(msg: str) -> None:
            raise ValueError(msg)

        def strftime_now(fmt: str) -> str:
            return datetime.datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        self.template = env.from_string(template)
        self.tokenizer = tokenizer
        self.specials = specials

    def render(self, messages: list[dict[str, Any]]) -> str:
        return str(self.template.render(messages=messages, add_generation_prompt=True, tools=None, **self.specials))

    def count(self, messages: list[dict[str, Any]]) -> int | None:
        try:
            text = self.render(messages)
        except Exception:  # a template that refuses these messages: no count, not a crash
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def chat_counter(path: str | Path | None, tokenizer: Any) -> ChatCounter | None:
    """A ChatCounter for the model at `path`, when it has a tokenizer and a chat template that compiles."""
    if tokenizer is None:
        return None
    found = chat_template(path)
    if found is None:
        return None
    try:
        return ChatCounter(tokenizer, *found)
    except Exception:  # a template Jinja cannot compile: fall back to content counts
        return None
