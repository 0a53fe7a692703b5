"""Checking the rendered unit: SGLang's own parser on the exact argv, `systemd-analyze verify`, and
cross-checks against the quant and KV stages.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runbook import kv as kv_stage
from runbook.core import oscalls, registry
from runbook.core.errors import InputError, SpecError
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.model import sglang_names
from runbook.service import gateway
from runbook.service.render import Build, Rendered, build

PROBE = Path(__file__).with_name("sglang_probe.py")


def serving_python(spec: Deployment) -> tuple[str | None, list[Finding]]:
    py = spec.serving.python
    if os.path.isfile(py) and os.access(py, os.X_OK):
        return py, []
    alt = os.environ.get("RUNBOOK_SERVING_PYTHON")
    if alt and os.path.isfile(alt):
        return alt, [Finding("service.parser_env", "info", "flags validated with RUNBOOK_SERVING_PYTHON",
                             detail=f"{py} is not on this machine; {alt} has the same SGLang parser only if its version matches.",
                             evidence=alt)]
    return None, [Finding("service.parser", "skip", "SGLang flags not validated: no serving interpreter here",
                          detail=f"{py} is not on this machine and RUNBOOK_SERVING_PYTHON is unset.",
                          remedy="Run on the serving host, or `make serving-env` to build a CPU copy of SGLang's parser.")]


def abbreviations(argv: list[str], known: list[str], ver: Any = None) -> list[Finding]:
    """argparse takes a unique prefix for a flag (--kv-cache-dtyp is --kv-cache-dtype): a warn naming the
    full flag, since a future SGLang flag with the same prefix makes it ambiguous (or means another flag)."""
    if not known:
        return []
    out = []
    for w in argv:
        flag = w.split("=", 1)[0]
        if not flag.startswith("--") or flag in known:
            continue
        full = [k for k in known if k.startswith(flag)]
        if len(full) == 1:
            out.append(Finding(f"service.flag_abbrev.{flag.lstrip('-')}", "warn",
                               f"{flag} is an abbreviation of {full[0]}: SGLang {ver or ''} accepts it only while no "
                               "other flag shares the prefix",
                               remedy=f"Write {full[0]} in serving.flags (or the --arg what-if)."))
    return out


def _probe_argv(r: Rendered) -> list[str]:
    # Only the renderer's own --api-key ${VAR} is hidden; a literal ${...} in a flag value is what SGLang gets.
    return [("REDACTED" if i and r.argv[i - 1] == "--api-key" else w) for i, w in enumerate(r.argv)][3:]


def _parser_failed(python: str, cp: Any) -> list[Finding]:
    tail = (cp.stderr or "").strip().splitlines()[-1:] or ["no output"]
    return [Finding("service.parser", "fail", "could not run SGLang's argument parser", evidence=tail[0],
                    remedy=f"Check that `{python} -c 'import sglang.srt.server_args'` works.")]


def check_flags(r: Rendered, python: str, run: Callable = subprocess.run) -> list[Finding]:
    argv = _probe_argv(r)
    cp = run([python, str(PROBE), json.dumps(argv)], capture_output=True, text=True, timeout=180)
    try:
        res = json.loads(cp.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return _parser_failed(python, cp)
    return _parser_findings(r, argv, res)


def check_flags_many(rs: list[Rendered], python: str, run: Callable = subprocess.run) -> list[list[Finding]]:
    """check_flags for many units in one run of `python` (importing SGLang is most of a check's seconds); each
    unit on its own when that one run does not answer for all."""
    argvs = [_probe_argv(r) for r in rs]
    cp = run([python, str(PROBE), json.dumps(argvs)], capture_output=True, text=True, timeout=180 + 10 * len(rs))
    try:
        res = json.loads(cp.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        res = None
    if not (isinstance(res, list) and len(res) == len(rs)):
        out = []
        for r in rs:
            oscalls.current().check()       # the one run may have died of tune's Ctrl-C: stop, not rerun each
            out.append(check_flags(r, python, run))
        return out
    return [_parser_findings(r, a, x) for r, a, x in zip(rs, argvs, res, strict=True)]


def unit_label(r: Rendered) -> str:
    """Which unit a finding is about, for its title: a replica, a node rank, or nothing for the one server."""
    if r.replica:
        return f" (replica {r.replica})"
    return f" on node {r.node}" if r.node else ""


def _parser_findings(r: Rendered, argv: list[str], res: dict[str, Any]) -> list[Finding]:
    ver = res.get("version")
    where = unit_label(r)
    known = res.get("known_flags", [])
    abbrev = abbreviations(argv, known, ver)
    if res["ok"]:
        n = sum(1 for w in r.argv if w.startswith("--"))
        return [Finding("service.parser", "pass", f"SGLang {ver}'s own parser accepts all {n} flags{where}")] + abbrev
    out = list(abbrev)
    errors = res.get("errors") or [{"flag": None, "error": res.get("error", "")}]
    for e in errors:
        flags = [e["flag"]] if e.get("flag") else re.findall(r"--[a-z0-9-]+", e["error"])
        for flag in flags or [None]:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag and flag not in known else []
            unknown = bool(flag) and flag not in known
            out.append(Finding(f"service.flag.{(flag or 'argv').lstrip('-')}", "fail",
                               f"{flag}: not a flag of SGLang {ver}" if unknown
                               else f"{flag or 'argv'}: rejected by SGLang {ver}'s parser{where}",
                               detail=e["error"],
                               remedy=(f"Did you mean {close[0]}?" if close else "Remove it or upgrade SGLang.") if unknown
                               else "Fix the value in serving.flags (or the --arg what-if)."))
    if res.get("kind") == "semantic" and not res.get("errors"):
        out = [Finding("service.parser", "fail", f"SGLang {ver} rejects the combination of flags{where}", detail=res.get("error", ""),
                       remedy="Read the message: a flag conflicts with another or with the parallelism.")]
    return out


def verify_unit(r: Rendered, run: Callable = subprocess.run) -> list[Finding]:
    exe = shutil.which("systemd-analyze")
    if not exe:
        return [Finding("service.systemd", "skip", "systemd-analyze not installed: unit syntax not verified",
                        remedy="apt-get install systemd (the CI script installs it)")]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{r.unit_name}.service"
        path.write_text(r.text)
        cp = run([exe, "verify", "--man=no", "--recursive-errors=no", str(path)], capture_output=True, text=True, timeout=60)
    lines = [ln.strip() for ln in (cp.stderr + cp.stdout).splitlines() if ln.strip()]
    out: list[Finding] = []
    for ln in lines:
        m = re.search(r"Command (\S+) is not executable", ln)
        if m:
            # The serving interpreter's absence is already a finding of 00_environment.
            out.append(Finding("service.systemd.binary", "info" if m.group(1) == r.argv[0] else "warn",
                               f"{m.group(1)} does not exist on this machine",
                               detail="systemd-analyze checks ExecStart binaries where it runs; on the serving host it must exist.",
                               evidence=ln.replace(str(Path(d)), "<tmp>")))
            continue
        if "fatal" in ln.lower() and any(f.id == "service.systemd.binary" for f in out):
            continue  # the missing binary is already reported
        out.append(Finding("service.systemd.syntax", "fail" if "fatal" in ln.lower() else "warn",
                           f"systemd-analyze: {ln.split(': ', 1)[-1]}",
                           evidence=ln.replace(str(Path(d)), "<tmp>"), remedy="Fix the spec value that produced this line."))
    if not out:
        what = f" ({r.unit_name})" if (r.node or r.replica or r.host) else ""
        out.append(Finding("service.systemd", "pass", "systemd-analyze verify: no warnings" + what))
    return out


def gpus_finding(spec: Deployment, r: Rendered) -> Finding:
    """`service.gpus`: the GPUs the unit's host puts to work against those it has. Replicas sharing a host each hold
    TP × PP of its GPUs (topology.replicas[].gpus), so the host is idle only where all of them together fall short."""
    par, hw = spec.parallelism, spec.hardware
    sharing = [x for x in spec.topology.replicas if x.host == r.host] if r.replica else []
    if len(sharing) > 1:
        used, total = par.gpus * len(sharing), hw.gpu_count
        what = f"{len(sharing)} replicas × TP {par.tp} × PP {par.pp} = {used} GPUs of {total} on {r.host}"
    else:
        used, total = par.gpus, hw.gpu_count * max(1, len(par.nodes))
        what = f"TP {par.tp} × PP {par.pp} = {used} GPUs of {total}" + (f" on {r.host}" if r.replica else "")
    return Finding("service.gpus", "pass" if used == total else "warn",
                   what + (f" (attention DP {par.attn_dp} inside TP)" if par.attn_dp > 1 else ""),
                   remedy="" if used == total else "Idle GPUs: raise TP/PP, add a replica on the host, or lower hardware.gpu_count.")


def cross_checks(spec: Deployment, r: Rendered, quant_rep: Any = None) -> list[Finding]:
    out: list[Finding] = [gpus_finding(spec, r)]
    if spec.serving.env_file:
        out.append(env_file_finding(spec))
    kv = str(r.flags.get("kv-cache-dtype", "auto"))
    if quant_rep is not None:
        rec = quant_rep.recommended_flags.get("kv-cache-dtype")
        fp8 = (sglang_names.kv_dtype_name(kv) in sglang_names.FP8_KV
               or (kv == "auto" and quant_rep.kv_cache.auto_resolves_to.startswith("fp8")))
        if rec == "bf16" and fp8:
            out.append(Finding("service.kv_dtype", "fail",
                               f"--kv-cache-dtype {kv} keeps the FP8 KV cache {registry.notebook('quant_config')} flags",
                               detail=f"the checkpoint declares {quant_rep.kv_cache.declared} KV; k/v scales: "
                                      f"{quant_rep.kv_cache.scale_coverage}",
                               remedy="--arg kv-cache-dtype=bf16 to try it; then set serving.flags.kv-cache-dtype: bf16 (or "
                                      "serving.apply_recommended: true)."))
        else:
            out.append(Finding("service.kv_dtype", "pass", f"--kv-cache-dtype {kv} agrees with {registry.notebook('quant_config')}"))
    try:
        p = kv_stage.assess(spec.model_copy(update={"serving": spec.serving.model_copy(update={"flags": r.flags})}),
                              loaded=quant_rep.loaded if quant_rep is not None else None)
    except (InputError, SpecError) as e:
        return out + [Finding("service.capacity", "skip", "KV capacity not cross-checked", detail=str(e))]
    # A unit SGLang will not start (heads TP cannot split, a KV dtype the backend lacks) must not pass here
    # while the KV stage fails it: the same refusal, under this stage's name.
    for f in p.findings:
        if f.id == "kv.refused":
            out.append(Finding("service.kv_refused", "fail", f"{f.title} ({registry.notebook('kv_memory')})", detail=f.detail,
                               evidence=f.evidence, remedy=f.remedy))
    res = p.result
    ctx = r.flags.get("context-length")
    if res.max_total_num_tokens is not None and ctx is not None:
        ok = int(ctx) <= res.max_total_num_tokens
        out.append(Finding("service.context_length", "pass" if ok else "fail",
                           f"--context-length {int(ctx):,} {'fits' if ok else 'exceeds'} the KV pool of "
                           f"{res.max_total_num_tokens:,} tokens",
                           remedy="" if ok else "Lower --context-length or raise the KV budget."))
    mrr = r.flags.get("max-running-requests")
    if mrr is not None and res.max_running_requests is not None and res.max_running_requests < int(mrr):
        out.append(Finding("service.max_running_requests", "warn",
                           f"--max-running-requests {mrr} will be capped at {res.max_running_requests}",
                           detail=f"by the token pool or the linear-attention state slots ({registry.notebook('kv_memory')})",
                           remedy=f"Set it to {res.max_running_requests} so the unit says what the server does."))
    spec_frac = spec.serving.flags.get("mem-fraction-static")
    frac = r.flags.get("mem-fraction-static")
    if frac != spec_frac:
        out.append(Finding("service.mem_fraction", "warn", f"--mem-fraction-static {frac} differs from the spec's {spec_frac}",
                           detail=f"{registry.notebook('kv_memory')}'s capacity tables used the spec's value.",
                           remedy="Put the value in the spec so every notebook uses the same one."))
    elif frac is None:
        out.append(Finding("service.mem_fraction", "info", f"--mem-fraction-static unset: SGLang picks ≈{res.mem_fraction_static}",
                           detail=res.mem_fraction_source))
    return out


def env_file_finding(spec: Deployment) -> Finding:
    """serving.env_file (relative to the spec): there and 0600. systemd refuses to start a unit whose
    EnvironmentFile= (no '-' prefix) is missing: a fail on the serving host, a warn elsewhere."""
    path = spec.resolve_path(spec.serving.env_file or "")
    if not path.exists():
        here = os.path.isfile(spec.serving.python)
        return Finding("service.env_file", "fail" if here else "warn", f"{path} (serving.env_file) does not exist",
                       detail="The unit's EnvironmentFile= has no '-' prefix: systemd refuses to start it without the file"
                              + ("." if here else f"; {spec.serving.python} is not here either, so this may not be the serving host."),
                       remedy=f"Create {path} on the serving host (KEY=value lines, mode 0600), or fix serving.env_file "
                              "(a relative path is relative to the spec file).")
    mode = path.stat().st_mode & 0o777
    return Finding("service.env_file", "fail" if mode & 0o077 else "pass", f"{path} mode {mode:04o}",
                   remedy=f"chmod 600 {path}" if mode & 0o077 else "")


def check(spec: Deployment, args: dict[str, Any] | None = None, run: Callable = subprocess.run,
          built: Build | None = None) -> tuple[list[Rendered], list[Finding]]:
    """Every unit the spec renders (each replica or node rank, and the gateway's): systemd-analyze on each, SGLang's
    parser on each server's flags (one run for all), the gateway's own parser on the gateway's."""
    b = built or build(spec, args, with_quant=True)
    units = b.units
    python, findings = serving_python(spec)
    parsed = ([check_flags(units[0], python, run)] if len(units) == 1 else check_flags_many(units, python, run)) if python else []
    for i, r in enumerate(units):
        findings += parsed[i] if parsed else []
        findings += verify_unit(r, run)
    if spec.topology.gateway is not None:
        g = gateway.render_unit(spec)
        findings += gateway.check_gateway(spec, g, run) + verify_unit(g, run)
        units = [*units, g]
    findings += cross_checks(spec, b.unit, b.quant)
    return units, findings
