"""The run's findings: one per candidate (its pre-check or launch outcome and the guard), and the
recommendation. Ids start with `tune.`; the checks' own findings stay in each candidate's row."""
from __future__ import annotations

from typing import Any

from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.tune import noise


def _candidate(r: dict[str, Any], plan_only: bool) -> Finding:
    name, st = r["name"], r.get("status")
    pred = r.get("predicted") or {}
    if st == "skipped":
        return Finding("tune.skipped", "warn", f"{name}: skipped before launch: {r.get('reason')}",
                       remedy="Fix or drop the candidate in the spec's tune section.")
    if st == "failed":
        remedy = {"port": "Stop what listens on the deployment's port (--yes stops the production unit), or tune on a spare host.",
                  "spawn": "Fix serving.python (or the candidate's python, tune.llama_server) on this machine."}.get(
                      str(r.get("failure_kind")), f"Read the server log {r.get('log')}; fix the candidate's flags or drop it.")
        return Finding("tune.failed", "fail", f"{name}: {r.get('reason')}", evidence=(r.get("log_tail") or "")[-400:],
                       remedy=remedy)
    if st == "not_run":
        return Finding("tune.not_run", "skip", f"{name}: not run: {r.get('reason')}", remedy="--resume RUN continues the run.")
    if plan_only or st == "planned":
        caps = f"{pred.get('max_total_num_tokens') or '?'} tokens, {pred.get('max_running_requests') or '?'} running requests"
        unchecked = next((d for d in r.get("precheck_details") or [] if d.get("id") == "service.parser"
                          and d.get("status") == "skip"), None)
        if unchecked is not None:     # a pass would claim the flags are accepted: nothing has looked at them
            return Finding("tune.precheck", "warn", f"{name}: its flags were NOT checked: no SGLang parser here ({caps})",
                           detail=str(unchecked.get("title") or ""),
                           remedy="Set RUNBOOK_SERVING_PYTHON to an interpreter with SGLang (`make serving-env` builds a "
                                  "CPU copy of its parser), or run tune on the serving host.")
        return Finding("tune.precheck", "pass", f"{name}: passes the pre-check ({caps})")
    g = r.get("guard") or {}
    if g.get("status") == "fail":
        bad = "; ".join(c["title"] for c in g.get("checks", []) if c["status"] == "fail")
        return Finding("tune.guard", "fail", f"{name}: accuracy guard failed: {bad}",
                       detail=f"tested: {g['tested']}" if g.get("tested") else "",
                       remedy=g.get("remedy") or "Do not serve this candidate: it changes the model's answers.")
    gain = noise.describe(r.get("gain") or r.get("noise"))
    return Finding("tune.ran", "pass" if r.get("verdict") != "failed" else "fail",
                   f"{name}: ran; {r.get('verdict')}", detail="; ".join([c["title"] for c in g.get("checks", [])]
                                                                        + ([f"tested: {g['tested']}"] if g.get("tested") else [])
                                                                        + ([f"throughput: {gain}"] if gain else [])))


def _startup(r: dict[str, Any]) -> Finding | None:
    """What the start-up log says against the plan (stage 35's findings: token pool, FP8 KV without scales, ...)."""
    bad = [d for d in r.get("startup") or [] if d.get("status") in ("fail", "warn")]
    if r.get("status") != "done" or not bad:
        return None
    worst = next((d for d in bad if d["status"] == "fail"), bad[0])
    return Finding("tune.startup", worst["status"], f"{r['name']}: start-up log: {worst.get('title')}",
                   evidence=", ".join(sorted({str(d.get("id")) for d in bad})), remedy=worst.get("remedy") or "")


def _ports(r: dict[str, Any]) -> list[Finding]:
    """A start-up that lost its port to another process and ran on another (core/ports.py): the host, not the candidate."""
    runs = [r, *(r.get("repeats") or [])]
    return [Finding("tune.port", "warn", f"{r['name']}: {c['text']}", evidence=c.get("evidence") or "",
                    remedy="Nothing to fix in the candidate; find what takes ports on this host (another server, "
                           "client connections given ephemeral ports) if it keeps happening.")
            for x in runs for c in x.get("port_collisions") or []]


def findings(spec: Deployment, res: dict[str, Any]) -> list[Finding]:
    out = list(res["findings"]) + [_candidate(r, res["plan_only"]) for r in res["rows"]]
    out += [f for f in (_startup(r) for r in res["rows"]) if f is not None]
    out += [f for r in res["rows"] for f in _ports(r)]
    for r in res["rows"]:
        mem = r.get("gpu_memory_freed") or {}
        if mem and not mem.get("ok"):
            out.append(Finding("tune.gpu_memory", "fail", f"after {r['name']}: {mem.get('detail')}",
                               remedy="Find what holds the GPU (nvidia-smi) before tuning on."))
    rec = res.get("recommendation")
    if res["plan_only"]:
        return out
    no_energy = next(((r.get("bench") or {}).get("energy_skipped") for r in res["rows"]
                      if (r.get("bench") or {}).get("energy_skipped")), None)
    if no_energy:
        out.append(Finding("tune.energy", "skip", "energy per output token not measured: no GPU energy counter here",
                           detail=no_energy, remedy="Run tune on the GPU host (NVML, Volta or newer)."))
    if rec is None:
        out.append(Finding("tune.recommendation", "fail", "no candidate ran and passed the accuracy guard",
                           remedy="Read the candidates' findings above."))
    elif rec["is_reference"]:
        quiet = "; ".join(f"{w['name']} {w['gain']}" for w in rec.get("within_noise") or [])
        out.append(Finding("tune.recommendation", "pass", f"keep the deployment as it is ({rec['name']} is the best candidate)",
                           detail=f"no candidate's gain was outside the noise: {quiet}" if quiet else ""))
    else:
        gain = f"throughput gain {noise.describe(rec['gain'])}" if rec.get("gain") else ""
        out.append(Finding("tune.recommendation", "info", f"serve {rec['name']}",
                           detail="; ".join(x for x in (gain, rec.get("note") or "") if x), remedy=rec.get("command") or ""))
    return out
