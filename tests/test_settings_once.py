"""Each setting is declared once: in its stage's options model (or the settings model it is a view of). A dataclass,
NamedTuple or function signature in lib/runbook that repeats a stage's option fields — at least MIN_SHARED of them,
or at least half of its own names with MIN_HALF or more shared — is a second declaration of those settings: it
should take the settings object instead. Read from the source with `ast`, for every registered stage.

KNOWN_REPEATS names the ones still being reworked elsewhere; the list is exact, so it only shrinks. MIRRORS_SGLANG
(SGLang's own API, mirrored) and COINCIDENT (names shared by chance) are exact too, each entry with its reason."""
from __future__ import annotations

import ast

from test_imports import LIB, sources

from runbook.core import registry

MIN_SHARED = 5
MIN_HALF = 3

# "file:qualified name" -> the stage whose options it repeats; none today.
KNOWN_REPEATS: dict[str, str] = {}

# Not a second declaration of our settings: SGLang's own API, mirrored name for name so that a differential test
# can hold ours against it. "file:qualified name" -> what of SGLang's it mirrors.
MIRRORS_SGLANG: dict[str, str] = {
    "kv/defaults.py:mem_fraction_static": "SGLang's memory_hook.py handle_gpu_memory_settings (+ reserve_for_graph_mb)",
    "kv/memory.py:Result": "the values SGLang resolves and logs (page_size, context_len, mem_fraction_static, "
                           "max_running_requests, attention_backend after its defaults), computed, not given; "
                           "test_kv_vs_sglang holds them against SGLang's",
    "bench/reference.py:SGLangClient.submit": "sglang.benchmark.serving's arguments (random-ids dataset)",
    "bench/reference.py:SGLangClient.run": "sglang.benchmark.serving's arguments (random-ids dataset)",
    "bench/reference.py:side_by_side": "sglang.benchmark.serving's arguments, run beside our client",
}

# Names that coincide with another stage's options, taking no setting of that stage: the values come from the
# caller's own settings or the spec, with no default or bound declared here.
COINCIDENT: dict[str, str] = {
    "quant/analysis.py:inspect_checkpoint": "quant's inspection of the spec's tp, pp and GPU (kv_memory's flags share the names)",
    "tune/production.py:paused": "tune's pause of the production unit: tune's --yes, the spec's ready URL (service's "
                                 "flags share the names)",
}


def signatures(text: str) -> dict[str, set[str]]:
    """Qualified name -> the names a dataclass / NamedTuple declares, or a function takes (self and cls left out)."""
    out: dict[str, set[str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                decorated = any("dataclass" in ast.unparse(d) for d in child.decorator_list)
                tupled = any("NamedTuple" in ast.unparse(b) for b in child.bases)
                if decorated or tupled:
                    out[name] = {s.target.id for s in child.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                visit(child, name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)} - {"self", "cls"}
                out[prefix + child.name] = names
                visit(child, prefix + child.name + ".")

    visit(ast.parse(text), "")
    return out


def repeats(srcs: dict, option_sets: dict[str, set[str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for _, (path, text) in srcs.items():
        rel = path.relative_to(LIB).as_posix()
        for name, names in signatures(text).items():
            for stage, fields in option_sets.items():
                shared = names & fields
                if len(shared) >= MIN_SHARED or (len(shared) >= MIN_HALF and 2 * len(shared) >= len(names)):
                    found[f"{rel}:{name}"] = stage
    return found


def _option_sets() -> dict[str, set[str]]:
    return {s.name: set(s.options.model_fields) for s in registry.stages()}


def test_no_signature_repeats_a_stages_options():
    found = repeats(sources(), _option_sets())
    assert {k: v for k, v in found.items() if k not in MIRRORS_SGLANG and k not in COINCIDENT} == KNOWN_REPEATS, (
        "signatures repeating a stage's option fields differ from KNOWN_REPEATS: take the stage's settings object "
        f"instead of its fields one by one, then update the list.\nfound: {found}")


def test_the_exceptions_are_exact():
    """Each exception still matches: one that no longer repeats a field leaves its list."""
    found = repeats(sources(), _option_sets())
    assert set(MIRRORS_SGLANG) | set(COINCIDENT) <= set(found), (set(MIRRORS_SGLANG) | set(COINCIDENT)) - set(found)


def test_a_repeat_is_caught(tmp_path):
    """bench's old BenchOptions dataclass and options_from-style function, as they were."""
    text = ("from dataclasses import dataclass\n\n@dataclass\nclass BenchOptions:\n    url: str\n    workload: str = 'code'\n"
            "    input_len: int = 1024\n    output_len: int = 256\n    warmup: int = 2\n    seed: int = 0\n\n"
            "def run_level(client, url, model, chat):\n    pass\n\ndef fine(client, reqs, level, warmup):\n    pass\n")
    (tmp_path / "runbook").mkdir()
    (tmp_path / "runbook" / "m.py").write_text(text)
    srcs = {"runbook.m": (tmp_path / "runbook" / "m.py", text)}
    import test_settings_once as me

    old = me.LIB
    me.LIB = tmp_path / "runbook"
    try:
        found = repeats(srcs, {"benchmark": {"url", "model", "chat", "workload", "input_len", "output_len", "warmup", "seed"}})
    finally:
        me.LIB = old
    assert found == {"m.py:BenchOptions": "benchmark", "m.py:run_level": "benchmark"}
