"""Stage 50's KV study, source first: which K and V it measures (a real decoder's cache, or MiniLM's encoder), the
study over them, the calibrated scales written where the user can apply them, and what each says in findings.

The source: the `kv_model` setting when given (a failure is the stage's input error); else the deployment's model
when it is a local HF checkpoint small enough for CPU (kvcapture.MAX_AUTO_BYTES) and a serving interpreter is here;
else MiniLM. A deployment model that cannot be captured falls back to MiniLM with a `warn` naming why.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook.accuracy import kvcapture, kvquant, kvscales, kvstats
from runbook.accuracy.settings import AccuracySettings
from runbook.core import paths
from runbook.core.errors import InputError
from runbook.core.findings import Finding, Status
from runbook.core.fsutil import output_dir
from runbook.core.spec import Deployment

LABEL = {"fp8_e4m3": "E4M3 (±448)", "fp8_e5m2": "E5M2 (±57,344)"}
CPU_NOTE = ("SGLang's CPU attention (torch_native) stores FP8 K/V at scale 1.0 whatever scales are given "
            "(torch_native_backend.py:299, :367); triton, flashinfer and fa3 apply checkpoint k_scale/v_scale")


@dataclass
class Choice:
    model_dir: str | None        # the decoder to capture; None: the MiniLM encoder
    python: str | None
    why: str                     # one line: which source and why
    explicit: bool               # named by the kv_model setting: a failure is an InputError, not a fallback


def choose(spec: Any, kv_model: str | None) -> Choice:
    """The K/V source: kv_model when given; else the deployment's model when it is a local HF checkpoint of at most
    kvcapture.MAX_AUTO_BYTES (a larger one would take too long on CPU) and a serving interpreter is here; else MiniLM."""
    from runbook import service  # lazy: the serving interpreter's lookup, only when the study picks its source

    py, _ = service.serving_python(spec) if spec is not None else (os.environ.get("RUNBOOK_SERVING_PYTHON"), [])
    if kv_model:
        kvcapture.check_model(Path(kv_model))     # the named folder's own fault first: it is what the user can fix
        if not py:
            raise InputError(f"kv_model {kv_model}: no serving interpreter here to run it; {kvcapture.FIX_ENV}")
        return Choice(kv_model, py, f"kv_model {kv_model}", True)
    if spec is None:
        return Choice(None, None, "no deployment", False)
    path = spec.resolve_path(spec.model.path)
    if not (path / "config.json").is_file():
        return Choice(None, None, f"the deployment's model ({spec.model.path}) is not a checkpoint on this machine", False)
    try:
        ck = kvcapture.check_model(path)
    except InputError as e:
        return Choice(None, None, f"the deployment's model cannot be captured: {e}", False)
    size = kvcapture.weight_bytes(ck)
    if size > kvcapture.MAX_AUTO_BYTES:
        return Choice(None, None, f"the deployment's model has {size / 2**30:.1f} GiB of weights, more than the "
                                  f"{kvcapture.MAX_AUTO_BYTES / 2**30:.0f} GiB captured on CPU unasked (set kv_model to insist)", False)
    if not py:
        return Choice(None, None, f"no serving interpreter to run the deployment's model; {kvcapture.FIX_ENV}", False)
    return Choice(str(path), py, f"the deployment's model ({kvcapture.model_name(path)})", False)


def _scale_dir(s: AccuracySettings, cap: kvcapture.Capture) -> Path:
    """Where the scales go: the run's artifact folder (s.artifact_dir) when given, else beside the cache entry."""
    if s.artifact_dir:
        return output_dir(Path(s.artifact_dir) / "kv_scales", option="out")
    return paths.cache_dir() / "kvvalues" / f"scales-{cap.model_sha256[:16]}"


