"""The fleet index over several hosts' runs in a real moto S3 server."""
import json
import urllib.request
from pathlib import Path

from runbook import fleet
from runbook.core.fsutil import atomic_write_json
from runbook.runner import upload

URL = "s3://fleet-bkt/runs"


def _run_dir(root: Path, host: str, dep: str, day: int, exit_code: int, tok_s: float, observed=None) -> Path:
    run_id = f"202612{day:02d}T061500Z-{dep}"
    d = root / host / run_id
    d.mkdir(parents=True)
    failed = [{"id": "kv.fit", "status": "fail", "title": "<script>alert(1)</script> does not fit", "remedy": ""}] if exit_code == 1 else []
    metrics = {"kv_tokens_planned": 2034058, "output_tok_s": {"c1": tok_s / 8, "c8": tok_s}, "max_concurrency_within_slo": 8, "recall": 0.9}
    if observed:
        metrics["kv_tokens_observed"] = observed
    atomic_write_json(d / "summary.json", {
        "run_id": run_id, "deployment": dep, "host": host, "started": f"2026-12-{day:02d}T06:15:00+00:00", "exit_code": exit_code,
        "verdict": {0: "all notebooks ran, no check failed", 1: "checks failed"}[exit_code], "git_commit": "abc123def4567890",
        "findings": {"pass": 3, "warn": 0, "fail": len(failed), "skip": 0, "info": 1},
        "notebooks": [{"name": "20_kv_memory", "status": "ok", "failed_findings": failed, "html": "20_kv_memory.html"}],
        "metrics": metrics})
    (d / "summary.html").write_text(f"<html>{run_id}</html>")
    (d / "20_kv_memory.html").write_text("<html>kv</html>")
    (d / "20_kv_memory.ipynb").write_text("{}")
    return d


def _populate(s3, tmp: Path) -> None:
    fs = s3.fs()
    root = "fleet-bkt/runs"
    for host in ("gpu-a", "gpu-b", "gpu-c"):
        for dep in ("qwen-nvfp4", "llama-fp8"):
            if host == "gpu-c" and dep == "llama-fp8":
                continue   # not every host runs every deployment
            for day in (1, 2, 3):
                code = 1 if (host, dep, day) == ("gpu-b", "qwen-nvfp4", 3) else 0
                d = _run_dir(tmp / "local", host, dep, day, code, 1000.0 + day * 10, observed=2034000 if day == 3 else None)
                assert upload.upload_run(d, URL, host, fs=fs, root=root).ok
    # an upload that never finished: objects but no marker; and a marker over a broken summary
    d = _run_dir(tmp / "local", "gpu-a", "qwen-nvfp4", 9, 0, 1.0)
    for p in d.iterdir():
        fs.pipe_file(f"{root}/gpu-a/{d.name}/{p.name}", p.read_bytes())
    fs.pipe_file(f"{root}/gpu-c/20261205T000000Z-qwen-nvfp4/summary.json", b"{not json")
    fs.pipe_file(f"{root}/gpu-c/20261205T000000Z-qwen-nvfp4/_COMPLETE", b"{}")


def test_fleet_index_over_several_hosts(s3, tmp_path, cli):
    _populate(s3, tmp_path)
    before = len(s3.requests)
    out = tmp_path / "fleet"
    cp = cli("fleet", "--from", URL, "--out", out, env=s3.env)
    assert cp.returncode == 0, cp.stderr
    assert "15 completed runs, 3 hosts, 2 deployments" in cp.stdout
    gets = [p for m, p, _ in s3.requests[before:] if m == "GET"]
    assert sum(1 for p in gets if "list-type=2" in p) == 1, "the store is listed once"
    assert all(p.endswith("/summary.json") for p in gets if "list-type=2" not in p), "only summaries are read"
    doc = json.loads((out / "fleet.json").read_text())
    assert doc["schema"] == "runbook.fleet/1" and doc["hosts"] == ["gpu-a", "gpu-b", "gpu-c"]
    assert doc["deployments"] == ["llama-fp8", "qwen-nvfp4"] and doc["runs"] == 15
    assert doc["incomplete_runs"] == 1 and len(doc["unreadable"]) == 1
    cells = {(c["host"], c["deployment"]): c for c in doc["cells"]}
    assert len(cells) == 5 and ("gpu-c", "llama-fp8") not in cells
    bad = cells[("gpu-b", "qwen-nvfp4")]
    assert bad["latest"]["run_id"] == "20261203T061500Z-qwen-nvfp4" and bad["latest"]["exit_code"] == 1
    assert [f["id"] for f in bad["latest"]["failing"]] == ["kv.fit"]
    good = cells[("gpu-a", "qwen-nvfp4")]
    assert good["latest"]["run_id"] == "20261203T061500Z-qwen-nvfp4", "the run without _COMPLETE is not shown"
    assert [p["output_tok_s"]["c8"] for p in good["trend"]] == [1010.0, 1020.0, 1030.0]
    assert good["trend"][-1]["kv_tokens_observed"] == 2034000 and good["trend"][0]["kv_tokens_planned"] == 2034058
    assert good["latest"]["link"] == "gpu-a/20261203T061500Z-qwen-nvfp4/summary.html"
    assert good["latest"]["notebooks"] == {"20_kv_memory": "gpu-a/20261203T061500Z-qwen-nvfp4/20_kv_memory.html"}
    page = (out / "index.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    for h in doc["hosts"]:
        assert f"<th>{h}</th>" in page
    assert 'href="gpu-b/20261203T061500Z-qwen-nvfp4/summary.html"' in page and "output tok/s at c8" in page and "<svg" in page


def test_fleet_links_presigned_or_under_a_base_and_publish(s3, tmp_path, cli):
    _populate(s3, tmp_path)
    out = tmp_path / "fleet"
    cp = cli("fleet", "--from", URL, "--out", out, "--links", "presigned", "--expires", "600", "--publish", env=s3.env)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads((out / "fleet.json").read_text())
    link = doc["cells"][0]["latest"]["link"]
    assert link.startswith(s3.endpoint + "/fleet-bkt/runs/") and "Signature=" in link
    assert urllib.request.urlopen(link, timeout=30).read().startswith(b"<html>")
    fs = s3.fs()
    assert fs.cat_file("fleet-bkt/runs/index.html") == (out / "index.html").read_bytes()
    assert json.loads(fs.cat_file("fleet-bkt/runs/fleet.json"))["runs"] == 15
    cp = cli("fleet", "--from", URL, "--out", out, "--link-base", "https://runbooks.example.com/fleet", env=s3.env)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads((out / "fleet.json").read_text())
    assert doc["cells"][0]["latest"]["link"].startswith("https://runbooks.example.com/fleet/gpu-a/")


def test_fleet_build_in_process_and_an_empty_store(s3):
    fl = fleet.collect(URL, fs=s3.fs(), root="fleet-bkt/runs")
    assert fl.runs == [] and fleet.build(fl)["cells"] == []
    assert "0 completed runs" in fleet.render_html(fleet.build(fl))
