"""Every verb's flags come from one builder (cli._add_fields): the flags users have stay (tests/fixtures/cli-flags.json,
recorded before the builder was unified: only the meaningless --no-yes and --no-plan-only went), help shows each
default one way, and a bad value names its flag."""
import argparse
import json
import re

import pytest
from conftest import REPO

from runbook import cli

KEPT = json.loads((REPO / "tests" / "fixtures" / "cli-flags.json").read_text())


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_flags_users_have_are_kept():
    for verb, sp in _subparsers().items():
        have = {s for a in sp._actions for s in (a.option_strings or [a.dest])}
        assert set(KEPT[verb]) <= have, f"runbook {verb} lost {sorted(set(KEPT[verb]) - have)}"


def test_one_way_switches_have_no_negative_and_help_shows_defaults_one_way():
    for verb, sp in _subparsers().items():
        text = sp.format_help()
        assert "--no-yes" not in text and "--no-plan-only" not in text, verb
        assert "(default: null)" not in text and "(default: False)" not in text and "(default: None)" not in text, verb
        assert not re.search(r"\(default \d", text), f"{verb}: a default not shown as '(default: X)'"


@pytest.mark.parametrize("argv, flag", [
    (["bench", "--concurrency", "1,0"], "--concurrency"), (["bench", "--concurrency", "[1, x]"], "--concurrency"),
    (["kv", "--tp", "8.0"], "--tp"), (["tune", "--budget-s", "nan"], "--budget-s"),
    (["accuracy", "--depths", "0.5,2"], "--depths"), (["run", "--timeout", "0"], "--timeout"),
])
def test_a_bad_value_is_one_line_naming_its_flag(argv, flag, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"runbook {argv[0]}: error: {flag}"), err


def test_list_flags_take_commas_json_and_repeats():
    o = cli._options("bench", cli.build_parser().parse_args(["bench", "--concurrency", "1,2", "--concurrency", "[4]"]))
    assert o.concurrency == [1, 2, 4]
    svc = cli._options("service", cli.build_parser().parse_args(["service", "--arg", "cuda-graph-bs=1,2,4"]))
    assert svc.args == ["cuda-graph-bs=1,2,4"]       # one value per occurrence: its commas are its own