def decoder_data(cap: kvcapture.Capture, files: dict[str, str]) -> dict[str, Any]:
    """The decoder's part of the study's JSON: per KV head, per layer (clipping), scales and their files, the capture."""
    return {"heads": cap.summary["heads"], "layers": kvstats.clipping_layers(cap.summary["heads"]),
            "scales": cap.summary["scales"], "scale_files": files,
            "capture": {"model_dir": cap.model_dir, "model_sha256": cap.model_sha256, "cached": cap.cached,
                        **{k: cap.meta.get(k) for k in ("layers", "kv_heads", "heads", "head_dim", "windows", "window_tokens",
                                                        "lengths", "corpus_version", "capture_s", "stats_s", "load_s",
                                                        "forward_s", "threads")}}}


def clipping_finding(layers: list[dict[str, Any]], active: tuple[str, str], model: str) -> Finding:
    """Which layers clip at scale 1.0 (verdict first); warn when this deployment stores FP8 at scale 1.0 and any does."""
    k = [r["layer"] for r in layers if r["k_e4m3_clip_share"] > 0]
    v = [r["layer"] for r in layers if r["v_e4m3_clip_share"] > 0]
    e5 = [r["layer"] for r in layers if r["clips_e5m2"]]
    n = len({*k, *v})
    worst = max(layers, key=lambda r: r["k_absmax"]) if layers else {"layer": "-", "k_absmax": 0.0}
    title = (f"FP8 E4M3 at scale 1.0 clips in {n} of {len(layers)} layers of {model}" if n else
             f"FP8 E4M3 at scale 1.0 clips in no layer of {model}") + f"; E5M2 in {len(e5)}"
    mine = active[1] == "scale1" and ((active[0] == "fp8_e4m3" and n) or (active[0] == "fp8_e5m2" and e5))
    return Finding("accuracy.kvquant.clipping", "warn" if mine else "info", title,
                   detail=f"K clips in layers {k or 'none'}, V in {v or 'none'}; largest |K| {worst['k_absmax']:.1f} "
                          f"(layer {worst['layer']})",
                   remedy="Calibrated scales (accuracy.kvquant.scales) on a GPU backend, or --kv-cache-dtype bf16." if mine else "")


def scales_finding(files: dict[str, str]) -> Finding:
    return Finding("accuracy.kvquant.scales", "info", "calibrated FP8 E4M3 KV scales written (absmax / 448 per layer)",
                   detail=CPU_NOTE + "; the --quantization-param-path JSON is read only by SGLang's own model classes",
                   evidence=files["checkpoint_tensors"])


def study(spec: Deployment | None, s: AccuracySettings, active: tuple[str, str]) -> kvquant.Study:
    """The KV study on the chosen source, with its source, clipping and scales findings."""
    choice = choose(spec, s.kv_model)
    thresholds = spec.accuracy if spec is not None else None
    cap = None
    if choice.model_dir:
        try:
            cap = kvcapture.capture(choice.model_dir, str(choice.python))
        except InputError as e:
            if choice.explicit:
                raise
            choice = Choice(None, None, f"the deployment's model could not be captured: {e}", False)
    if cap is None:
        st = kvquant.run(thresholds, active=active)
        status: Status = "warn" if "could not be captured" in choice.why else "info"
        st.findings.insert(0, Finding("accuracy.kvquant.source", status, "KV study on MiniLM (an encoder), not the model's "
                                      "own K and V", detail=choice.why,
                                      remedy="Set kv_model to a local HF checkpoint of the served model (or a small one of its "
                                             "family) to measure a decoder's cache."))
        return st
    files = kvscales.write(cap.summary["scales"], str(cap.meta.get("model_type") or "llama"), _scale_dir(s, cap))
    st = kvquant.run(thresholds, active=active, decoder={**cap.summary, "source": cap.summary["rows"][0]["source"]})
    st.decoder = decoder_data(cap, files)
    how = "read from the cache" if cap.cached else f"captured in {cap.meta.get('capture_s')} s"
    name = kvcapture.model_name(Path(cap.model_dir))
    m = cap.meta
    st.findings[:0] = [Finding("accuracy.kvquant.source", "info", f"KV study on the K and V {name} caches ({choice.why})",
                               detail=f"{m.get('windows')} windows × {m.get('window_tokens')} tokens of corpus "
                                      f"{m.get('corpus_version')}; {how}", evidence=cap.model_dir),
                       clipping_finding(st.decoder["layers"], active, name), scales_finding(files)]
    return st
