"""The frozen benchmark corpus, shipped as package data: coding prompts and code text for haystacks.

The same corpus version gives byte-identical prompts on every commit and every machine; results
record `corpus_version`, and the regression check refuses to compare runs on different versions.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from functools import lru_cache
from importlib import resources

VERSION = "code-1"  # bump together with data/MANIFEST.json when a data file changes
CHARS_PER_TOKEN = 4  # the length approximation used without a tokenizer

__all__ = ["CHARS_PER_TOKEN", "VERSION", "code_prompts", "code_text", "manifest", "verify"]


def _read(name: str) -> bytes:
    """A data file's bytes; `code.txt` is stored gzipped (mtime 0), so a grep of the tree for the project's own names
    does not land in the frozen copy of its old sources. The manifest's SHA-256 is of the text itself."""
    data = resources.files(__name__).joinpath("data")   # one step at a time: Traversable on 3.10
    packed = data.joinpath(name + ".gz")
    if packed.is_file():
        return gzip.decompress(packed.read_bytes())
    return data.joinpath(name).read_bytes()


def manifest() -> dict:
    return json.loads(_read("MANIFEST.json"))


def verify() -> list[str]:
    """Names of data files whose SHA-256 differs from the manifest (empty: the corpus is intact)."""
    m = manifest()
    bad = [f for f, h in m["files"].items() if hashlib.sha256(_read(f)).hexdigest() != h]
    return bad + (["MANIFEST.json (version)"] if m.get("version") != VERSION else [])


@lru_cache(maxsize=1)
def _prompts() -> tuple[str, ...]:
    return tuple(json.loads(line)["prompt"] for line in _read("code_prompts.jsonl").decode().splitlines() if line.strip())


def code_prompts() -> list[str]:
    return list(_prompts())


@lru_cache(maxsize=1)
def code_text() -> str:
    """Real code for haystacks and long contexts (this project's sources, frozen at corpus version)."""
    return _read("code.txt").decode()
