"""The docs stay true to the code: README.md stays short, every flag the docs name exists, every CLI verb
and option is documented, the spec reference is the model's own, and `mkdocs build --strict` passes
(and is shown able to fail).

The flag rule: a `--long-flag` in README.md or docs/*.md must be an option of `python -m runbook`'s parser.
Where the text says which verb — a `## verb` section of docs/cli.md, or the rest of a line after
`python -m runbook VERB` — it must be that verb's option; elsewhere, any verb's. The only exceptions are
other programs' flags the docs quote (SGLang's server, curl, systemd, Ansible, …), listed in EXTERNAL
with their owner; those whose owner is in this repository or in the serving environment are looked up there.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from runbook.cli import build_parser
from runbook.core import specdoc

DOCS = REPO / "docs"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

# Every `--flag` token of the README before it was split into docs/ (issue 28): what the move had to keep.
ORIGINAL_README_FLAGS = ["--archive", "--archive-url", "--arg", "--attention-backend", "--attn-dp", "--chat", "--compare-url",
                         "--compute-capability", "--concurrency", "--context-len", "--context-length", "--contexts", "--crash-dump-folder",
                         "--deployment", "--depths", "--dump-requests-folder", "--duration", "--expires", "--find-max", "--flush-cache",
                         "--from", "--gpu-mem-gib", "--input-len", "--installed", "--jinja", "--json", "--keep", "--kv-budget-gib",
                         "--kv-cache-dtype", "--kv-dtype", "--lag", "--lengths", "--limit", "--link-base", "--links", "--log",
                         "--mamba-ssm-dtype", "--max-running-requests", "--mem-fraction-static", "--model", "--model-path", "--no-pager",
                         "--now", "--only", "--out", "--output-len", "--page-size", "--param", "--pp", "--publish", "--quantization",
                         "--rate", "--ready-timeout", "--ready-url", "--requests", "--retry", "--retry-all-errors", "--root", "--run",
                         "--run-timeout", "--send-overhead", "--since", "--spec-off-url", "--speculative-algorithm",
                         "--speculative-draft-model-path", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                         "--speculative-num-steps", "--strict", "--systemctl", "--tags", "--test", "--think-dist", "--think-time",
                         "--timeout", "--tokenizer", "--tool-call-parser", "--tool-choice", "--tool-result-len", "--tp", "--trace-speed",
                         "--transport", "--trend", "--turns", "--unit", "--url", "--warmup", "--weights-gib", "--workers", "--workload",
                         "--yes"]

SGLANG = "SGLang's server (sglang.launch_server)"
SGLANG_LOGGING = "SGLang's configure_logging client (python -m sglang.srt.managers.configure_logging)"
CLIENT_CEILING = "benchmarks/client_ceiling.py"
SGLANG_BENCH = "SGLang's benchmark client (python -m sglang.benchmark.serving)"
GATEWAY = "SGLang's gateway (smg launch: smg.launch_router.parse_router_args)"
# Other programs' flags the docs quote, with their owner.
EXTERNAL = {
    "--kv-cache-dtype": SGLANG, "--quantization": SGLANG, "--tool-call-parser": SGLANG, "--model-path": SGLANG,
    "--context-length": SGLANG, "--speculative-draft-model-path": SGLANG, "--dump-requests-folder": SGLANG_LOGGING,
    "--crash-dump-folder": SGLANG, "--dp-size": SGLANG, "--enable-dp-attention": SGLANG,
    "--quantization-param-path": SGLANG, "--device": SGLANG, "--sampling-backend": SGLANG, "--grammar-backend": SGLANG, "--dtype": SGLANG,
    "--model-impl": SGLANG, "--sleep-on-idle": SGLANG, "--no-deps": "pip", "--target": "pip",
    "--without-pip": "python -m venv",
    "--enable-metrics": SGLANG, "--enable-cache-report": SGLANG, "--schedule-conservativeness": SGLANG,
    "--disable-radix-cache": SGLANG, "--radix-eviction-policy": SGLANG, "--max-total-tokens": SGLANG,
    "--radix-eviction-policy-config": SGLANG,
    "--random-range-ratio": SGLANG_BENCH,
    "--lag": CLIENT_CEILING, "--send-overhead": CLIENT_CEILING, "--engine": "benchmarks/tune_overhead.py",
    "--windows": "benchmarks/kld_fp8_kv.py", "--tokens": "benchmarks/kld_fp8_kv.py", "--chunk": "benchmarks/kld_fp8_kv.py",
    "--pool": "benchmarks/warm_sessions.py", "--long": "benchmarks/kld_fp8_kv.py",
    "--jinja": "llama.cpp's llama-server", "--kl-divergence": "llama.cpp's llama-perplexity",
    "--metrics": "llama.cpp's llama-server", "--spec-type": "llama.cpp's llama-server", "--model-draft": "llama.cpp's llama-server",
    "--spec-ngram-simple-size-n": "llama.cpp's llama-server", "--spec-ngram-simple-size-m": "llama.cpp's llama-server",
    "--modes": "benchmarks/speculation_real_vs_random.py", "--threads": "benchmarks/speculation_real_vs_random.py",
    "--retry": "curl", "--retry-all-errors": "curl", "--require-hashes": "pip", "--no-repack": "llama.cpp's llama-server",
    "--no-pager": "journalctl", "--now": "systemctl", "--test": "systemd", "--user": "systemd-run",
    "--limit": "ansible-playbook", "--tags": "ansible-playbook",
    "--collector": "prometheus-node-exporter (--collector.textfile.directory)",
    "--node-rank": SGLANG, "--dist-init-addr": SGLANG, "--nnodes": SGLANG,
    "--worker-urls": GATEWAY, "--service-discovery": GATEWAY, "--selector": GATEWAY, "--service-discovery-port": GATEWAY,
    "--service-discovery-namespace": GATEWAY, "--from-env-file": "kubectl", "--dry-run": "kubectl",
    "--policy": GATEWAY, "--prometheus-host": GATEWAY,
}


def _pages() -> dict[str, str]:
    pages = {"README.md": (REPO / "README.md").read_text()}
    pages.update({f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))})
    return pages


def _verbs() -> dict[str, set[str]]:
    """verb -> its long options, from the parser itself."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {verb: {o for a in p._actions for o in a.option_strings if o.startswith("--")}
            for verb, p in sub.choices.items()}


