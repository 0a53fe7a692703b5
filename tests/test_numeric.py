"""core/numeric.py: the one test for "an int (or a number), not a bool" that every reader of JSON and config uses."""
import math

import pytest

from runbook.core.numeric import is_int, is_number, number


@pytest.mark.parametrize("v, int_, num", [
    (3, True, True), (0, True, True), (-2, True, True), (2.5, False, True), (math.inf, False, True),
    (True, False, False), (False, False, False), ("3", False, False), (None, False, False), ([1], False, False),
])
def test_a_bool_is_neither_an_int_nor_a_number(v, int_, num):
    assert is_int(v) is int_ and is_number(v) is num
    assert number(v) == (v if num else None)
