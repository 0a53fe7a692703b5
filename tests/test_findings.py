import pytest

from runbook.core.findings import Finding, counts, exit_code, format_text, sort, styled

F = [Finding("a", "pass", "A"), Finding("b", "warn", "B", remedy="do b"), Finding("c", "skip", "C"),
     Finding("d", "fail", "D", detail="dd", remedy="do d"), Finding("e", "info", "E")]


def test_counts_and_exit_codes():
    assert counts(F) == {"fail": 1, "warn": 1, "skip": 1, "pass": 1, "info": 1}
    assert exit_code(F) == 1
    assert exit_code([f for f in F if f.status != "fail"]) == 0
    assert exit_code([f for f in F if f.status != "fail"], strict=True) == 1
    assert exit_code([Finding("x", "pass", "x"), Finding("y", "info", "y")], strict=True) == 0


def test_bad_status_rejected():
    with pytest.raises(ValueError, match="status must be one of"):
        Finding("x", "ok", "x")


def test_sort_worst_first_and_text_shows_remedies():
    assert [f.status for f in sort(F)] == ["fail", "warn", "skip", "pass", "info"]
    text = format_text(F)
    assert text.splitlines()[0] == "[FAIL] d: D — dd"
    assert "fix: do d" in text and "fix: do b" in text
    assert text.splitlines()[-1] == "1 fail, 1 warn, 1 skip, 1 pass, 1 info"
    assert "\033[" not in text and "\033[31m" in format_text(F, colour=True)


def test_roundtrip_and_styled_table():
    assert Finding.from_dict(F[3].to_dict()) == F[3]
    html = styled(F).to_html()
    assert "#f8d7da" in html and "do d" in html


@pytest.mark.parametrize("name, secret", [("HF_TOKEN", True), ("api_key", True), ("SGLANG_API_KEY", True), ("password", True),
                                          ("Authorization", True), ("aws_secret_access_key", True), ("access_token", True),
                                          ("tokenizer", False), ("max_tokens", False), ("input_len", False), ("monkey", False)])
def test_secret_key_names(name, secret):
    from runbook.core.secrets import is_secret_key

    assert is_secret_key(name) is secret


def test_every_finding_id_starts_with_its_stage():
    """Issue 28: ids start with the stage that emits them; a finding's JSON is its six fields, nothing else."""
    import ast
    from pathlib import Path

    from runbook.core import registry

    assert list(Finding("env.gpu.count", "pass", "x").to_dict()) == ["id", "status", "title", "detail", "evidence",
                                                                     "remedy"]
    assert Finding.from_dict(Finding("env.host.shm", "warn", "x").to_dict()) == Finding("env.host.shm", "warn", "x")
    lib = Path(__file__).resolve().parents[1] / "lib" / "runbook"
    prefixes = {s.package: (s.verb, s.name) for s in registry.stages()}
    bad = []
    for pkg in prefixes:
        for p in (lib / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Finding" and node.args:
                    a = node.args[0]
                    first = a.value if isinstance(a, ast.Constant) else (a.values[0].value if isinstance(a, ast.JoinedStr)
                                                                          and isinstance(a.values[0], ast.Constant) else "")
                    # a computed id (f"{id_prefix}.tokens") is checked where its prefix is written
                    if first and not any(str(first).startswith(x + ".") for x in prefixes[pkg]):
                        bad.append(f"{p.name}:{node.lineno} {first}")
    assert not bad, bad


def test_the_verdict_holds_what_needs_action_and_one_line_for_the_rest():
    from runbook.core.findings import verdict

    study = [Finding(f"accuracy.kvquant.fp8_e4m3.s{i}", "info", f"row {i}") for i in range(13)]
    raw = "the model said:\n" + "\n".join(f"line {i} of its answer" for i in range(12))
    fs = [*study, Finding("a.ok", "pass", "fine"), Finding("a.ok2", "pass", "fine too"),
          Finding("a.skip", "skip", "no url"), Finding("a.bad", "fail", "broken", evidence=raw, remedy="fix it"),
          Finding("a.meh", "warn", "slow", evidence="x" * 500)]
    rows = verdict(fs)
    assert [(r.id, r.status) for r in rows] == [("a.bad", "fail"), ("a.meh", "warn"), ("1 skip", "skip"),
                                               ("2 pass", "pass"), ("13 info", "info")]
    bad, meh = rows[0], rows[1]
    assert bad.evidence == "the model said: … (the whole text: the run's JSON)" and bad.remedy == "fix it"
    assert "\n" not in meh.evidence and len(meh.evidence) < 220 and meh.evidence.startswith("x" * 100)
    assert rows[3].title == "a.ok, a.ok2" and "\n" not in rows[4].title
    # nothing is lost: the findings themselves are untouched, the JSON keeps every one
    assert fs[-2].evidence == raw