def _cli_sections() -> dict[str, str]:
    return dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", (DOCS / "cli.md").read_text(), re.S | re.M))


def _misplaced_flags(pages: dict[str, str], verbs: dict[str, set[str]]) -> list[str]:
    every = set().union(*verbs.values())
    bad = []
    for name, text in pages.items():
        bad += [f"{name}: {f} is no option of python -m runbook" for f in FLAG.findall(text)
                if f not in every and f not in EXTERNAL]
        for verb, rest in re.findall(r"python -m runbook (\w+)([^`\n]*)", text):
            if verb in verbs:
                bad += [f"{name}: {f} is no option of `runbook {verb}`" for f in FLAG.findall(rest)
                        if f not in verbs[verb] and f not in EXTERNAL]
    for verb, text in _cli_sections().items():
        bad += [f"docs/cli.md ## {verb}: {f} is no option of `runbook {verb}`" for f in FLAG.findall(text)
                if f not in verbs.get(verb, set()) and f not in EXTERNAL]
    return bad


def test_readme_is_short():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move detail into docs/"


def test_every_flag_of_the_original_readme_is_still_documented():
    text = "\n".join(_pages().values())
    missing = [f for f in ORIGINAL_README_FLAGS if not re.search(re.escape(f) + r"(?![\w-])", text)]
    assert not missing, f"dropped from README.md + docs/: {missing}"


def test_every_flag_in_the_docs_exists_for_its_verb():
    assert not _misplaced_flags(_pages(), _verbs())


def test_flag_check_can_fail():
    verbs = _verbs()
    bad = _misplaced_flags({"x.md": "`python -m runbook kv --tp 8 --concurrency 4`\nsee --no-such-flag"}, verbs)
    assert bad == ["x.md: --no-such-flag is no option of python -m runbook",
                   "x.md: --concurrency is no option of `runbook kv`"]


def test_external_flags_belong_to_their_owner():
    unused = [f for f in EXTERNAL if f not in "\n".join(_pages().values())]
    assert not unused, f"EXTERNAL lists flags no page mentions any more: {unused}"
    ceiling = (REPO / CLIENT_CEILING).read_text()
    assert all(f'"{f}"' in ceiling for f, owner in EXTERNAL.items() if owner == CLIENT_CEILING)
    runbook_flags = set().union(*_verbs().values())
    assert not runbook_flags & set(EXTERNAL), "a runbook option is listed as another program's"


