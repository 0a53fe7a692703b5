"""The recorded reference (accuracy/record.py, `runbook accuracy record`, `kld --record`) against fake SGLang servers
whose distributions are known: the reference is recorded, its server stopped, and the candidate compared with the
file gives the two-server probe's figures. A record that cannot be trusted (truncated, tampered, newer, not a record)
or does not belong to the comparison (another tokenizer, corpus, shape or model) is refused in one line and never
compared; a record that cannot be written leaves the one already there."""
import json
import os

import numpy as np
import pytest
import yaml
from conftest import DEFAULT_SPEC
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from accuracy.conftest import train_tokenizer
from accuracy.fake_generate import Model, serve
from runbook.accuracy import kldprobe, probes, record, stage
from runbook.accuracy.settings import AccuracySettings
from runbook.alerts import metrics
from runbook.alerts.textfile import render
from runbook.core.errors import InputError
from runbook.core.spec import load as load_spec

WINDOWS, LENGTH, TOP_K, CHUNK = 3, 200, 5, 64


def settings(url, tokdir, **kw):
    return AccuracySettings.resolve(None, None, **{"probe": "kld", "url": url, "tokenizer": str(tokdir),
                                                   "kld_windows": WINDOWS, "kld_window_tokens": LENGTH, "kld_top_k": TOP_K,
                                                   "kld_chunk": CHUNK, "batch_size": 2, **kw})


def compare_settings(url, tokdir, path, **kw):
    """A comparison as a user gives it: the record's shape is not repeated."""
    return AccuracySettings.resolve(None, None, **{"probe": "kld", "url": url, "tokenizer": str(tokdir), "record": str(path), **kw})


def vocab(tokdir):
    return Tokenizer.from_file(str(tokdir / "tokenizer.json")).get_vocab_size()


@pytest.fixture(scope="module")
def recorded(tokdir, tmp_path_factory):
    """The reference recorded while it served, then stopped."""
    path = tmp_path_factory.mktemp("rec") / "reference.safetensors"
    with serve(Model(vocab(tokdir))) as (ref, seen):
        doc, findings = kldprobe.write_record(settings(ref, tokdir, probe="record", record=str(path)))
    return path, doc, findings, seen


def test_a_candidate_compared_with_the_record_gets_the_two_server_figures(tokdir, recorded):
    path, doc, findings, seen = recorded
    assert [f.id for f in findings] == ["accuracy.kld.floor", "accuracy.record"] and findings[1].status == "pass"
    assert doc["bytes"] == path.stat().st_size and doc["made"]["windows"] == WINDOWS and doc["made"]["top_k"] == TOP_K
    # the reference once per window, its second pass and its batch pass in chunks of positions
    assert sum(p == "/generate" for p, _ in seen) == WINDOWS + 2 * WINDOWS * 4
    ref_m, cand_m = Model(vocab(tokdir)), Model(vocab(tokdir), shift=0.15)
    with serve(cand_m, kv="fp8_e4m3") as (cand, seen_cand):
        one, f_one = probes.run_kld(compare_settings(cand, tokdir, path))
    with serve(ref_m) as (ref, _), serve(cand_m, kv="fp8_e4m3") as (cand, _):
        two, _ = probes.run_kld(settings(cand, tokdir, compare_url=ref))
    assert sum(p == "/generate" for p, _ in seen_cand) == WINDOWS * 4          # only the candidate is asked
    a, b = one["candidate"]["overall"], two["candidate"]["overall"]
    for k in ("positions", "kld_mean", "kld_max", "same_top1", "ppl_ratio"):   # float32 logprobs in the file
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    assert one["verdict"]["status"] == two["verdict"]["status"] != "pass"
    assert one["record"]["sha256"] == doc["sha256"] and one["floor_url"] is None
    v = {f.id: f for f in f_one}["accuracy.kld.verdict"]
    assert "KV cache dtype: auto vs fp8_e4m3" in v.title                 # the record's /server_info against the live one
    with serve(Model(vocab(tokdir))) as (same, _):                       # the reference again, restarted
        again, f_again = probes.run_kld(compare_settings(same, tokdir, path))
    assert {f.id: f.status for f in f_again}["accuracy.kld.verdict"] == "pass"
    assert again["candidate"]["overall"]["kld_mean"] == pytest.approx(0, abs=1e-6)


