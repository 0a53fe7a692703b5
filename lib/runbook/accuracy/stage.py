"""Stage 50's contract and entry point: the offline KV-quantization study plus the live recall, greedy-identity,
tool-call and KL-divergence probes (each a `skip` finding when its endpoint is not given or not reachable)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runbook.accuracy import kldprobe, probes, toolcall
from runbook.accuracy.settings import AccuracySettings
from runbook.core.errors import InputError
from runbook.core.findings import Finding
from runbook.core.numeric import number
from runbook.core.options import Options
from runbook.core.registry import Outcome, Stage, register
from runbook.core.settings import options_view
from runbook.core.spec import SLO, Deployment

if TYPE_CHECKING:
    from runbook.accuracy import kvquant


@dataclass
class AccuracyReport:
    study: kvquant.Study
    active: tuple[str, str]                       # this deployment's KV (format, scaling)
    recall: dict[str, Any] = field(default_factory=dict)
    identity: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    toolcall: dict[str, Any] = field(default_factory=dict)     # accuracy.toolcall.ToolCallReport.data()
    identity_batch: list[dict[str, Any]] = field(default_factory=list)         # url at concurrency 1 vs N
    identity_differences: list[dict[str, Any]] = field(default_factory=list)   # what differs between identity's A and B
    kld: dict[str, Any] = field(default_factory=dict)        # probes.run_kld: url against compare_url, per depth

    def data(self) -> dict[str, Any]:
        return {"kvquant": {**self.study.data(), "active": list(self.active)},
                "recall": dict(self.recall), "identity": self.identity, "identity_batch": self.identity_batch,
                "identity_differences": self.identity_differences, "toolcall": dict(self.toolcall), "kld": dict(self.kld)}


def assess(spec: Deployment, s: AccuracySettings) -> AccuracyReport:
    """The KV study, then the live probes with the settings (`AccuracySettings.resolve`); greedy identity compares
    s.url with s.identity_b, and its findings name what differs between the two."""
    from runbook.accuracy import kvstudy  # lazy: numpy and ml_dtypes (~0.6 s) only when the study runs (the root does not import it)

    active = probes.deployment_format(spec)
    study = kvstudy.study(spec, s, active)
    rec, recall_findings = probes.run_recall(s)
    ident = probes.run_identity(s)
    tc = toolcall.run(s)
    kl, kld_findings = _kld_per_replica(spec, s) if _per_replica(spec, s) else _kld_of_report(s)
    # the KLD compares url with compare_url; identity url with identity_b: the same pair unless spec_off_url is given
    ident_findings = probes.judged_by_kld(ident.findings, kld_findings) if s.identity_b == s.compare_url else ident.findings
    return AccuracyReport(study, active, rec, ident.rows,
                          study.findings + recall_findings + ident_findings + tc.findings + kld_findings,
                          tc.data(), ident.batch, ident.differences, kl)


def _kld_of_report(s: AccuracySettings) -> tuple[dict[str, Any], list[Finding]]:
    """The KLD probe; in the report a recorded reference that does not belong to this server (another model, a
    tampered file) is a fail of its own, and the other probes still run: a cron run records it and pages."""
    try:
        return probes.run_kld(s)
    except InputError as e:
        if not s.record or s.compare_url:
            raise
        return {}, [Finding("accuracy.kld.record", "fail", "the recorded reference was refused: production not compared "
                            "with it", detail=str(e), remedy="Fix the record the spec's accuracy.record names (the "
                            "detail says what differs), or record the reference again: runbook accuracy record")]


def _per_replica(spec: Deployment, s: AccuracySettings) -> bool:
    """A topology's replicas are each compared with the record: the spec's server is then not one URL."""
    return bool(s.record and not s.compare_url and spec.topology.replicas and s.url == spec.serving.local_url)


def _kld_per_replica(spec: Deployment, s: AccuracySettings) -> tuple[dict[str, Any], list[Finding]]:
    """Every replica against the same record at its own URL, not through the gateway (which would pick one): a
    replica whose distributions differ (another SGLang version, a flag, a faulty GPU) is named in its verdict,
    `accuracy.kld.verdict.<replica>`. The document is the worst replica's, with `replicas` (one row each)."""
    rows, findings, docs = [], [], []
    for name, url in spec.servers:
        doc, found = _kld_of_report(s.model_copy(update={"url": url}))
        v = doc.get("verdict") or {}
        decided = [f for f in found if f.id != "accuracy.kld.floor"]
        rows.append({"replica": name, "url": url, "status": decided[0].status if decided else "skip",
                     "excess_kld": v.get("excess_kld"), "top1_drop_pts": v.get("top1_drop_pts"), "tested": doc.get("tested")})
        findings += [dataclasses.replace(f, id=f"{f.id}.{name}", title=f"replica {name}: {f.title}") for f in decided]
        if not any(f.id == "accuracy.kld.floor" for f in findings):
            findings[:0] = [f for f in found if f.id == "accuracy.kld.floor"]
        docs.append(doc)
    worst = max(docs, key=lambda d: number((d.get("verdict") or {}).get("excess_kld")) or float("-inf"))
    return ({**worst, "replicas": rows} if worst else {"replicas": rows}), findings


