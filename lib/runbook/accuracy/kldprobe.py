"""The KL-divergence probe as one call (`runbook accuracy kld`, identity's A/B, `report`), and its two halves for a
caller that runs one server at a time (tune's guard, benchmarks/kld_fp8_kv.py): `measure_reference` while the
reference serves (its top-k per position and the noise floor), then `measure_candidate` for each candidate."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runbook.accuracy import identity, kld, scoring
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


@dataclass
class Reference:
    """What the reference said while it served: its scores of the windows and the noise floors."""
    url: str
    scores: list[kld.Scores]
    floors: dict[str, kld.KldResult]     # second_pass (or a restart: floor_url), batch (its windows N at once)

    @property
    def floor_used(self) -> str:
        return max(self.floors, key=lambda k: self.floors[k].overall["kld_mean"])


def _request(s: AccuracySettings, url: str) -> scoring.Request:
    return scoring.Request(url, s.api_key, s.kld_top_k, s.kld_chunk)


def measure_reference(s: AccuracySettings, wins: list[list[int]], url: str, floor_url: str | None = None) -> Reference:
    """The reference's top-k on every window, then itself scored as a candidate is: a second pass (on floor_url when
    given: a restart) and, with s.batch_size > 1, its windows that many at once. ScoringError when an answer is unusable."""
    ref = run_sync(scoring.score_reference(_request(s, url), wins))
    floors = {"second_pass": kld.compare(ref, run_sync(scoring.score_candidate(_request(s, floor_url or url), ref)))}
    if s.batch_size > 1:
        floors["batch"] = kld.compare(ref, run_sync(scoring.score_candidate(_request(s, url), ref, s.batch_size)))
    return Reference(url, ref, floors)


def measure_candidate(s: AccuracySettings, reference: Reference, url: str) -> kld.KldResult:
    """The candidate at `url` on the reference's windows, against the reference's scores."""
    return kld.compare(reference.scores, run_sync(scoring.score_candidate(_request(s, url), reference.scores)))


def findings(reference: Reference, result: kld.KldResult, tested: str) -> list[Finding]:
    """The floor's finding and the verdict's."""
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
    return [f_floor, kld.verdict(result, reference.floors[used], tested)]


def _skip(title: str, evidence: str = "", remedy: str = SKIP_REMEDY) -> tuple[dict[str, Any], list[Finding]]:
    return {}, [Finding("accuracy.kld.endpoint", "skip", f"KL-divergence check skipped: {title}", evidence=evidence, remedy=remedy)]


def run(s: AccuracySettings, reference: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """KL divergence of s.url (the candidate) from `reference` (default s.compare_url) on the same token ids, per
    depth bucket, judged against the noise floor. (the `kld` document, findings); a window longer than a server's
    context or a corpus too short for the windows is an InputError."""
    cand_url, ref_url = s.url, reference or s.compare_url
    if not (cand_url and ref_url):
        return _skip("needs two endpoints")
    tok = load_tokenizer(s.tokenizer)
    if tok is None:
        return _skip("needs the model's tokenizer to cut the windows into token ids",
                     remedy="Give tokenizer: the served checkpoint's directory (with tokenizer.json).")
    urls = list(dict.fromkeys(u for u in (ref_url, s.floor_url, cand_url) if u))
    for u in urls:
        if (why := run_sync(reachable(u))):
            return _skip(f"no server at {u}", evidence=why, remedy="Start both servers, then run it again.")
    wins = scoring.windows(tok, s.kld_windows, s.kld_window_tokens)
    for u in urls:
        scoring.check_fits(u, s.kld_window_tokens, s.api_key)
    try:
        ref = measure_reference(s, wins, ref_url, s.floor_url)
        result = measure_candidate(s, ref, cand_url)
    except scoring.ScoringError as e:
        no_generate = "no native /generate" in str(e)
        return {}, [Finding("accuracy.kld.scoring", "skip" if no_generate else "fail",
                            "KL-divergence check not run: " + ("a server cannot score prompt tokens by id" if no_generate
                                                               else "a server's logprobs could not be used"),
                            detail=str(e), remedy=NO_GENERATE_REMEDY if no_generate else (
                                "Check that both servers are SGLang serving the same model and tokenizer; see the server's log."))]
    except InputError as e:
        return {}, [Finding("accuracy.kld.scoring", "fail", "KL-divergence check refused: the two servers scored different "
                            "tokens", detail=str(e))]
    ca, cb = identity.server_config(ref_url, s.api_key), identity.server_config(cand_url, s.api_key)
    diffs = identity.config_differences(ca, cb)
    tested = identity.tested_difference(diffs, ca is not None and cb is not None)
    used = ref.floor_used
    doc = {"reference_url": ref_url, "candidate_url": cand_url, "floor_url": s.floor_url or ref_url, "top_k": s.kld_top_k,
           "chunk": s.kld_chunk, "corpus_version": CORPUS_VERSION, "candidate": result.data(),
           "floor": ref.floors["second_pass"].data(), "floor_batch": ref.floors["batch"].data() if "batch" in ref.floors else None,
           "floor_used": used, "verdict": kld.judge(result, ref.floors[used]).data(), "differences": diffs, "tested": tested}
    return doc, findings(ref, result, tested)
