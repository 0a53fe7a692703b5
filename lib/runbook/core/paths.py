"""Where the runbook's files are: the checkout's folders when running from one, else the wheel's copies.

In a checkout (lib/runbook under a folder holding pyproject.toml and notebooks/: an editable install
or PYTHONPATH=lib) everything is the checkout's own notebooks/, deployments/, outputs/ and .cache/.
An installed wheel carries notebooks/, deployments/ and models/ as package data (runbook/_data/) and
writes only where it is told:
- outputs: $RUNBOOK_OUTPUTS, else ./outputs under the current directory;
- cache (the demo's llama-server build and tiny model): $RUNBOOK_CACHE, else $XDG_CACHE_HOME/runbook,
  else ~/.cache/runbook. $RUNBOOK_CACHE wins in a checkout too.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

DEFAULT_DEPLOYMENT = "qwen3.5-397b-a17b-nvfp4.yaml"


def repo_root() -> Path | None:
    """The checkout this package runs from, or None for an installed wheel."""
    here = Path(__file__).resolve()                     # <root>/lib/runbook/core/paths.py
    root = here.parents[3]
    if here.parents[2].name == "lib" and (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir():
        return root
    return None


def _packaged(name: str) -> Path:
    # A wheel is always unpacked on disk, so the Traversable is a real path (papermill needs one).
    return Path(str(resources.files("runbook").joinpath("_data").joinpath(name)))


def notebooks_dir() -> Path:
    root = repo_root()
    return root / "notebooks" if root else _packaged("notebooks")


def default_deployment() -> Path:
    root = repo_root()
    return (root / "deployments" if root else _packaged("deployments")) / DEFAULT_DEPLOYMENT


def outputs_dir() -> Path:
    root = repo_root()
    if root:
        return root / "outputs"
    return Path(os.environ.get("RUNBOOK_OUTPUTS") or Path.cwd() / "outputs")


def cache_dir() -> Path:
    if os.environ.get("RUNBOOK_CACHE"):
        return Path(os.environ["RUNBOOK_CACHE"])
    root = repo_root()
    if root:
        return root / ".cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runbook"
