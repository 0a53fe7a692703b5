"""What a person reads: per-level findings folded into one row per kind, tables with "—" and figures to
their precision. Rendering only: the JSON keeps every finding."""
import json
import re

import numpy as np
import pandas as pd

from runbook.bench import report
from runbook.core import tables
from runbook.core.findings import Finding, format_text, grouped, styled, to_json
from runbook.runner import archive, notebook, summary

TOKEN_COUNT = [Finding(f"bench.token_count.c{c}", "warn", f"c{c}: server and client token counts differ by {g}%",
                       detail=f"server usage {c * 100}, client {c * 103}", remedy="Give --tokenizer the model's tokenizer.")
               for c, g in ((1, "1.2"), (2, "3.4"), (4, "2.0"), (8, "2.5"))]
SOURCE = [Finding("bench.token_source.c1", "info", "c1: per-token ITL and TPOT rest on an approximate token count (usage_spread)",
                  detail="usage_spread: the server's count arrived late"),
          Finding("bench.token_source.r0.5", "warn", "r0.5: per-token ITL and TPOT rest on an approximate token count (usage_spread)",
                  detail="usage_spread: the server's count arrived late")]


def test_per_level_findings_become_one_row_per_kind_with_levels_ranges_and_worst_status():
    text = format_text(TOKEN_COUNT + SOURCE + [Finding("bench.peak", "info", "peak output 12.3 tok/s at c8")])
    lines = text.splitlines()
    assert lines[0] == ("[WARN] bench.token_count (c1, c2, c4, c8): server and client token counts differ by 1.2–3.4% — "
                        "c1: server usage 100, client 103; c2: server usage 200, client 206; c4: server usage 400, client 412; "
                        "c8: server usage 800, client 824")
    assert lines[1] == "         fix: Give --tokenizer the model's tokenizer."   # one remedy, not four
    # a dotted rate label is one item; the worst status of the kind is shown; the shared detail once
    assert lines[2] == ("[WARN] bench.token_source (c1, r0.5): per-token ITL and TPOT rest on an approximate token count "
                        "(usage_spread) — usage_spread: the server's count arrived late")
    assert sum("bench.token_count" in x for x in lines) == 1 and lines[-1] == "5 warn, 2 info"   # counts stay per finding


def test_findings_that_say_different_things_stay_apart_and_a_single_one_renders_as_before():
    differ = [Finding("bench.client_bound.c2", "fail", "c2: 3 load-generator workers did not report: a worker process died"),
              Finding("bench.client_bound.c4", "warn", "c4: the client, not the server, limited this level")]
    assert grouped(differ) == differ
    one = [TOKEN_COUNT[1], Finding("env.serving.sglang", "pass", "sglang 0.5.2")]
    assert grouped(one) == one
    assert format_text(one).splitlines()[0] == ("[WARN] bench.token_count.c2: c2: server and client token counts differ "
                                                "by 3.4% — server usage 200, client 206")
    # ids whose suffix is not the title's item (packages, flags) are not folded
    pkgs = [Finding("env.serving.sglang", "pass", "sglang 0.5.2"), Finding("env.serving.torch", "pass", "torch 2.8")]
    assert grouped(pkgs) == pkgs


def test_json_keeps_every_finding_and_the_notebook_shows_the_same_rows_as_the_cli():
    fs = TOKEN_COUNT + SOURCE
    assert [d["id"] for d in json.loads(to_json(fs))] == [f.id for f in fs]
    html = styled(fs).to_html()
    assert "bench.token_count (c1, c2, c4, c8)" in html and "bench.token_count.c1" not in html
    assert html.count("<tr>") - 1 == len(grouped(fs)) == 2


SUMMARY = {"levels": [
    {"label": "c1", "completed": 1234, "failed": 0, "output_tok_s": 142.068306, "total_tok_s": 1500.55555, "request_s": 0.123456,
     "ttft_ms": {"p50": 12.3456, "p99": None}, "tpot_ms": {"p50": 7.77777, "p99": float("nan")}, "itl_ms": {"p50": 1.0, "p99": 2.0},
     "e2e_ms": {"p99": 1234.5678}, "tokens_per_chunk": 1.0, "cache_hit_rate": None, "client_bound": False,
     "lag_ms": {"p99": None}},
    {"label": "c8", "completed": 64, "failed": 2, "output_tok_s": 900.0, "total_tok_s": 2000.0, "request_s": 4.0,
     "ttft_ms": {"p50": None, "p99": None}, "tpot_ms": {"p50": None, "p99": None}, "itl_ms": {"p50": None, "p99": None},
     "e2e_ms": {"p99": None}, "tokens_per_chunk": None, "cache_hit_rate": 0.5, "client_bound": True, "lag_ms": {"p99": 3.25}}]}
