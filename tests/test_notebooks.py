"""Committed notebooks: no outputs, a runner-compatible parameters cell, the project's kernel."""
import json

import pytest
from conftest import REPO

from runbook.runner import params

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["00_environment.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert not c.get("outputs") and c.get("execution_count") is None, path.name
    assert "papermill" not in nb["metadata"]
    assert nb["metadata"]["kernelspec"]["name"] == "runbook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_cell_declares_runner_parameters(path):
    declared = params.inspect(path)
    assert declared["deployment"]["inferred_type_name"] == "str"
    assert declared["results_path"]["inferred_type_name"] == "str"
    assert declared["results_path"]["default"] in ('""', "''")
    nb = json.loads(path.read_text())
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "parameters" in first_code["metadata"].get("tags", [])
    assert nb["cells"][0]["cell_type"] == "markdown" and "".join(nb["cells"][0]["source"]).startswith("# ")
