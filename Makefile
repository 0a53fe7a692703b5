# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime-installed
DEV := $(VENV)/.dev-installed
RUN_ARGS ?=
PYTEST_ARGS ?=
LAB_PORT ?= 8888

.PHONY: run test lab venv clean-venv

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

# Runs every notebook on the default deployment and archives it under outputs/.
# Exit 1 (a check failed) is a result, shown in the summary: only 2 (a notebook could not run)
# or 75 (another run holds the lock) fail `make run`. The CLI itself keeps all codes for cron.
run: $(RUNTIME)
	@$(PY) -m runbook run $(RUN_ARGS); rc=$$?; if [ $$rc -le 1 ]; then exit 0; else exit $$rc; fi

test: $(DEV)
	$(PY) -m pytest $(PYTEST_ARGS)

# JupyterLab on notebooks/ with the project's kernel ("Python 3 (runbook)") registered.
lab: $(RUNTIME)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --no-browser --ip=127.0.0.1 --port=$(LAB_PORT)

clean-venv:
	rm -rf $(VENV)
