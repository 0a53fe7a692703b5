"""SGLang's benchmark client as the side-by-side drives it: the pooled arithmetic, and one-line errors for an
interpreter that is missing, exits or hangs (bounded waits; the child is waited for). The live comparison is in
test_sglang_bench.py."""
import stat

import psutil
import pytest

from runbook.bench import reference


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_pooled_rates_and_ratio():
    r = reference.SideBySide(4, ours=[{"output_tokens": 100, "window_s": 2.0, "output_tok_s": 50.0, "ttft_ms": {"p50": 1},
                                       "tpot_ms": {"p50": 1}},
                                      {"output_tokens": 100, "window_s": 6.0, "output_tok_s": 16.7, "ttft_ms": {"p50": 1},
                                       "tpot_ms": {"p50": 1}}],
                             theirs=[{"total_output_tokens": 100, "duration": 4.0, "output_throughput": 25.0, "median_ttft_ms": 1,
                                      "median_tpot_ms": 1}], order="OSO")
    assert r.ours_tok_s() == 25.0 and r.theirs_tok_s() == 25.0 and r.ratio() == 1.0     # tokens over summed windows
    assert r.row()["ours_output_tokens"] == [100, 100]


def test_missing_interpreter_is_one_line(tmp_path):
    with pytest.raises(reference.ReferenceError_) as e:
        reference.SGLangClient(tmp_path / "nope" / "python")
    assert "\n" not in str(e.value) and "does not run" in str(e.value)


def test_interpreter_that_exits_says_so_with_its_last_lines(tmp_path):
    py = _script(tmp_path / "python", "echo \"ModuleNotFoundError: No module named 'sglang'\" >&2; exit 3")
    with pytest.raises(reference.ReferenceError_) as e:
        reference.SGLangClient(py)
    msg = str(e.value)
    assert "\n" not in msg and "exited with 3 during import sglang.benchmark.serving" in msg and "No module named 'sglang'" in msg


def test_a_hung_import_is_bounded_and_leaves_no_process(tmp_path):
    py = _script(tmp_path / "python", f"echo $$ > {tmp_path}/pid; exec sleep 60")
    with pytest.raises(reference.ReferenceError_, match="took over 1 s"):
        reference.SGLangClient(py, start_timeout_s=1)
    pid = int((tmp_path / "pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