FLOAT = re.compile(r"\d\.(\d+)")


def _rendered(df: pd.DataFrame) -> list[str]:
    return [tables.text(df), tables.style(df).to_html()]


def test_tables_show_missing_as_a_dash_and_figures_to_their_precision():
    throughput, latency = report.frames(SUMMARY)
    assert "TTFT p50 ms" in latency.columns and "TTFT p50 ms" not in throughput.columns   # split: fits a page
    for df in (throughput, latency):
        for out in _rendered(df):
            assert not re.search(r"\b(NaN|nan|None|<NA>)\b", out), out
            assert "—" in out
    t = tables.text(throughput)
    assert "142.1" in t and "142.07" not in t and "1,234" in t and "1,500.6" in t and "0.12" in t and "0.123" not in t
    lat = tables.text(latency)
    assert "12.3" in lat and "1,234.6" in lat and all(len(d) == 1 for d in FLOAT.findall(lat)), lat
    html = tables.style(latency).to_html()
    assert all(len(d) <= 1 for d in FLOAT.findall(re.sub(r"<style.*?</style>", "", html, flags=re.S))), html
    assert "white-space: normal" in html   # headers wrap instead of widening the table


def test_precision_follows_the_column_name():
    assert [tables.decimals(c) for c in ("output tok/s", "TTFT p99 ms", "ratio_mean", "mem fraction", "k_rel_err %",
                                         "sglang:spec_accepted_tokens_total", ("TTFT", "ours_mean_ms"), "KV usage (max)")] \
        == [1, 1, 2, 3, 3, 0, 1, 2]


def test_integer_columns_with_gaps_stay_integers():
    df = pd.DataFrame({"retracted": [3.0, np.nan], "KV usage (max)": [0.91234, None]}, index=["c1", "c8"])
    assert tables.text(df).split() == ["retracted", "KV", "usage", "(max)", "c1", "3", "0.91", "c8", "—", "—"]


def test_notebook_table_prints_the_same_text_outside_jupyter_and_skips_nothing_to_show(capsys):
    throughput, latency = report.frames(SUMMARY)
    gaps = pd.DataFrame({"queue p99 ms": [None, None]}, index=["c1", "c8"])
    notebook.table(None, pd.DataFrame(), throughput, gaps, latency)
    assert capsys.readouterr().out == tables.text(throughput) + "\n" + tables.text(latency) + "\n"
    assert report.frames({"levels": []}) == []


def test_the_runs_summary_and_last_screen_fold_per_level_findings_and_summary_json_keeps_them(tmp_path):
    failed = [f.to_dict() for f in TOKEN_COUNT]
    s = {"run_id": "r1", "deployment": "d", "deployment_file": "d.yaml", "git_commit": None, "started": "t",
         "duration_s": 1.0, "exit_code": 0, "verdict": "ok", "archive": None,
         "notebooks": [{"name": "40_benchmark", "html": "40_benchmark.html", "status": "ok", "duration_s": 1.0, "error": None,
                        "findings": {"fail": 0, "warn": 4, "skip": 0, "pass": 0, "info": 0}, "failed_findings": failed}]}
    md = summary.summary_md(s)
    assert md.count("bench.token_count") == 1 and "`bench.token_count (c1, c2, c4, c8)` (40_benchmark)" in md
    screen = summary.one_screen(s, tmp_path)
    assert "  WARN c1, c2, c4, c8: server and client token counts differ by 1.2–3.4%" in screen.splitlines()
    assert screen.count("fix:") == 1 and s["notebooks"][0]["failed_findings"] == failed
    assert summary.attention(s["notebooks"]) == [("40_benchmark", grouped(TOKEN_COUNT)[0].to_dict())]   # summary.html's rows


# tune's per-candidate findings share one id; each title opens with the candidate
RAN = [Finding("tune.ran", "pass", "reference: ran; recommended"),
       Finding("tune.ran", "pass", "np4: ran; ran, not the best", detail="identical on 4 prompts"),
       Finding("tune.ran", "pass", "batch-128: ran; ran, not the best", detail="identical on 4 prompts"),
       Finding("tune.ran", "fail", "big: ran; failed")]
GUARD = [Finding("tune.guard", "fail", "q8-kv: accuracy guard failed: diverges early (prompt 1: token 8)", remedy="Do not serve it."),
         Finding("tune.guard", "fail", "q4-kv: accuracy guard failed: diverges early (prompt 0: token 1, prompt 2: token 1)",
                 remedy="Do not serve it.")]


