"""Numbers read from JSON, YAML, config.json or a server's answer: Python's bool is an int, so `True` would pass
for 1 wherever a count or a figure is checked with isinstance alone. One test each, here."""
from __future__ import annotations

from typing import Any, TypeGuard


def is_int(v: Any) -> TypeGuard[int]:
    """An int, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[int | float]:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def number(v: Any) -> float | None:
    """A figure read back from a results file: the number, else None."""
    return v if is_number(v) else None
