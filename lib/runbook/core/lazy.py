"""Lazy package attributes (PEP 562): a stage package names what it exports, and each name's module is
imported on first use. The registry imports every stage package to read its contract, so the CLI
(`runbook env --help`, cron) must not pay for pandas, matplotlib, aiohttp or ml_dtypes it never uses."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: table maps an exported name to its submodule
    ("report") or to a submodule and the name there ("plan:plan" for an alias)."""

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attr or name)
        setattr(sys.modules[package], name, value)          # once imported, a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
