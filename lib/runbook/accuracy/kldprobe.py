"""The KL-divergence probe as one call (`runbook accuracy kld`, identity's A/B, `report`), and its two halves for a
caller that runs one server at a time (tune's guard, benchmarks/kld_fp8_kv.py): `measure_reference` while the
reference serves (its top-k per position and the noise floor), then `measure_candidate` for each candidate.
`write_record` writes the first half to a file (accuracy/record.py) and `run` with a record compares a server with it:
the reference and the candidate never serve at the same time."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runbook.accuracy import identity, kld, record, scoring
from runbook.accuracy.record import Reference
from runbook.accuracy.settings import AccuracySettings
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.corpus import VERSION as CORPUS_VERSION
from runbook.endpoint.reach import probe as reachable
from runbook.endpoint.reach import run_sync
from runbook.model.tokenizer import load_tokenizer

SKIP_REMEDY = ("Give url (the candidate) and compare_url (the reference: the same model with the setting under test at "
               "its safe value, e.g. --kv-cache-dtype bf16), and tokenizer (the served checkpoint's directory).")
# llama-cpp-python 0.3.36's vendored llama.cpp, tools/server/server-common.cpp:1051-1052: `echo` throws "Only no echo is
# supported"; its logprobs are generated_token_probs (server-context.cpp:243), never the prompt's; and no /generate.
NO_GENERATE_REMEDY = ("The check needs SGLang's native /generate (prompt logprobs by token id) on both servers: "
                      "llama-server returns logprobs of generated tokens only (its /v1/completions refuses echo).")


def _request(s: AccuracySettings, url: str) -> scoring.Request:
    return scoring.Request(url, s.api_key, s.kld_top_k, s.kld_chunk)


def measure_reference(s: AccuracySettings, wins: list[list[int]], url: str, floor_url: str | None = None) -> Reference:
    """The reference's top-k on every window, then itself scored as a candidate is: a second pass (on floor_url when
    given: a restart) and, with s.batch_size > 1, its windows that many at once. ScoringError when an answer is unusable."""
    ref = run_sync(scoring.score_reference(_request(s, url), wins))
    scoring.flush(floor_url or url, s.api_key)       # each floor pass computes its prefixes as a fresh server would
    floors = {"second_pass": kld.compare(ref, run_sync(scoring.score_candidate(_request(s, floor_url or url), ref)))}
    if s.batch_size > 1:
        scoring.flush(url, s.api_key)
        floors["batch"] = kld.compare(ref, run_sync(scoring.score_candidate(_request(s, url), ref, s.batch_size)))
    return Reference(url, ref, floors)


def measure_candidate(s: AccuracySettings, reference: Reference, url: str) -> kld.KldResult:
    """The candidate at `url` on the reference's windows, against the reference's scores."""
    return kld.compare(reference.scores, run_sync(scoring.score_candidate(_request(s, url), reference.scores)))


def findings(reference: Reference, result: kld.KldResult, tested: str) -> list[Finding]:
    """The floor's finding and the verdict's."""
    return [floor_finding(reference), kld.verdict(result, reference.floors[reference.floor_used], tested)]


def floor_finding(reference: Reference) -> Finding:
    """How well the reference reproduced its own distributions: the floor a candidate is judged against."""
    used = reference.floor_used
    fl = reference.floors[used].overall
    ok = fl["kld_mean"] < kld.FAIL_KLD     # BF16 alone moves it by ~0.001-0.002 nats at other shapes (measured)
    f_floor = Finding("accuracy.kld.floor", "info" if ok else "warn",
                      f"noise floor: the reference against itself, mean KLD {fl['kld_mean']:.5f} nats, same top-1 "
                      f"{100 * fl['same_top1']:.1f} %",
                      detail="; ".join(f"{k}: mean KLD {v.overall['kld_mean']:.5f}, same top-1 {100 * v.overall['same_top1']:.1f} %"
                                       for k, v in reference.floors.items()) + f"; the verdict uses {used}",
                      remedy="" if ok else ("The reference does not reproduce its own logprobs within what Q5_K_M weights "
                                            "move a model: batch shapes or kernels chosen by shape move them. Enable "
                                            "deterministic inference on the reference; until then no candidate can be "
                                            "told apart from noise below this floor."))
    return f_floor


def _skip(title: str, evidence: str = "", remedy: str = SKIP_REMEDY) -> tuple[dict[str, Any], list[Finding]]:
    return {}, [Finding("accuracy.kld.endpoint", "skip", f"KL-divergence check skipped: {title}", evidence=evidence, remedy=remedy)]


def _scoring_failed(e: scoring.ScoringError | InputError) -> tuple[dict[str, Any], list[Finding]]:
    if isinstance(e, InputError):
        return {}, [Finding("accuracy.kld.scoring", "fail", "KL-divergence check refused: the two servers scored different "
                            "tokens", detail=str(e))]
    no_generate = "no native /generate" in str(e)
    return {}, [Finding("accuracy.kld.scoring", "skip" if no_generate else "fail",
                        "KL-divergence check not run: " + ("a server cannot score prompt tokens by id" if no_generate
                                                           else "a server's logprobs could not be used"),
                        detail=str(e), remedy=NO_GENERATE_REMEDY if no_generate else (
                            "Check that both servers are SGLang serving the same model and tokenizer; see the server's log."))]


def _unready(s: AccuracySettings, urls: list[str]) -> tuple[dict[str, Any], list[Finding]] | None:
    """The skip when the tokenizer or a server is missing, else None."""
    if load_tokenizer(s.tokenizer) is None:
        return _skip("needs the model's tokenizer to cut the windows into token ids",
                     remedy="Give tokenizer: the served checkpoint's directory (with tokenizer.json).")
    for u in urls:
        if (why := run_sync(reachable(u))):
            return _skip(f"no server at {u}", evidence=why, remedy="Start the server" + ("s" if len(urls) > 1 else "")
                         + ", then run it again.")
    return None


def _windows(s: AccuracySettings, urls: list[str]) -> list[list[int]]:
    wins = scoring.windows(load_tokenizer(s.tokenizer), s.kld_windows, s.kld_window_tokens)
    for u in urls:
        scoring.check_fits(u, s.kld_window_tokens, s.api_key)
    return wins


def _doc(s: AccuracySettings, ref: Reference, result: kld.KldResult, ref_url: str, cand_url: str,
         diffs: list[dict[str, Any]], tested: str) -> dict[str, Any]:
    used = ref.floor_used
    return {"reference_url": ref_url, "candidate_url": cand_url, "floor_url": s.floor_url or ref_url, "top_k": s.kld_top_k,
            "chunk": s.kld_chunk, "corpus_version": CORPUS_VERSION, "candidate": result.data(),
            "floor": ref.floors["second_pass"].data(), "floor_batch": ref.floors["batch"].data() if "batch" in ref.floors else None,
            "floor_used": used, "verdict": kld.judge(result, ref.floors[used]).data(), "differences": diffs, "tested": tested}


def run(s: AccuracySettings, reference: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """KL divergence of s.url (the candidate) from `reference` (default s.compare_url; with neither, the recorded
    reference s.record) on the same token ids, per depth bucket, judged against the noise floor. (the `kld` document,
    findings); a window longer than a server's context, a corpus too short for the windows or a record that does not
    belong to this comparison is an InputError."""
    cand_url, ref_url = s.url, reference or s.compare_url
    if cand_url and not ref_url and s.record:
        return against_record(s)
    if not (cand_url and ref_url):
        return _skip("needs two endpoints")
    urls = list(dict.fromkeys(u for u in (ref_url, s.floor_url, cand_url) if u))
    if (skipped := _unready(s, urls)):
        return skipped
    wins = _windows(s, urls)
    try:
        ref = measure_reference(s, wins, ref_url, s.floor_url)
        result = measure_candidate(s, ref, cand_url)
    except (scoring.ScoringError, InputError) as e:
        return _scoring_failed(e)
    ca, cb = identity.server_config(ref_url, s.api_key), identity.server_config(cand_url, s.api_key)
    diffs = identity.config_differences(ca, cb)
    tested = identity.tested_difference(diffs, ca is not None and cb is not None)
    return _doc(s, ref, result, ref_url, cand_url, diffs, tested), findings(ref, result, tested)


def write_record(s: AccuracySettings) -> tuple[dict[str, Any], list[Finding]]:
    """`runbook accuracy record`: the reference at s.url scored on the windows, its noise floors measured (a second
    pass, or a restart at s.floor_url; a batch pass), and all of it written to s.record with who made it."""
    if not (s.url and s.record):
        return _skip("needs the reference's endpoint and a file to write", remedy="Give url (the reference server) and record "
                     "(the file to write).")
    urls = list(dict.fromkeys(u for u in (s.url, s.floor_url) if u))
    if (skipped := _unready(s, urls)):
        return skipped
    assert s.tokenizer is not None      # _unready: a tokenizer was loaded from it
    wins = _windows(s, urls)
    t0 = time.monotonic()
    try:
        ref = measure_reference(s, wins, s.url, s.floor_url)
    except (scoring.ScoringError, InputError) as e:
        return _scoring_failed(e)
    rec = keep(s, ref, s.url, s.record)
    made = rec.made
    took = time.monotonic() - t0
    doc = {"record": str(rec.path), "bytes": rec.bytes, "sha256": rec.sha256, "seconds": round(took, 1), "made": made,
           "floor": ref.floors["second_pass"].data(), "floor_batch": ref.floors["batch"].data() if "batch" in ref.floors else None,
           "floor_used": ref.floor_used}
    done = Finding("accuracy.record", "pass", f"reference recorded: {rec.path} ({rec.bytes / 1e6:.2f} MB, {took:.0f} s)",
                   detail=(f"{s.kld_windows} windows × {s.kld_window_tokens} tokens at top-{s.kld_top_k} from {s.url}; "
                           f"SHA-256 {rec.sha256}"),
                   remedy="Compare a candidate with it: runbook accuracy kld --url CANDIDATE --record " + str(rec.path))
    return doc, [floor_finding(ref), done]


def keep(s: AccuracySettings, ref: Reference, url: str, path: str | Path) -> record.Record:
    """The reference (scored at `url` with s's windows) written to `path` as a record, with who made it: the model
    at s.tokenizer, the server's /server_info. InputError naming the path when it cannot be written."""
    made = record.made_by(record.model_identity(s.tokenizer or "."), identity.server_config(url, s.api_key),
                          s.kld_windows, s.kld_window_tokens, s.kld_top_k, s.kld_chunk, url)
    return record.write(path, ref, made)


def against_record(s: AccuracySettings) -> tuple[dict[str, Any], list[Finding]]:
    """s.url compared with the recorded reference s.record, on the record's windows, top-k and chunk, judged against
    the floor it recorded; InputError (one line) for a record that does not belong to this model, corpus or shape."""
    assert s.url and s.record
    url, rec = s.url, record.read(s.record)
    if s.tokenizer is None:
        return _unready(s, []) or _skip("needs the model's tokenizer")
    shape = {"windows": s.kld_windows, "window_tokens": s.kld_window_tokens, "top_k": s.kld_top_k}
    if (why := record.refusal(rec, record.model_identity(s.tokenizer), shape, s.model_fields_set)):
        raise InputError(why)
    if (skipped := _unready(s, [url])):
        return skipped
    live = identity.server_config(url, s.api_key)
    if (why := record.server_refusal(rec, live)):
        raise InputError(why)
    made = rec.made
    s = s.model_copy(update={"kld_windows": made["windows"], "kld_window_tokens": made["window_tokens"],
                             "kld_top_k": made["top_k"], "kld_chunk": made["chunk"], "floor_url": None})
    if _windows(s, [url]) != [r.ids.tolist() for r in rec.reference.scores]:
        raise InputError(f"--record {rec.path}: the corpus cut with {s.tokenizer} gives other token ids than the record "
                         "holds: another tokenizer; give the recorded model's tokenizer, or record the reference again")
    try:
        result = measure_candidate(s, rec.reference, url)
    except (scoring.ScoringError, InputError) as e:
        return _scoring_failed(e)
    diffs = identity.config_differences(made.get("server_info"), live)
    tested = identity.tested_difference(diffs, bool(made.get("server_info")) and live is not None)
    doc = _doc(s, rec.reference, result, str(made.get("url") or ""), url, diffs, tested)
    doc["floor_url"] = None
    doc["record"] = {"path": str(rec.path), "sha256": rec.sha256, "bytes": rec.bytes, "made": made}
    return doc, findings(rec.reference, result, tested)
