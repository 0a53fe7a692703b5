"""The marker rule, checked from the source: a test whose code shows a reason to leave `make test-fast`
(running the serving interpreter, `runbook run`, llama-server, chromium, an S3 server or pip) carries that reason's marker,
so a new slow test cannot land in the fast set unmarked. Helpers, module constants and module fixtures
count: a test that calls a helper that runs the serving interpreter needs `serving` too."""
import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, SLOW_FIXTURES, SLOW_REASONS, pytest_collection_modifyitems

# What in a test's source shows each reason (conftest.SLOW_FIXTURES covers the fixtures).
SIGNS = {
    "serving": re.compile(r'"RUNBOOK_SERVING_PYTHON"|"\.venv-serving"'),      # the variable or the path, not prose
    "notebook": re.compile(r'"runbook", "run"|\bcli\("run"|papermill\.execute'),
    "llama": re.compile(r"start_llama_server|llama_server_path"),
    "sglang": re.compile(r"\bsglang\.(start|launch|tiny_model|check_engine)\("),
    "browser": re.compile(r"\bchromium\b", re.I),
    "server": re.compile(r'S3Server\(|"-m", "pip"|"-m", "venv"|venv\.create\('),
}
MARK = re.compile(r"pytest\.mark\.(\w+)")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _source(text: str, node: ast.AST) -> str:
    decorators = [ast.get_source_segment(text, d) or "" for d in getattr(node, "decorator_list", [])]
    return "\n".join(decorators + [ast.get_source_segment(text, node) or ""])


def unmarked(text: str) -> set[tuple[str, str]]:
    """(test, reason) for each test in a module's source that shows a reason it does not carry."""
    tree = ast.parse(text)
    shown: dict[str, set[str]] = {}      # module-level name -> reasons its definition shows
    marks: dict[str, set[str]] = {}      # module-level name -> reason markers it stands for
    uses: dict[str, set[str]] = {}       # module-level name -> names its definition refers to
    params: dict[str, set[str]] = {}     # function -> its argument names (fixtures)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            targets, body = [node.name], node
            params[node.name] = {a.arg for a in node.args.args}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
            body = node
        else:
            continue
        src = _source(text, body)
        for name in targets:
            shown[name] = {r for r, rx in SIGNS.items() if rx.search(src)}
            marks[name] = set(MARK.findall(src)) & set(SLOW_REASONS)
            uses[name] = (_names(body) | params.get(name, set())) - {name}
    changed = True
    while changed:       # a name shows what the module-level names it uses show
        changed = False
        for name, refs in uses.items():
            more = set().union(*(shown[r] for r in refs if r in shown)) - shown[name]
            if more:
                shown[name] |= more
                changed = True
    module_marks = marks.get("pytestmark", set())
    out = set()
    for name, args in params.items():
        if not name.startswith("test_"):
            continue
        node = next(n for n in tree.body if getattr(n, "name", None) == name)
        decorators = set().union(*(_names(d) for d in node.decorator_list))
        carried = module_marks | set().union(*(marks.get(d, set()) for d in decorators))
        carried |= set(MARK.findall("\n".join(ast.get_source_segment(text, d) or "" for d in node.decorator_list)))
        carried |= {SLOW_FIXTURES[a] for a in args if a in SLOW_FIXTURES}
        out |= {(name, r) for r in shown[name] - carried}
    return out


def _modules() -> list[Path]:
    return sorted(p for p in (REPO / "tests").rglob("test_*.py") if p.name != Path(__file__).name)   # not SIGNS itself


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO / "tests")))
def test_every_test_carries_the_reasons_its_source_shows(path):
    assert not unmarked(path.read_text()), f"{path.name}: mark these (pyproject's markers) or `make test-fast` runs them"


PLANTED = {
    "helper runs the serving interpreter": (
        'SERVING_PY = os.environ["RUNBOOK_SERVING_PYTHON"]\n'
        "def oracle(x):\n    return subprocess.run([SERVING_PY, x])\n"
        "def test_a():\n    oracle('x')\n", {("test_a", "serving")}),
    "the same, marked": (
        'SERVING_PY = os.environ["RUNBOOK_SERVING_PYTHON"]\n'
        "@pytest.mark.serving\ndef test_a():\n    subprocess.run([SERVING_PY])\n", set()),
    "the same, module marked": (
        'pytestmark = [pytest.mark.serving]\nSERVING_PY = os.environ["RUNBOOK_SERVING_PYTHON"]\n'
        "def test_a():\n    subprocess.run([SERVING_PY])\n", set()),
    "skipif alias names the interpreter": (
        'needs = pytest.mark.skipif(not os.environ.get("RUNBOOK_SERVING_PYTHON"), reason="x")\n'
        "@needs\ndef test_a():\n    pass\n", {("test_a", "serving")}),
    "marker alias": (
        "serving = pytest.mark.serving\nSERVING_PY = REPO / \".venv-serving\" / \"bin\" / \"python\"\n"
        "@serving\ndef test_a():\n    subprocess.run([SERVING_PY])\n", set()),
    "runner through cli": ('def test_b(cli, tmp_path):\n    cli("run", "--out", tmp_path)\n', {("test_b", "notebook")}),
    "module fixture starts llama-server": (
        "@pytest.fixture\ndef srv():\n    return demo.start_llama_server(demo.llama_server_path())\n"
        "def test_c(srv):\n    pass\n", {("test_c", "llama")}),
    "module fixture builds a wheel": (
        '@pytest.fixture(scope="module")\ndef whl(tmp_path_factory):\n    subprocess.run([sys.executable, "-m", "pip", "wheel", REPO])\n'
        "def test_g(whl):\n    pass\n", {("test_g", "server")}),
    "shared fixture is marked by conftest": ("def test_d(llama, s3, sglang_server):\n    llama.url\n", set()),
    "starts SGLang itself": ("def test_h(tmp_path):\n    sglang.start(port=1)\n", {("test_h", "sglang")}),
    "prose naming the interpreter is no sign": (
        '@pytest.mark.skipif(SRT is None, reason="no .venv-serving")\ndef test_f():\n    assert SRT.is_dir()\n', set()),
    "pure unit test": ("def test_e():\n    assert 1 + 1 == 2\n", set()),
}


@pytest.mark.parametrize("src,expected", PLANTED.values(), ids=PLANTED.keys())
def test_rule_catches_planted_modules(src, expected):
    assert unmarked(src) == expected


def _item(fixtures=(), marks=(), params=None):
    added = []
    return SimpleNamespace(fixturenames=list(fixtures), iter_markers=lambda: [SimpleNamespace(name=m) for m in marks],
                           add_marker=added.append, added=added,
                           callspec=SimpleNamespace(params=params) if params is not None else None)


@pytest.mark.parametrize("item,expected", [
    (_item(["tmp_path", "llama"]), ["llama", "slow"]),
    (_item(marks=["serving", "parametrize"]), ["serving", "slow"]),
    (_item(["lab"]), ["browser", "slow"]),
    (_item(params={"transport": "aiohttp"}), ["slow"]),
    (_item(params={"transport": "h1"}), []),
    (_item(["tmp_path"], marks=["parametrize"], params={"n": 2}), []),
])
def test_conftest_marks_items_by_reason(item, expected):
    pytest_collection_modifyitems(SimpleNamespace(), [item])   # a config of no xdist worker
    assert item.added == expected
