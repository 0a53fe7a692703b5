"""`make demo`'s own inputs: what it hands `runbook run` must be what every notebook of the run accepts (a
--param reaches every notebook declaring that name, with that notebook's type)."""
from pathlib import Path

from conftest import REPO

from runbook.core import registry
from runbook.demo.runbook import run_params
from runbook.runner import params


def test_the_demo_run_params_fit_every_notebook_of_the_run():
    notebooks = [REPO / "notebooks" / f"{s.notebook}.ipynb" for s in registry.stages() if s.in_default_run]
    pairs = run_params("http://127.0.0.1:30000", Path("/tmp/demo-sglang-server.log"), "/models/tiny",
                       "http://127.0.0.1:30001")[1::2]
    typed = params.resolve(pairs, notebooks)    # raises on a value a declaring notebook's type refuses
    by_name = {nb.stem: v for nb, v in typed.items()}
    assert by_name["50_accuracy"]["lengths"] == [512, 1024]
    assert by_name["40_benchmark"]["url"] == by_name["50_accuracy"]["compare_url"] == "http://127.0.0.1:30000"
    assert "concurrency" not in by_name["40_benchmark"]   # the spec's levels, not a --param accuracy reads too
    assert by_name["50_accuracy"]["url"] == "http://127.0.0.1:30001"     # 50 judges the FP8-KV candidate against it
    assert "compare_url" not in by_name["40_benchmark"]


def test_a_plain_concurrency_param_reaches_the_benchmark_only():
    """The cron line `runbook run --param concurrency=1,2` sets the benchmark's levels; accuracy's batch is its own
    name (batch_size), so no notebook of the run refuses the value."""
    notebooks = [REPO / "notebooks" / f"{s.notebook}.ipynb" for s in registry.stages() if s.in_default_run]
    typed = {nb.stem: v for nb, v in params.resolve(["concurrency=1,2"], notebooks).items()}
    assert typed["40_benchmark"]["concurrency"] == [1, 2]
    assert all("concurrency" not in v for name, v in typed.items() if name != "40_benchmark")
