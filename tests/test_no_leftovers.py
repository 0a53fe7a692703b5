"""No editor, merge or patch leftovers are committed (lib/runbook/service/drift.py.orig once was)."""
import re
import shutil
import subprocess

import pytest
from conftest import REPO

LEFTOVER = re.compile(r"(\.orig|\.rej|\.bak|\.swp|\.swo|~|\.pyc)$|(^|/)(__pycache__|\.ipynb_checkpoints)/|(^|/)\.DS_Store$")


def test_the_pattern_catches_leftovers():
    assert [p for p in ("a/drift.py.orig", "x.rej", "n.ipynb~", "lib/__pycache__/m.pyc", "a/.DS_Store", "drift.py", "origin.py")
            if LEFTOVER.search(p)] == ["a/drift.py.orig", "x.rej", "n.ipynb~", "lib/__pycache__/m.pyc", "a/.DS_Store"]


def test_no_leftover_files_are_tracked():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    assert not [f for f in files if f and LEFTOVER.search(f)]