def test_findings_of_one_kind_and_status_are_one_row_even_when_their_words_differ():
    shown = grouped(RAN + GUARD + [Finding("tune.energy", "skip", "energy per output token not measured: no GPU")])
    assert [(f.id, f.status) for f in shown] == [("tune.ran (reference, np4, batch-128)", "pass"), ("tune.ran", "fail"),
                                                 ("tune.guard (q8-kv, q4-kv)", "fail"), ("tune.energy", "skip")]
    ran, failed, guard = shown[:3]
    # one line per wording, naming its items; a detail some items lack is not given to them
    assert ran.title == "reference: ran; recommended\nnp4, batch-128: ran; ran, not the best"
    assert ran.detail == "np4, batch-128: identical on 4 prompts"
    assert failed == RAN[3]          # the only one of its status stays as it is
    assert guard.title.splitlines() == ["q8-kv: accuracy guard failed: diverges early (prompt 1: token 8)",
                                        "q4-kv: accuracy guard failed: diverges early (prompt 0: token 1, prompt 2: token 1)"]
    assert guard.remedy == "Do not serve it."
    # the CLI indents a row's further lines under its first
    lines = format_text(GUARD).splitlines()
    assert lines[0].startswith("[FAIL] tune.guard (q8-kv, q4-kv): q8-kv: ") and lines[1].startswith(" " * 9 + "q4-kv: ")


def test_the_runs_summary_and_screen_give_a_row_with_several_wordings_its_lines(tmp_path):
    s = {"run_id": "r1", "deployment": "d", "deployment_file": "d.yaml", "git_commit": None, "started": "t",
         "duration_s": 1.0, "exit_code": 1, "verdict": "checks failed", "archive": None,
         "notebooks": [{"name": "60_tune", "html": "60_tune.html", "status": "ok", "duration_s": 1.0, "error": None,
                        "findings": {"fail": 2, "warn": 0, "skip": 0, "pass": 0, "info": 0},
                        "failed_findings": [f.to_dict() for f in GUARD]}]}
    md = summary.summary_md(s)
    assert "`tune.guard (q8-kv, q4-kv)` (60_tune): q8-kv: accuracy guard failed: diverges early (prompt 1: token 8); q4-kv: " in md
    screen = summary.one_screen(s, tmp_path).splitlines()
    i = screen.index("  FAIL q8-kv: accuracy guard failed: diverges early (prompt 1: token 8)")   # not "q8-kv, q4-kv: q8-kv: …"
    assert screen[i + 1].startswith("       q4-kv: accuracy guard failed") and screen[i + 2].startswith("       fix: ")
    page = archive.write_summary_html(tmp_path, s, summary.attention(s["notebooks"])).read_text()
    assert page.count("<code>tune.guard") == 1 and '<td class="title">q8-kv: accuracy guard failed' in page   # one row


def test_figures_are_right_aligned_text_left_and_whole_numbers_beside_gaps_have_no_decimals():
    df = pd.DataFrame({"KV B/token": [18432, None], "running cap": [2.0, np.nan], "start-up s": [0.2, None],
                       "verdict": ["recommended", None]}, index=pd.Index(["reference", "old-flag"], name="candidate"))
    assert tables.text(df).split() == ["KV", "B/token", "running", "cap", "start-up", "s", "verdict", "candidate", "reference",
                                       "18,432", "2", "0.20", "recommended", "old-flag", "—", "—", "—", "—"]
    html = tables.style(df).to_html()
    css = dict(re.findall(r"(#T_\w+(?:, #T_\w+)*) \{\s*text-align: (\w+)", html))
    right = " ".join(k for k, v in css.items() if v == "right")
    left = " ".join(k for k, v in css.items() if v == "left")
    for col in (0, 1, 2):      # cells and header of the figures (an object column of ints and None included)
        assert f"_row0_col{col}" in right and f"_level0_col{col}" in right
    assert "_row0_col3" in left and "_level0_col3" in left
    assert not re.search(r"#T_\w+ td \{[^}]*text-align", html)   # a td rule would outrank the per-column alignment