# The flags and notebook parameters: the settings (accuracy/settings.py) a user sets, None meaning the spec's value.
AccuracyOptions = options_view(AccuracySettings, "AccuracyOptions")


def evaluate(spec: Deployment, options: Options) -> AccuracyReport:
    return assess(spec, AccuracySettings.resolve(spec, options))


def _kvquant(spec: Deployment, o: Options) -> Outcome:
    from runbook.accuracy import kvstudy  # lazy: numpy and ml_dtypes (~0.6 s) only when the study runs (the root does not import it)

    active = probes.deployment_format(spec)
    st = kvstudy.study(spec, AccuracySettings.resolve(spec, o), active)
    return Outcome(st.findings, {"kvquant": {**st.to_json(), "active": list(active)}})


def _recall(spec: Deployment, o: Options) -> Outcome:
    rec, findings = probes.run_recall(AccuracySettings.resolve(spec, o))
    return Outcome(findings, {"recall": rec})


def _toolcall(spec: Deployment, o: Options) -> Outcome:
    tc = toolcall.run(AccuracySettings.resolve(spec, o))
    return Outcome(tc.findings, {"toolcall": tc.data()})


def _identity(spec: Deployment, o: Options) -> Outcome:
    s = AccuracySettings.resolve(spec, o)
    ident = probes.run_identity(s)
    # the A/B judged by KL divergence against the noise floor too; greedy identity stays the first-divergence finding
    kl, kld_findings = probes.run_kld(s, reference=s.identity_b) if s.identity_b else ({}, [])
    return Outcome(probes.judged_by_kld(ident.findings, kld_findings) + kld_findings, {
        "identity": ident.rows, "identity_batch": ident.batch,
                                                   "identity_differences": ident.differences, "kld": kl})


def _kld(spec: Deployment, o: Options) -> Outcome:
    kl, findings = probes.run_kld(AccuracySettings.resolve(spec, o))
    return Outcome(findings, {"kld": kl})


def _record(spec: Deployment, o: Options) -> Outcome:
    doc, findings = kldprobe.write_record(AccuracySettings.resolve(spec, o))
    return Outcome(findings, {"record": doc})


KLD_VERDICTS = ("pass", "warn", "fail")
TRENDS = ("recall", "greedy_identical", "kvquant_attn_rel_err_max", "kld_excess", "kld_top1_drop_pts")


def figures(data: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    """recall (share of needles found), greedy_identical (share of identical prompts), the KV study's largest
    attention-output error for this deployment's own KV format, and the KLD probe's mean KLD, same-top-1 share and
    PPL ratio against the reference."""
    out: dict[str, Any] = {}
    grid = [c for c in ((data.get("recall") or {}).get("grid") or []) if isinstance(c, dict)]
    total = sum(int(c.get("total") or 0) for c in grid)
    if total:
        out["recall"] = round(sum(int(c.get("correct") or 0) for c in grid) / total, 4)
    ident = [r for r in (data.get("identity") or []) if isinstance(r, dict)]
    if ident:
        out["greedy_identical"] = round(sum(1 for r in ident if r.get("identical")) / len(ident), 4)
    kvq = data.get("kvquant") or {}
    rows = [r for r in (kvq.get("rows") or []) if isinstance(r, dict)]
    active = kvq.get("active")
    if rows and isinstance(active, list) and len(active) == 2:
        errs = [e for e in (number(r.get("attn_out_rel_err")) for r in rows if [r.get("format"), r.get("scaling")] == active)
                if e is not None]
        if errs:
            out["kvquant_attn_rel_err_max"] = round(max(errs), 6)
    kl = data.get("kld") or {}
    cand = (kl.get("candidate") or {}).get("overall") or {}
    verdict = kl.get("verdict") or {}
    for doc, key, name in ((cand, "kld_mean", "kld_mean"), (cand, "same_top1", "kld_same_top1"),
                           (cand, "ppl_ratio", "kld_ppl_ratio"), (verdict, "excess_kld", "kld_excess"),
                           (verdict, "top1_drop_pts", "kld_top1_drop_pts")):
        v = number(doc.get(key))
        if v is not None:
            out[name] = round(v, 6)
    if verdict.get("status") in KLD_VERDICTS:
        out["kld_verdict"] = verdict["status"]
    return out


STAGE = register(Stage(50, "accuracy", "accuracy",
                       "KV-quantization error offline; long-context recall, greedy identity, tool calls and KL "
                       "divergence against a reference live",
                       AccuracyOptions, evaluate, figures=figures, trends=TRENDS,
                       actions={"kvquant": _kvquant, "recall": _recall, "toolcall": _toolcall, "identity": _identity,
                                "kld": _kld, "record": _record},
                       action_field="probe"))