def test_gateway_flags_exist_in_the_gateway():
    """The gateway's own parser (the pinned smg wheel, run by its interpreter) knows every flag the docs call its own."""
    python = os.environ.get("RUNBOOK_GATEWAY_PYTHON") or str(REPO / ".venv-gateway" / "bin" / "python")
    if not Path(python).is_file():
        pytest.skip(f"no gateway interpreter at {python} (make gateway-env)")
    code = ("import argparse; from smg.router_args import RouterArgs; p = argparse.ArgumentParser(); "
            "RouterArgs.add_cli_args(p, use_router_prefix=False); print(' '.join(p._option_string_actions))")
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    missing = [f for f, owner in EXTERNAL.items() if owner == GATEWAY and f not in out.stdout.split()]
    assert not missing, f"not flags of the installed gateway: {missing}"


@pytest.mark.serving
def test_sglang_flags_exist_in_sglang():
    """SGLang's own server parser (run by the serving interpreter) knows every flag the docs call its own;
    the configure_logging client's flags are in that script's source."""
    python = os.environ.get("RUNBOOK_SERVING_PYTHON") or str(REPO / ".venv-serving" / "bin" / "python")
    if not Path(python).is_file():
        pytest.skip(f"no serving interpreter at {python} (make serving-env)")
    code = ("import argparse, importlib.util, sys; from sglang.srt.server_args import ServerArgs; "
            "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p); print(' '.join(p._option_string_actions)); "
            "print(open(importlib.util.find_spec('sglang.srt.managers.configure_logging').origin).read())")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    server, _, logging_script = out.stdout.partition("\n")
    missing = [f for f, owner in EXTERNAL.items()
               if (owner == SGLANG and f not in server.split()) or (owner == SGLANG_LOGGING and f'"{f}"' not in logging_script)]
    assert not missing, f"not flags of the installed SGLang: {missing}"


def test_every_verb_and_option_has_its_section_in_cli_md():
    sections = _cli_sections()
    for verb, options in _verbs().items():
        assert verb in sections, f"docs/cli.md has no '## {verb}' section"
        actions = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]._actions
        hidden = {o for a in actions if a.help == argparse.SUPPRESS for o in a.option_strings}
        # a boolean's --no-X is documented once for every verb (cli.md's opening), with its --X in the section
        negative = {o for a in actions if isinstance(a, argparse.BooleanOptionalAction) for o in a.option_strings[1:]}
        undocumented = [o for o in sorted(options - hidden - negative - {"--help"})
                        if not re.search(re.escape(o) + r"(?![\w-])", sections[verb])]
        assert not undocumented, f"docs/cli.md ## {verb} does not mention {undocumented}"


def test_spec_reference_is_generated_from_the_model():
    committed = (DOCS / "spec-reference.md").read_text()
    assert committed == specdoc.render(), (
        "docs/spec-reference.md is out of date with runbook.core.spec.Deployment: regenerate it with\n"
        "    python -m runbook.core.specdoc > docs/spec-reference.md")


def test_spec_reference_covers_every_field_with_its_bounds():
    page = specdoc.render()
    for path in ("`serving.port`", "`parallelism.nodes[].name`", "`benchmark.flush_cache`", "`archive.url`"):
        assert path in page
    assert "| `serving.port` | int | `30000` | > 0, < 65,536 |" in page
    assert "| `hardware.gpu_count` | int | required | > 0, ≤ 1,024 | GPUs per node |" in page
    # a field without a Field description takes the comment above it in the model's source
    assert "on a production server it drops every user's cached prefixes" in page


def _mkdocs(tmp_path: Path, docs: Path) -> subprocess.CompletedProcess:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config.update(docs_dir=str(docs), site_dir=str(tmp_path / "site"))
    cfg = tmp_path / "mkdocs.yml"
    cfg.write_text(yaml.safe_dump(config, allow_unicode=True))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(cfg)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_mkdocs_strict_build_passes(tmp_path):
    out = _mkdocs(tmp_path, DOCS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "spec-reference" / "index.html").is_file()


@pytest.mark.parametrize("fault", ["broken link", "broken anchor", "page not in the nav"])
def test_mkdocs_strict_build_fails_on_a_broken_docs_tree(tmp_path, fault):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    if fault == "broken link":
        (docs / "cli.md").write_text((docs / "cli.md").read_text() + "\n[gone](no-such-page.md)\n")
    elif fault == "broken anchor":
        (docs / "cli.md").write_text((docs / "cli.md").read_text() + "\n[gone](kv.md#no-such-heading)\n")
    else:
        (docs / "orphan.md").write_text("# Orphan\n")
    out = _mkdocs(tmp_path, docs)
    assert out.returncode != 0, f"{fault}: mkdocs build --strict passed"
