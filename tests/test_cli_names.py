"""cli.py names no field of any options model: every verb's flags, values and stage look-ups go through the model's
own fields (`cli._add_fields`, `cli._values`, the field markers), so a stage, `run`, `push` or `fleet` can rename,
add or drop a setting without cli.py changing.

Why not a grep for the field names: many are ordinary words cli.py needs for other things — `out` is a local list in
`resume_command`, `url` an attribute of an upload result, `--out` and `--json` flag strings, `model` a parameter
name, and the help text is prose. What would tie cli.py to a setting is narrower, and that is what is checked:
- a string literal equal to a field name (`"model_dir" in fields`, `skip=("deployment",)`, `getattr(a, "unit")`);
- an attribute read off the argparse namespace (a parameter annotated `argparse.Namespace`) other than the CLI's
  own flags (`a.json`, `a.strict`, `a.deployment`, `a.textfile_dir`) and what the parser sets (`verb`, `fn`):
  `a.model_dir` or `a.out` would read a model's field past its validation;
- a field read off a stage's options (a name annotated `Options`): cli.py hands them to the stage whole.
"""
import ast
import textwrap

import pytest
from conftest import REPO

from runbook import fleet
from runbook.core import registry
from runbook.runner.run import PushOptions, RunOptions

CLI = REPO / "lib" / "runbook" / "cli.py"
# The flags cli.py adds itself, for every verb (the models mark theirs `shared`), and what the parser sets.
CLI_OWN = {"json", "strict", "deployment", "textfile_dir", "verb", "fn"}


def _fields() -> set[str]:
    names = {n for s in registry.stages() for n in s.options.model_fields}
    for model in (RunOptions, PushOptions, fleet.FleetOptions):
        names |= set(model.model_fields)
    return names


def _annotated(tree: ast.AST, kind: str) -> set[str]:
    """The parameter names annotated `kind` (`argparse.Namespace`, `Options`) anywhere in the module."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.annotation is not None and ast.unparse(a.annotation) == kind:
                    out.add(a.arg)
    return out


def violations(source: str, fields: set[str]) -> list[str]:
    tree = ast.parse(source)
    namespaces, options = _annotated(tree, "argparse.Namespace"), _annotated(tree, "Options")
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in fields:
            bad.append(f"line {node.lineno}: the string {node.value!r} names a field")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if owner in namespaces and attr not in CLI_OWN:
                bad.append(f"line {node.lineno}: {owner}.{attr} reads the namespace past the model")
            elif owner in options and attr in fields:
                bad.append(f"line {node.lineno}: {owner}.{attr} reads a stage's setting by name")
    return bad


def test_cli_names_no_field_of_any_options_model():
    fields = _fields()
    assert {"model_dir", "action", "probe", "out", "source", "runs"} <= fields   # the names this used to take
    assert violations(CLI.read_text(), fields) == []


@pytest.mark.parametrize("planted, found", [
    ('def _load(a: argparse.Namespace) -> Any:\n    return a.model_dir\n', "a.model_dir reads the namespace"),
    ('def _cmd_push(a: argparse.Namespace) -> int:\n    return push(Path(a.out))\n', "a.out reads the namespace"),
    ('def _cmd_stage(a: argparse.Namespace, o: Options) -> int:\n    return o.action\n', "o.action reads a stage's setting"),
    ('def _load(o: Any) -> bool:\n    return "model_dir" in type(o).model_fields\n', "'model_dir' names a field"),
    ('_SHARED = ("deployment", "textfile_dir")\n', "'deployment' names a field"),
])
def test_the_check_finds_a_field_named_in_cli(planted, found):
    fields = _fields()
    assert any(found in v for v in violations(textwrap.dedent(planted), fields)), violations(planted, fields)


def test_the_check_leaves_the_cli_s_own_words_alone():
    ok = ('def _cmd(a: argparse.Namespace) -> int:\n'
          '    out = [r.url for r in a.fn(a)]\n'          # a local `out`, an upload result's `url`: not settings
          '    p.add_argument("--out", help="archive root")\n'
          '    return print(out) if a.json else a.strict\n')
    assert violations(ok, _fields()) == []
