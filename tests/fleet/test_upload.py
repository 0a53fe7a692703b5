"""Runs to object storage: a real moto S3 server process, the real s3fs/botocore client, real runs."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, RUNNER_PARAMS, make_notebook, record, spec_data

from runbook.core import secrets
from runbook.core.errors import SpecError
from runbook.runner import upload

TOKEN = "hf_FLEETplantedTOKEN0123456789"
FILE_SECRET = "sk-envfile-PLANTED-9876543210"
URL = "s3://fleet-bkt/runs"


def _spec(tmp: Path, **changes) -> Path:
    env_file = tmp / "secret.env"
    env_file.write_text(f"SGLANG_API_KEY={FILE_SECRET}\n")
    env_file.chmod(0o600)
    data = spec_data(**{"serving.env_file": str(env_file), **changes})
    p = tmp / "spec.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


LEAKY = """
import os, pathlib
tok = os.environ["HF_TOKEN"]
other = open({env_file!r}).read().split("=", 1)[1].strip()
print("token", tok, "file secret", other, repr(tok), tok.replace("_", "%5F"))
raw = pathlib.Path(results_path).parent / "00_leaky-raw"
raw.mkdir(exist_ok=True)
(raw / ("leak-" + tok + ".txt")).write_text("named after the token")
(raw / "blob.json").write_text(__import__("json").dumps({{"t": tok, "o": other}}))
"""


def _nbs(tmp: Path, env_file: Path, bulk: int = 0) -> Path:
    d = tmp / "nbs"
    make_notebook(d / "00_leaky.ipynb", RUNNER_PARAMS, LEAKY.format(env_file=str(env_file)),
                  record('[Finding("leaky.ok", "pass", "fine")]', "{'seen': tok}"))
    if bulk:
        make_notebook(d / "10_bulk.ipynb", RUNNER_PARAMS,
                      "import pathlib, os\nraw = pathlib.Path(results_path).parent / '10_bulk-raw'\nraw.mkdir(exist_ok=True)\n"
                      f"for i in range({bulk}):\n    (raw / f'part-{{i:04d}}.bin').write_bytes(os.urandom(65536))",
                      record('[Finding("bulk.ok", "pass", "fine")]'))
    return d


def _run(tmp: Path, s3, *args, env=None, timeout=600, host="host-a"):
    e = {**os.environ, "HF_TOKEN": TOKEN, "RUNBOOK_HOST": host, **s3.env, **(env or {})}
    e.pop("RUNBOOK_ARCHIVE_URL", None)
    return subprocess.run([sys.executable, "-m", "runbook", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=REPO)


def _objects(s3, prefix="fleet-bkt/runs") -> dict[str, bytes]:
    fs = s3.fs()
    keys = fs.find(prefix)
    return dict(zip(keys, [fs.cat_file(k) for k in keys], strict=True))


def _summary(out: Path, run_id: str) -> dict:
    return json.loads((out / run_id / "summary.json").read_text())


def test_run_uploads_every_file_then_the_marker_and_no_secret_leaves(s3, tmp_path):
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    cp = _run(tmp_path, s3, "run", "--deployment", spec, "--notebooks", _nbs(tmp_path, tmp_path / "secret.env"),
              "--out", out, "--archive-url", URL)
    assert cp.returncode in (0, 1), cp.stderr
    s = json.loads((out / "latest" / "summary.json").read_text())
    run_id = s["run_id"]
    assert s["host"] == "host-a" and s["archive"]["status"] == "pass", s.get("archive")
    assert s["archive"]["url"] == f"{URL}/host-a/{run_id}/"
    objs = _objects(s3)
    prefix = f"fleet-bkt/runs/host-a/{run_id}/"
    assert all(k.startswith(prefix) for k in objs), list(objs)
    local = sorted(p.relative_to(out / run_id).as_posix() for p in (out / run_id).rglob("*") if p.is_file())
    uploaded = sorted(k[len(prefix):] for k in objs)
    # every local file went up, except the one named after the token; then the marker
    assert sorted([f for f in local if TOKEN not in f] + ["_COMPLETE"]) == uploaded, (local, uploaded)
    assert "summary.json" in uploaded and "00_leaky.html" in uploaded and "00_leaky-raw/blob.json" in uploaded
    marker = json.loads(objs[prefix + "_COMPLETE"])
    assert marker["run_id"] == run_id and marker["files"] == len(uploaded) - 1
    # marker last: the server answered the marker's PUT after every other PUT of this run
    puts = [p for m, p, st in s3.requests if m == "PUT" and p.startswith(f"/fleet-bkt/runs/host-a/{run_id}/")]
    assert puts[-1].endswith("/_COMPLETE") and len(puts) == len(uploaded), puts
    assert all(st == 200 for m, p, st in s3.requests if m == "PUT")
    # no secret in any object's name, contents or metadata, in any spelling
    fs = s3.fs()
    planted = [f.encode() for f in secrets.expand([TOKEN, FILE_SECRET])]
    for key, body in objs.items():
        meta = json.dumps(fs.info(key), default=str).encode()
        for f in planted:
            assert f not in key.encode() and f not in body and f not in meta, (key, f)
    assert b"***redacted***" in objs[prefix + "00_leaky-raw/blob.json"]
    state = json.loads((out / ".uploads" / f"{run_id}.json").read_text())
    assert state["state"] == "done" and state["withheld"] == ["00_leaky-raw/leak-***redacted***.txt"]
    assert TOKEN not in cp.stdout + cp.stderr and "Store:" in cp.stdout


def test_upload_killed_midway_keeps_the_local_run_warns_and_the_next_run_retries(s3, tmp_path):
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    nbs = _nbs(tmp_path, tmp_path / "secret.env", bulk=240)   # 15 MiB in 240 objects: several batches
    killed = threading.Event()

    def kill_on_first_data_put(method, path, status):
        if method == "PUT" and path.startswith("/fleet-bkt/runs/") and not killed.is_set():
            killed.set()
            s3.proc.kill()
    s3.on_request = kill_on_first_data_put
    cp = _run(tmp_path, s3, "run", "--deployment", spec, "--notebooks", nbs, "--out", out, "--archive-url", URL)
    assert killed.is_set(), "the upload never started"
    assert cp.returncode in (0, 1), cp.stderr
    first = json.loads((out / "latest" / "summary.json").read_text())
    rid = first["run_id"]
    # the local archive is whole and the summary says what happened
    assert len(list((out / rid / "10_bulk-raw").glob("part-*.bin"))) == 240
    assert first["archive"]["status"] == "warn" and first["findings"]["warn"] >= 1
    assert first["archive"]["finding"]["id"] == "archive.upload" and "intact" in first["archive"]["finding"]["title"]
    assert "archive.upload" in (out / rid / "summary.md").read_text() or "failed" in (out / rid / "summary.md").read_text()
    assert json.loads((out / ".uploads" / f"{rid}.json").read_text())["state"] == "pending"
    assert "WARN" in cp.stdout and "upload to" in cp.stdout
    assert not list(out.glob(".inprogress-*"))

    # the store comes back (empty: moto keeps objects in memory); the next run uploads itself and the first
    s3.on_request = None
    s3.start()
    s3.make_bucket("fleet-bkt")
    cp2 = _run(tmp_path, s3, "run", "--deployment", spec, "--notebooks", nbs, "--only", "leaky", "--out", out, "--archive-url", URL)
    assert cp2.returncode in (0, 1), cp2.stderr
    second = json.loads((out / "latest" / "summary.json").read_text())["run_id"]
    fs = s3.fs()
    for r in (rid, second):
        assert fs.exists(f"fleet-bkt/runs/host-a/{r}/_COMPLETE"), r
    assert len(fs.find(f"fleet-bkt/runs/host-a/{rid}/10_bulk-raw")) == 240
    retried = _summary(out, rid)
    assert retried["archive"]["status"] == "pass" and f"retried by run {second}" in retried["archive"]["finding"]["title"]
    assert retried["findings"]["warn"] == first["findings"]["warn"] - 1
    stored = json.loads(fs.cat_file(f"fleet-bkt/runs/host-a/{rid}/summary.json"))
    assert stored["archive"]["status"] == "pass"
    puts = [p for m, p, _ in s3.requests if m == "PUT" and p.startswith(f"/fleet-bkt/runs/host-a/{rid}/")]
    assert puts[-1].endswith("/_COMPLETE")
    assert json.loads((out / ".uploads" / f"{rid}.json").read_text())["state"] == "done"


def test_push_uploads_what_an_unreachable_store_left(s3, tmp_path):
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    nbs = _nbs(tmp_path, tmp_path / "secret.env")
    dead = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "2"}
    t0 = time.monotonic()
    cp = _run(tmp_path, s3, "run", "--deployment", spec, "--notebooks", nbs, "--out", out, "--archive-url", URL, env=dead)
    assert cp.returncode in (0, 1), cp.stderr
    assert time.monotonic() - t0 < 400
    rid = json.loads((out / "latest" / "summary.json").read_text())["run_id"]
    assert _summary(out, rid)["archive"]["status"] == "warn"
    assert _summary(out, rid)["archive"]["finding"]["detail"], "the error is recorded"
    cp = _run(tmp_path, s3, "push", "--out", out, "--archive-url", URL)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"uploaded {rid}" in cp.stdout
    assert s3.fs().exists(f"fleet-bkt/runs/host-a/{rid}/_COMPLETE")
    cp = _run(tmp_path, s3, "push", "--out", out, "--archive-url", URL)
    assert cp.returncode == 0 and "nothing to upload" in cp.stdout
    cp = _run(tmp_path, s3, "push", "--out", out, "--archive-url", URL, "--run", "20990101T000000Z-nope")
    assert cp.returncode == 2 and "no finished run" in cp.stderr


def test_archive_url_from_spec_env_and_flag(tmp_path, monkeypatch):
    monkeypatch.delenv(upload.ENV_URL, raising=False)
    assert upload.resolve_url(None, "s3://from-spec/p") == "s3://from-spec/p"
    monkeypatch.setenv(upload.ENV_URL, "s3://from-env/p/")
    assert upload.resolve_url(None, "s3://from-spec/p") == "s3://from-env/p"
    assert upload.resolve_url("gs://flag/p", "s3://from-spec/p") == "gs://flag/p"
    monkeypatch.setenv(upload.ENV_URL, "s3://AKIA:pw@bucket/p")
    with pytest.raises(SpecError, match="RUNBOOK_ARCHIVE_URL: must not carry credentials"):
        upload.resolve_url(None, None)
    monkeypatch.setenv("RUNBOOK_HOST", "gpu node/7")
    assert upload.host_name() == "gpu-node-7"


@pytest.mark.parametrize("url, message", [
    ("s3://AKIA:pw@bkt/p", "must not carry credentials"),
    ("s3://bkt/p?X-Amz-Signature=abc", "must not carry credentials"),
    ("bkt/p", "must be a URL such as s3://BUCKET/PREFIX"),
    ("s3:///p", "names no bucket"),
])
@pytest.mark.notebook
def test_bad_archive_url_is_one_line_exit_2_nothing_written(cli, tmp_path, url, message):
    out = tmp_path / "out"
    cp = cli("run", "--out", out, "--archive-url", url)
    assert cp.returncode == 2 and message in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert not out.exists()


def test_spec_archive_section_takes_a_url_and_nothing_else(tmp_path):
    from runbook.core import spec as spec_mod

    assert spec_mod.from_dict(spec_data(archive={"url": "s3://b/p"})).archive.url == "s3://b/p"
    assert spec_mod.from_dict(spec_data()).archive.url is None
    with pytest.raises(SpecError, match="archive.secret_key: unknown key"):
        spec_mod.from_dict(spec_data(archive={"url": "s3://b/p", "secret_key": "x"}))
    with pytest.raises(SpecError, match="archive.url: must not carry credentials"):
        spec_mod.from_dict(spec_data(archive={"url": "s3://u:p@b/p"}))