def test_archived_html_keeps_stderr_out_of_the_results_in_a_collapsed_log_at_the_end(tmp_path):
    from nbformat import v4, write

    progress = "10:00:01Z tune: reference: launching\n10:00:02Z tune: reference: ready in 0.2 s\n"
    nb = v4.new_notebook(cells=[v4.new_markdown_cell("## Verdict"), v4.new_code_cell("run()", outputs=[
        v4.new_output("stream", name="stderr", text=progress), v4.new_output("stream", name="stdout", text="Recommended: ref\n"),
        v4.new_output("stream", name="stderr", text="warning: <slow> & late\n")]), v4.new_markdown_cell("## Candidates")])
    write(nb, tmp_path / "n.ipynb")
    before = (tmp_path / "n.ipynb").read_text()
    html = archive.export_html(tmp_path / "n.ipynb", tmp_path / "n.html").read_text()
    results, _, log = html.partition('<details class="rb-log" id="rb-log">')
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html
    assert "tune: reference" not in results and "Recommended: ref" in results
    assert "<summary>Log: what the cells wrote to stderr (3 lines)</summary>" in log
    assert "10:00:02Z tune: reference: ready in 0.2 s\nwarning: &lt;slow&gt; &amp; late</pre>" in log
    assert log.index("</details>") < log.index("</main>")           # inside the page's content, after the last cell
    assert (tmp_path / "n.ipynb").read_text() == before              # the archived notebook keeps its outputs
    nb.cells[1].outputs = nb.cells[1].outputs[1:2]
    write(nb, tmp_path / "quiet.ipynb")
    assert "rb-log" not in archive.export_html(tmp_path / "quiet.ipynb", tmp_path / "quiet.html").read_text().split("</style>")[-1]


TUNE = {"candidates": [
    {"name": "reference", "status": "done", "precheck": "ok", "ready_s": 0.2, "verdict": "recommended", "guard": {"status": "reference"},
     "predicted": {"kv_dtype": "K f16, V f16", "kv_bytes_per_token": 18432, "max_total_num_tokens": 4096, "max_running_requests": 2},
     "observed": {"max_total_num_tokens": 4096},
     "bench": {"slo_limit": 4, "output_tok_s": 187.81234, "accept_length": None, "j_per_token": None,
               "buckets": [{"bucket": "≤512", "requests": 12, "ttft_ms_p50": 67.013357, "ttft_ms_p99": 153.753862,
                            "tpot_ms_p50": 4.08204, "tpot_ms_p99": 9.730141, "accept_length": None}]}},
    {"name": "old-flag", "status": "skipped", "precheck": "skipped", "verdict": "skipped", "reason": "--draft-max: removed"}]}


def test_tune_tables_fit_the_page_and_show_gaps_and_figures_as_a_reader_expects():
    from runbook import tune

    parts = tune.frames(TUNE)
    assert [list(p.columns)[:2] for p in parts] == [["pre-check", "KV dtype"], ["load within SLO", "tok/s"], ["gain vs reference", "guard"]]
    assert sorted(c for p in parts for c in p.columns) == sorted(tune.frame(TUNE).columns)     # split, nothing lost
    shown = [tables.text(p) for p in parts] + [tables.text(tune.buckets_frame(TUNE)), tables.text(tune.launches_frame(TUNE))]
    for t in shown:
        assert not re.search(r"\b(NaN|nan|None)\b", t) and not re.search(r"\d\.\d{3,}", t), t
    plan, measured, _ = shown[:3]
    assert "18,432" in plan and "4,096" in plan and "4,096.0" not in plan and "—" in plan
    assert "187.8" in measured and "67/154" in measured
    assert "67.0" in shown[3] and "153.8" in shown[3] and "9.7" in shown[3]
    assert tune.frames({"candidates": []}) == []


def test_the_tool_call_cases_are_two_tables_with_headers_that_wrap():
    from runbook import accuracy

    case = {"tool": "read_file", "stream": True, "called": True, "name": "read_file", "in_content": False, "in_reasoning": False,
            "content_chars": 0, "arguments_valid": False, "schema_errors": ["path: missing", "n: not an integer"],
            "arguments_chars": 1234, "argument_deltas": 7, "last_delta_share": 0.123456, "finish_reason": "tool_calls", "error": None}
    answer, arguments = accuracy.toolcall_frames([case, {**case, "stream": False, "called": False, "name": None, "schema_errors": [],
                                                         "arguments_valid": None, "last_delta_share": None}])
    assert all("_" not in c for c in list(answer.columns) + list(arguments.columns))   # words: a header can wrap
    assert len(answer.columns) + len(arguments.columns) == len(case) - 2              # tool and stream are the index
    a, b = tables.text(answer), tables.text(arguments)
    assert "streamed" in a and "not streamed" in a and "—" in a
    assert "path: missing; n: not an integer" in b and "1,234" in b and "0.12" in b and "0.123" not in b
    assert not re.search(r"\b(NaN|nan|None|\[\])", a + b)
    assert accuracy.toolcall_frames([]) == []