def test_the_record_holds_who_made_it_and_no_pickle(tokdir, recorded):
    path, doc, _, _ = recorded
    rec = record.read(path)
    m = rec.made
    assert m["model"]["tokenizer_sha256"] == record.model_identity(tokdir)["tokenizer_sha256"]
    assert m["model"]["config_sha256"] is None                    # the fake model dir has a tokenizer only
    assert m["server_info"]["version"] == "0.5.23" and m["server_info"]["kv_cache_dtype"] == "auto"
    assert {"corpus_version", "window_tokens", "chunk", "host", "date", "runbook"} <= set(m)
    assert set(rec.reference.floors) == {"second_pass", "batch"}
    head = path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")]
    dtypes = {v["dtype"] for k, v in json.loads(head).items() if k != "__metadata__"}
    assert dtypes == {"I32", "F32", "F64"}                        # raw arrays only: nothing to unpickle


def _refused(path, match, url="http://127.0.0.1:9", tokdir=None, **kw):
    with pytest.raises(InputError, match=match) as e:
        probes.run_kld(compare_settings(url, tokdir, path, **kw))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_a_truncated_tampered_newer_or_foreign_file_is_refused(tokdir, recorded, tmp_path, monkeypatch):
    path, _, _, _ = recorded
    raw = path.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(raw[:len(raw) // 2])
    _refused(cut, "truncated or not a record", tokdir=tokdir)
    tampered = tmp_path / "tampered.safetensors"
    tampered.write_bytes(raw[:-9] + bytes([raw[-9] ^ 1]) + raw[-8:])          # one bit of one logprob
    _refused(tampered, "does not match the SHA-256", tokdir=tokdir)
    junk = tmp_path / "junk.safetensors"
    junk.write_text('{"windows": 4}')
    _refused(junk, "not a readable safetensors", tokdir=tokdir)
    bare = tmp_path / "bare.safetensors"
    save_file({"x": np.zeros(3, np.float32)}, str(bare))
    _refused(bare, "without the 'runbook.record' metadata", tokdir=tokdir)
    _refused(tmp_path / "absent.safetensors", "No such file", tokdir=tokdir)
    _refused(tmp_path, "is a directory", tokdir=tokdir)
    forged = tmp_path / "forged.safetensors"                      # a digest recomputed over a `made` that is no object
    meta = json.dumps({"format": 1, "made": "x", "floors": {}})
    t = {"w0.ids": np.zeros(3, np.int32)}
    save_file(t, str(forged), metadata={record.META: meta, record.DIGEST: record._digest(meta, t)})
    _refused(forged, "its content is not a reference's scores", tokdir=tokdir)
    newer = tmp_path / "newer.safetensors"
    rec = record.read(path)
    monkeypatch.setattr(record, "FORMAT", 2)
    record.write(newer, rec.reference, rec.made)
    monkeypatch.setattr(record, "FORMAT", 1)
    _refused(newer, "record format 2 is newer than this runbook reads", tokdir=tokdir)


def test_a_record_of_another_tokenizer_corpus_shape_or_model_is_refused(tokdir, recorded, tmp_path, monkeypatch):
    path, _, _, _ = recorded
    other = train_tokenizer(tmp_path, vocab_size=280)
    _refused(path, "another tokenizer.json", tokdir=other)
    with serve(Model(vocab(tokdir)), model_path="/models/other") as (url, seen):
        _refused(path, "serves /models/other: another model", url=url, tokdir=tokdir)
        _refused(path, "recorded with windows 3, this run asks for 4", url=url, tokdir=tokdir, kld_windows=4)
        monkeypatch.setattr(record, "CORPUS_VERSION", "code-v0")
        _refused(path, "recorded on corpus .*, this runbook has code-v0", url=url, tokdir=tokdir)
    assert not any(p == "/generate" for p, _ in seen)                     # refused before any scoring


def test_a_record_that_cannot_be_written_leaves_the_one_there(tokdir, recorded, tmp_path, monkeypatch):
    path, _, _, _ = recorded
    rec = record.read(path)
    keep = tmp_path / "reference.safetensors"
    keep.write_bytes(path.read_bytes())

    def full(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)                        # the disk fills while the new record is written
    with pytest.raises(InputError, match="cannot write there .No space left") as e:
        record.write(keep, rec.reference, rec.made)
    monkeypatch.undo()
    assert "\n" not in str(e.value) and keep.read_bytes() == path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reference.safetensors"]     # no temp file left
    with pytest.raises(InputError, match="is a directory"):
        record.write(tmp_path, rec.reference, rec.made)
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot write there"):
        record.write(tmp_path / "file" / "r.safetensors", rec.reference, rec.made)


def test_record_and_compare_from_the_cli(tokdir, tmp_path, cli):
    path = tmp_path / "ref.safetensors"
    with serve(Model(vocab(tokdir))) as (ref, _):
        cp = cli("accuracy", "record", "--url", ref, "--record", path, "--tokenizer", tokdir, "--kld-windows", 2,
                 "--kld-window-tokens", LENGTH, "--kld-top-k", TOP_K, "--kld-chunk", CHUNK, "--json")
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    assert out["record"]["bytes"] == path.stat().st_size
    with serve(Model(vocab(tokdir), shift=0.15)) as (cand, _):
        cp = cli("accuracy", "kld", "--url", cand, "--record", path, "--tokenizer", tokdir, "--json")
    kl = json.loads(cp.stdout)["kld"]
    assert kl["record"]["made"]["windows"] == 2 and kl["candidate"]["windows"] == 2    # the record's shape
    assert kl["verdict"]["status"] != "pass" and cp.returncode == (1 if kl["verdict"]["status"] == "fail" else 0)
    path.write_bytes(path.read_bytes()[:100])
    cp = cli("accuracy", "kld", "--url", "http://127.0.0.1:9", "--record", path, "--tokenizer", tokdir)
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1 and "truncated" in cp.stderr, cp.stderr


def _spec(tmp_path, tokdir, url, rec="reference.safetensors"):
    """The default deployment with its server at `url`, its model dir `tokdir` and accuracy.record relative to it."""
    doc = yaml.safe_load(DEFAULT_SPEC.read_text())
    host, port = url.removeprefix("http://").rsplit(":", 1)
    doc["serving"].update(host=host, port=int(port))
    doc["model"]["path"] = str(tokdir)
    doc["accuracy"]["record"] = rec
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(doc))
    return load_spec(tmp_path / "d.yaml")


def test_the_spec_names_the_record_and_every_run_compares_and_pages(tokdir, recorded, tmp_path):
    """`runbook run`'s stage 50 (the report): the spec's server against the spec's record, and the figures the run
    summary, the fleet index and the textfile carry; a record that belongs to another model is a fail finding."""
    path, _, _, _ = recorded
    (tmp_path / "reference.safetensors").write_bytes(path.read_bytes())
    with serve(Model(vocab(tokdir), shift=0.15), kv="fp8_e4m3") as (url, _):
        spec = _spec(tmp_path, tokdir, url)
        s = AccuracySettings.resolve(spec, None)                       # probe report, nothing given
        assert (s.url, s.record, s.tokenizer) == (url, str(tmp_path / "reference.safetensors"), str(tokdir))
        doc, found = stage._kld_of_report(s)
    figs = stage.figures({"kld": doc})
    assert figs["kld_excess"] == pytest.approx(doc["verdict"]["excess_kld"], abs=1e-6) and figs["kld_excess"] > 0
    assert figs["kld_verdict"] == doc["verdict"]["status"] != "pass" and "kld_top1_drop_pts" in figs
    text = render(metrics.collect_stage("d1", "accuracy", found, {"kld": doc}, 0.0).registry)
    assert 'runbook_check_failed{check="kld",deployment="d1",source="verb"} 1.0' in text
    assert f'runbook_accuracy_kld_excess_nats{{deployment="d1",source="verb"}} {figs["kld_excess"]}' in text
    with serve(Model(vocab(tokdir)), model_path="/models/other") as (url, _):
        doc, found = stage._kld_of_report(AccuracySettings.resolve(_spec(tmp_path, tokdir, url), None))
    (f,) = found
    assert (doc, f.id, f.status) == ({}, "accuracy.kld.record", "fail") and "another model" in f.detail
    text = render(metrics.collect_stage("d1", "accuracy", found, {}, 0.0).registry)
    assert 'runbook_check_failed{check="kld",deployment="d1",source="verb"} 1.0' in text


def test_with_a_topology_every_replica_is_compared_with_the_record(tokdir, recorded, tmp_path):
    path, _, _, _ = recorded
    (tmp_path / "reference.safetensors").write_bytes(path.read_bytes())
    with serve(Model(vocab(tokdir))) as (same, seen_same), serve(Model(vocab(tokdir), shift=0.15), kv="fp8_e4m3") as (off, _):
        spec = _spec(tmp_path, tokdir, "http://127.0.0.1:30000")
        doc = yaml.safe_load((tmp_path / "d.yaml").read_text())
        doc["topology"] = {"replicas": [{"name": "r1", "host": "127.0.0.1", "port": int(same.rsplit(":", 1)[1])},
                                        {"name": "r2", "host": "localhost", "port": int(off.rsplit(":", 1)[1])}]}
        (tmp_path / "d.yaml").write_text(yaml.safe_dump(doc))
        spec = load_spec(tmp_path / "d.yaml")
        s = AccuracySettings.resolve(spec, None)
        assert stage._per_replica(spec, s)
        kl, found = stage._kld_per_replica(spec, s)
    status = {f.id: f.status for f in found}
    assert status["accuracy.kld.verdict.r1"] == "pass" and status["accuracy.kld.verdict.r2"] != "pass"
    assert [(r["replica"], r["status"]) for r in kl["replicas"]] == [("r1", "pass"), ("r2", status["accuracy.kld.verdict.r2"])]
    assert "fp8_e4m3" in kl["replicas"][1]["tested"] and kl["candidate_url"].startswith("http://localhost:")
    assert any(p == "/generate" for p, _ in seen_same)                    # at its own URL, not through a gateway
    text = render(metrics.collect_stage("d1", "accuracy", found, {"kld": kl}, 0.0).registry)
    assert 'runbook_check_failed{check="kld",deployment="d1",source="verb"} 1.0' in text


def test_tune_resume_reads_the_reference_its_run_kept(recorded, tmp_path):
    """tune writes guard.KLD_RECORD into its run's folder; --resume compares the candidates left with it, and a file
    it cannot trust is a reason the candidates say, not a crash."""
    from runbook.tune import guard

    path, _, _, _ = recorded
    assert guard.kept_kld_reference(tmp_path) is None                      # none kept: the KLD is not measured
    (tmp_path / guard.KLD_RECORD).write_bytes(path.read_bytes())
    kept = guard.kept_kld_reference(tmp_path)
    assert set(kept.floors) == {"second_pass", "batch"} and len(kept.scores) == WINDOWS
    (tmp_path / guard.KLD_RECORD).write_bytes(path.read_bytes()[:500])
    why = guard.kept_kld_reference(tmp_path)
    assert isinstance(why, str) and "truncated" in why
    assert guard.kld_candidate(None, why, "http://127.0.0.1:9", None)["status"] == "skip"


def test_tune_judges_every_candidate_against_a_given_record(tokdir, recorded, tmp_path):
    """`tune --record FILE`: a reference this host cannot run, recorded where it could. Checked against the
    deployment's model before anything launches (another tokenizer is one line); each candidate, on the record's
    shape whatever tune's guard asks, judged against it: the guard's verdict without the reference's own outputs."""
    from runbook.tune import guard

    path, _, _, _ = recorded
    base = load_spec(DEFAULT_SPEC)
    spec = base.model_copy(update={"model": base.model.model_copy(update={"path": str(tokdir)})})
    rec = guard.recorded_kld_reference(spec, str(path))
    assert guard.recorded_kld_reference(base, str(path)).sha256 == rec.sha256    # no checkpoint here: nothing to refuse
    with serve(Model(vocab(tokdir))) as (same, _), serve(Model(vocab(tokdir), shift=0.15), kv="fp8_e4m3") as (off, seen):
        ok, moved = guard.kld_candidate(spec, rec, same, None), guard.kld_candidate(spec, rec, off, None)
    assert ok["status"] == "pass" and moved["status"] != "pass" and moved["overall"]["positions"] == WINDOWS * (LENGTH - 1)
    assert sum(p == "/generate" for p, _ in seen) == WINDOWS * 4              # the record's chunk, not the guard's
    assert guard.compare(spec, {}, {"kld": moved})["status"] == ("fail" if moved["status"] == "fail" else "pass")
    with serve(Model(vocab(tokdir)), model_path="/other-model") as (foreign, _):
        assert "another model" in guard.kld_candidate(spec, rec, foreign, None)["title"]
    other = spec.model_copy(update={"model": spec.model.model_copy(update={"path": str(train_tokenizer(tmp_path, vocab_size=280))})})
    with pytest.raises(InputError, match="another tokenizer.json"):
        guard.recorded_kld_reference(other, str(path))


def test_tune_refuses_a_record_it_cannot_trust_before_anything_is_made(recorded, tmp_path, capsys):
    from runbook import cli

    path, _, _, _ = recorded
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:500])
    archive = tmp_path / "a"
    assert cli.main(["tune", "--deployment", str(DEFAULT_SPEC), "--archive", str(archive), "--record", str(cut), "--yes"]) == 2
    err = capsys.readouterr().err
    assert str(cut) in err and "truncated" in err and err.count("\n") == 1 and not archive.exists()
