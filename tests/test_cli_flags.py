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


def _models() -> dict[str, type]:
    """verb -> the options model its flags are built from."""
    from runbook import fleet
    from runbook.core import registry
    from runbook.runner.run import PushOptions, RunOptions

    return {"run": RunOptions, "push": PushOptions, "fleet": fleet.FleetOptions,
            **{s.verb: s.options for s in registry.stages()}}


def test_every_verb_s_flags_are_its_model_s_and_every_default_is_shown():
    """push and fleet are built like run and the stages: a flag per field (bar the markers that say otherwise), and
    each field's default in its help as '(default: X)' (or the help's own words for it)."""
    from runbook.core.options import flag, marks

    models = _models()
    assert set(models) == set(_subparsers())
    for verb, sp in _subparsers().items():
        by_dest = {a.dest: a for a in sp._actions}
        for name, f in models[verb].model_fields.items():
            if marks(f).get("internal") or marks(f).get("shared"):
                continue
            a = by_dest[name]
            assert marks(f).get("positional") or flag(models[verb], name) in a.option_strings, (verb, name)
            shown = not f.is_required() and f.default not in (None, False, []) and f.default_factory is None and f.description
            if shown:
                assert "(default" in a.help, f"runbook {verb} --help: {a.option_strings} hides its default {f.default!r}"


# Recorded from `--help` before push and fleet were built from their models: flags, metavars, and --from required.
USAGE = {
    "push": "usage: runbook push [-h] [--deployment FILE] [--out DIR] [--archive-url URL] [--run RUN_ID] [--json]",
    "fleet": "usage: runbook fleet [-h] --from URL [--out DIR] [--links {relative,presigned}] [--link-base URL] "
             "[--expires S] [--trend N] [--workers N] [--publish] [--json]",
}


@pytest.mark.parametrize("verb", sorted(USAGE))
def test_push_and_fleet_keep_their_metavars(verb):
    assert " ".join(_subparsers()[verb].format_usage().split()) == USAGE[verb]


def test_push_and_fleet_defaults_are_kept():
    from pathlib import Path

    from runbook.runner.run import OUTPUTS

    p = cli.build_parser()
    push = cli.validate(cli.PushOptions, cli._values(cli.PushOptions, p.parse_args(["push"])), cli=True)
    assert (push.out, push.archive_url, push.deployment, push.runs) == (OUTPUTS, None, None, [])
    push = cli.validate(cli.PushOptions, cli._values(cli.PushOptions, p.parse_args(["push", "--run", "a", "--run", "b,c"])))
    assert push.runs == ["a", "b,c"]                 # one run id per --run, as `append` took them
    fl = cli.fleet.FleetOptions
    got = cli.validate(fl, cli._values(fl, p.parse_args(["fleet", "--from", "s3://b/p"])), cli=True)
    assert got.model_dump() == {"source": "s3://b/p", "out": Path("fleet"), "links": "relative", "link_base": None,
                                "expires": 7 * 86400, "trend": 30, "workers": 64, "publish": False}


@pytest.mark.parametrize("argv, model, values", [
    (["run", "--keep", "0"], "RunOptions", {"keep": "0"}),
    (["fleet", "--from", "s3://b", "--trend", "1.5"], "FleetOptions", {"source": "s3://b", "trend": "1.5"}),
    (["tune", "--resume", "../x"], "tune", {"resume": "../x"}),
    (["verify", "--since", "yesterdayish"], "verify", {"since": "yesterdayish"}),
    (["verify", "--url", "ftp://x"], "verify", {"server_url": "ftp://x"}),
])
def test_a_flag_s_error_is_its_model_s_with_the_value_once(argv, model, values, capsys):
    """The per-flag check (argparse) and the model's own say the same thing, and the value shows once: the builder adds
    it, the validators never quote it."""
    from runbook.core.errors import InputError

    models = {"RunOptions": cli.RunOptions, "FleetOptions": cli.fleet.FleetOptions}
    m = models.get(model) or cli._VERBS[model].options
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    with pytest.raises(InputError) as e:
        cli.validate(m, values, cli=True)
    assert err.endswith(f"error: {e.value}"), (err, str(e.value))
    assert err.count(argv[-1]) == 1, err


@pytest.mark.parametrize("argv", [
    ["run", "--archive-url", "s3x//SECRETvalue"], ["push", "--archive-url", "s3x//SECRETvalue"],
    ["fleet", "--from", "s3x//SECRETvalue"], ["push", "--archive-url", "s3://SECRETvalue?x=1"],
])
def test_a_value_marked_echo_false_is_never_repeated(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {argv[-2]}" in err and "SECRET" not in err, err
