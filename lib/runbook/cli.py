"""`python -m runbook VERB`: flags -> the same library call a notebook makes -> an exit code.

Exit codes (stable, for cron): 0 ok; 1 a check failed; 2 could not run (bad input, a notebook
errored); 75 another run of the deployment holds the lock.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from runbook.core.errors import LockHeld, RunbookError
from runbook.core.findings import exit_code, format_text
from runbook.core.fsutil import atomic_write_text


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors naming the option (cron logs; no usage block)."""

    def error(self, message: str) -> Any:
        m = re.match(r"argument ([^:]+): (.*)$", " ".join(message.split()))
        if m:
            opt, msg = m.groups()
            opt = opt.split("/")[-1]   # "-h/--help" style: the long form
            message = f"{opt} {msg}" if msg.startswith("must ") else f"{opt}: {msg}"
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int(lo: int) -> Callable[[str], int]:
    def parse(s: str) -> int:
        try:
            v = int(s.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer (got {s!r})") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo} (got {v})")
        return v
    parse.__name__ = "int"
    return parse


def _float(lo: float = 0.0, hi: float = math.inf, lo_ok: bool = False, hi_ok: bool = True) -> Callable[[str], float]:
    if lo == 0 and not lo_ok and hi == math.inf:
        want = "positive"
    else:
        want = f"in {'[' if lo_ok else '('}{lo:g}, {hi:g}{']' if hi_ok else ')'}"

    def parse(s: str) -> float:
        try:
            v = float(s.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number (got {s!r})") from None
        if not math.isfinite(v) or v < lo or v > hi or (v == lo and not lo_ok) or (v == hi and not hi_ok):
            raise argparse.ArgumentTypeError(f"must be {want} and finite (got {s.strip()})")
        return v
    parse.__name__ = "float"
    return parse


def _list(item: Callable[[str], Any]) -> Callable[[str], list]:
    """A comma-separated list, each item parsed (and bounded) by `item`."""
    def parse(s: str) -> list:
        parts = _csv(s)
        if not parts:
            raise argparse.ArgumentTypeError(f"must be a comma-separated list of values (got {s!r})")
        out = []
        for x in parts:
            try:
                out.append(item(x))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{e} in {s!r}" if len(parts) > 1 else str(e)) from None
        return out
    parse.__name__ = "list"
    return parse


def _url(s: str) -> str:
    """An http(s) URL with a host, e.g. http://127.0.0.1:30000."""
    bad = argparse.ArgumentTypeError(f"must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:30000 (got {s!r})")
    if not s or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in s):
        raise bad
    try:
        u = urlsplit(s)
        u.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise bad from None
    if u.scheme.lower() not in ("http", "https") or not u.hostname:
        raise bad
    return s


def _names(s: str) -> str:
    if not _csv(s):
        raise argparse.ArgumentTypeError(f"must name at least one notebook (got {s!r})")
    return s


_POS_INT = _int(1)
_POS_FLOAT = _float()


def _add_deployment(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deployment", metavar="FILE", help="deployment spec (default: deployments/qwen3.5-397b-a17b-nvfp4.yaml)")


def _add_output(p: argparse.ArgumentParser, what: str = "the report") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON")
    p.add_argument("--strict", action="store_true", help="warn and skip findings also give exit 1")


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _cmd_run(a: argparse.Namespace) -> int:
    from runbook.runner.run import RunOptions, run

    only = [n for chunk in a.only for n in _csv(chunk)]
    opts = RunOptions(deployment=a.deployment, only=only, params=a.param, out=Path(a.out), timeout=a.timeout,
                      run_timeout=a.run_timeout, keep=a.keep, strict=a.strict, kernel=a.kernel, archive_url=a.archive_url)
    if a.notebooks:
        opts.notebooks_dir = Path(a.notebooks)
    code, _ = run(opts)
    return code


def _archive_url(s: str) -> str:
    from runbook.core.spec import archive_url_problem

    problem = archive_url_problem(s)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return s


def _cmd_push(a: argparse.Namespace) -> int:
    from runbook.runner.run import push

    res = push(Path(a.out), a.archive_url, a.deployment, a.run, everything=True)
    if a.json:
        print(json.dumps([r.__dict__ for r in res], indent=2))
    else:
        for r in res:
            print(f"{'uploaded' if r.ok else 'FAILED  '} {r.run_id} -> {r.url}" + ("" if r.ok else f" ({r.error})"))
        if not res:
            print("nothing to upload: every run is in the store")
    return 0 if all(r.ok for r in res) else 1


def _cmd_fleet(a: argparse.Namespace) -> int:
    from runbook import fleet
    from runbook.runner.upload import open_store

    fs, root = open_store(a.source)
    fl = fleet.collect(a.source, workers=a.workers, fs=fs, root=root)
    doc = fleet.build(fl, trend=a.trend, links=a.links, link_base=a.link_base, expires=int(a.expires), fs=fs)
    html, js = fleet.write(doc, Path(a.out))
    if a.publish:
        fs.pipe_file(f"{root}/index.html", html.read_bytes())
        fs.pipe_file(f"{root}/fleet.json", js.read_bytes())
    if a.json:
        print(js.read_text())
    else:
        print(f"{doc['runs']} completed runs, {len(doc['hosts'])} hosts, {len(doc['deployments'])} deployments "
              f"({fl.objects_listed} objects listed in {fl.timings['list_s']:.2f} s, summaries read in {fl.timings['read_s']:.2f} s)")
        print(f"Index: {html}\nJSON:  {js}" + (f"\nPublished: {a.source.rstrip('/')}/index.html" if a.publish else ""))
    return 0


def _cmd_env(a: argparse.Namespace) -> int:
    from runbook import env
    from runbook.core import spec

    rep = env.evaluate(spec.load(a.deployment))
    _emit(a, rep.findings, rep.to_dict())
    return exit_code(rep.findings, a.strict)


def _cmd_quant(a: argparse.Namespace) -> int:
    from runbook import quant
    from runbook.core import spec
    from runbook.model import checkpoint

    if a.deployment or not a.model_dir:
        rep = quant.evaluate(spec.load(a.deployment), a.model_dir)
    else:
        rep = quant.inspect(checkpoint.load(a.model_dir))
    _emit(a, rep.findings, rep.to_json())
    return exit_code(rep.findings, a.strict)


def _cc(v: str) -> str:
    import re

    if not re.fullmatch(r"\d{1,2}\.\d", v.strip()):
        raise argparse.ArgumentTypeError(f"{v!r}: a compute capability looks like 9.0 or 12.0")
    return v.strip()


def _cmd_kv(a: argparse.Namespace) -> int:
    from runbook import kv
    from runbook.core import spec

    dep = spec.load(a.deployment) if (a.deployment or not a.model_dir) else None
    ctx = a.contexts or None
    p = kv.evaluate(dep, a.model_dir, tp=a.tp, pp=a.pp, attn_dp=a.attn_dp, kv_dtype=a.kv_dtype, gpu_mem_gib=a.gpu_mem_gib,
                    weights_gib=a.weights_gib, mem_fraction_static=a.mem_fraction_static, kv_budget_gib=a.kv_budget_gib,
                    page_size=a.page_size, context_len=a.context_len, contexts=ctx,
                    spec_algorithm=a.speculative_algorithm, spec_num_steps=a.speculative_num_steps,
                    spec_eagle_topk=a.speculative_eagle_topk, spec_num_draft_tokens=a.speculative_num_draft_tokens,
                    mamba_ssm_dtype=a.mamba_ssm_dtype, max_running_requests=a.max_running_requests,
                    attention_backend=a.attention_backend, compute_capability=a.compute_capability)
    if a.json:
        print(json.dumps(p.to_json(), indent=2, default=str))
    else:
        print(kv.text_table(p))
        print(format_text(p.findings, colour=sys.stdout.isatty()))
    return exit_code(p.findings, a.strict)


def _cmd_service(a: argparse.Namespace) -> int:
    from runbook import service
    from runbook.core import spec

    dep = spec.load(a.deployment)
    args = service.parse_args(a.arg)
    if a.action == "report":
        rep = service.evaluate(dep, args, a.installed, a.url)
        _emit(a, rep.findings, rep.to_json())
        return exit_code(rep.findings, a.strict)
    if a.action == "check":
        _, findings = service.check(dep, args)
        _emit(a, findings, {"findings": [f.to_dict() for f in findings]})
        return exit_code(findings, a.strict)
    if a.action == "drift":
        rows, findings, info = service.drift(dep, a.url, args)
        _emit(a, findings, {"differences": rows, "server": info, "findings": [f.to_dict() for f in findings]})
        return exit_code(findings, a.strict)
    units = service.build(dep, args).units
    if a.action == "render":
        if a.out:
            out = Path(a.out)
            for u in units:
                target = out if len(units) == 1 else out / f"{u.unit_name}.service"
                atomic_write_text(target, u.text)
                print(f"wrote {target}", file=sys.stderr)
        if a.json:
            print(json.dumps({"units": [{"unit": u.unit_name, "node": u.node, "argv": u.argv, "text": u.text} for u in units]}, indent=2))
        elif not a.out:
            print("\n".join(u.text for u in units), end="")
        return 0
    if a.action == "diff":
        text, rows, findings = service.diff(units[0], Path(a.installed or dep.systemd.installed_path))
        if a.json:
            print(json.dumps({"diff": text, "changes": rows, "findings": [f.to_dict() for f in findings]}, indent=2))
        else:
            print(text or format_text(findings, colour=sys.stdout.isatty()))
        return exit_code(findings, a.strict)
    res = service.install(dep, units[0], dry_run=not a.yes, root=Path(a.root) if a.root else None,
                          systemctl=a.systemctl.split() if a.systemctl else ("systemctl",), ready_url=a.ready_url,
                          ready_timeout=a.ready_timeout, log=lambda m: print(m, file=sys.stderr))
    _emit(a, res.findings, {"steps": res.steps, "rolled_back": res.rolled_back, "backup": res.backup,
                            "findings": [f.to_dict() for f in res.findings]})
    return exit_code(res.findings, a.strict)


def _cmd_bench(a: argparse.Namespace) -> int:
    from runbook import bench
    from runbook.core import spec

    dep = spec.load(a.deployment)
    o = bench.options_from(dep, a.url, model=a.model, concurrency=a.concurrency or None,
                           rates=a.rate or None, requests=a.requests, duration_s=a.duration,
                           workload=a.workload, input_len=a.input_len, output_len=a.output_len, chat=a.chat or None,
                           tokenizer=a.tokenizer, warmup=a.warmup, out=Path(a.out) if a.out else None, seed=a.seed,
                           compare_url=a.compare_url, timeout_s=a.timeout, flush=a.flush_cache or None,
                           progress=sys.stderr.isatty(), turns=a.turns, think_time_s=a.think_time,
                           think_dist=a.think_dist, tool_result_len=a.tool_result_len, trace_speed=a.trace_speed,
                           find_max=a.find_max, workers=a.workers, transport=a.transport)
    if a.duration and not a.requests:
        o.requests = 100000  # bounded by --duration instead
    res = bench.evaluate(dep, o, archive_root=None if a.archive == "" else Path(a.archive))
    if a.json:
        doc = dict(res.summary, findings=[f.to_dict() for f in res.findings])
        print(json.dumps(doc, indent=2, default=str))
    else:
        if res.summary.get("levels"):
            print(bench.frame(res.summary).to_string())
        print(format_text(res.findings, colour=sys.stdout.isatty()))
    return exit_code(res.findings, a.strict)


def _cmd_accuracy(a: argparse.Namespace) -> int:
    from runbook import accuracy
    from runbook.accuracy import kvquant, probes
    from runbook.core import spec

    dep = spec.load(a.deployment)
    lengths = a.lengths or None
    depths = a.depths or None
    if a.probe == "report":
        rep = accuracy.evaluate(dep, a.url, a.compare_url, a.spec_off_url, lengths, depths, a.tokenizer, a.seed,
                                a.per_cell, a.out, a.prompts, a.max_tokens, tool_choice=a.tool_choice)
        _emit(a, rep.findings, rep.to_json())
        return exit_code(rep.findings, a.strict)
    doc: dict[str, Any]
    if a.probe == "kvquant":
        st = kvquant.run(dep.accuracy, active=probes.deployment_format(dep))
        findings, doc = st.findings, {"kvquant": st.to_json()}
    elif a.probe == "recall":
        url = a.url or dep.serving.local_url
        rec, findings = probes.run_recall(url, probes.recall_lengths(dep, lengths), depths or list(dep.accuracy.recall_depths),
                                          a.tokenizer, a.compare_url, a.seed, a.per_cell, Path(a.out) if a.out else None,
                                          dep.serving.api_key_env)
        doc = {"recall": rec}
    elif a.probe == "toolcall":
        import os

        from runbook.accuracy import toolcall

        key = os.environ.get(dep.serving.api_key_env) if dep.serving.api_key_env else None
        tc = toolcall.run(a.url or dep.serving.local_url, a.model, key or None, tool_choice=a.tool_choice)
        findings, doc = tc.findings, tc.to_json()
    else:
        rows, findings = probes.run_identity(a.url, a.compare_url, a.prompts, a.max_tokens, a.tokenizer)
        doc = {"identity": rows}
    doc["findings"] = [f.to_dict() for f in findings]
    _emit(a, findings, doc)
    return exit_code(findings, a.strict)


def _since(s: str) -> str:
    from runbook.verify.logsource import parse_since

    try:
        parse_since(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a time: {e}") from None
    return s.strip()


def _cmd_verify(a: argparse.Namespace) -> int:
    from runbook import verify
    from runbook.core import spec

    dep = spec.load(a.deployment)
    # the same default as notebook 35: the spec's own host:port (no server there is a skip finding)
    rep = verify.evaluate(dep, log=a.log, unit=a.unit, url=a.url or dep.serving.local_url, since=a.since)
    if a.json:
        print(json.dumps(rep.to_json(), indent=2, default=str))
    else:
        print(verify.text_table(rep))
        print(format_text(rep.findings, colour=sys.stdout.isatty()))
    return exit_code(rep.findings, a.strict)


def _emit(a: argparse.Namespace, findings: list, doc: dict) -> None:
    if a.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(format_text(findings, colour=sys.stdout.isatty()))


def build_parser() -> argparse.ArgumentParser:
    from runbook.runner.run import OUTPUTS

    p = _Parser(prog="runbook", description="SGLang deployment runbooks: checks, archive, reports.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    r = sub.add_parser("run", help="execute the notebooks with papermill and archive the run")
    _add_deployment(r)
    r.add_argument("--only", action="append", default=[], type=_names, metavar="NAME[,NAME]", help="run only these notebooks (e.g. environment,kv_memory)")
    r.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="set a notebook parameter, typed by its parameters cell")
    r.add_argument("--out", default=str(OUTPUTS), metavar="DIR", help="archive root (default: outputs/)")
    r.add_argument("--timeout", type=_POS_FLOAT, default=1800, metavar="SECONDS", help="bound per notebook (default 1800)")
    r.add_argument("--run-timeout", type=_POS_FLOAT, default=7200, metavar="SECONDS", help="bound for the whole run (default 7200)")
    r.add_argument("--keep", type=_POS_INT, default=None, metavar="N", help="keep only this deployment's N newest runs")
    r.add_argument("--strict", action="store_true", help="warn and skip findings also give exit 1")
    r.add_argument("--notebooks", default=None, metavar="DIR", help=argparse.SUPPRESS)
    r.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's, run in this venv)")
    r.add_argument("--archive-url", type=_archive_url, default=None, metavar="URL",
                   help="also upload the run to s3://BUCKET/PREFIX/<host>/<run id>/ (default: $RUNBOOK_ARCHIVE_URL, else the spec's archive.url)")
    r.set_defaults(fn=_cmd_run)

    e = sub.add_parser("env", help="GPU, driver, serving-environment and host checks")
    _add_deployment(e)
    _add_output(e)
    e.set_defaults(fn=_cmd_env)

    q = sub.add_parser("quant", help="what SGLang will do with a checkpoint's weight and KV-cache quantization")
    q.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="checkpoint dir or cached HF repo id (default: the deployment's model)")
    _add_deployment(q)
    _add_output(q)
    q.set_defaults(fn=_cmd_quant)

    k = sub.add_parser("kv", help="KV-cache and state memory per GPU, the way SGLang sizes its pools")
    k.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="checkpoint or model-card dir (default: the deployment's model)")
    _add_deployment(k)
    k.add_argument("--tp", type=_POS_INT, help="tensor parallel size (default: the spec's, else 1)")
    k.add_argument("--pp", type=_POS_INT, help="pipeline parallel size")
    k.add_argument("--attn-dp", type=_POS_INT, help="attention data parallel size")
    k.add_argument("--kv-dtype", help="auto, bf16, fp8_e4m3, fp8_e5m2, mxfp8, nvfp4, fp4_mx_block16")
    k.add_argument("--gpu-mem-gib", type=_POS_FLOAT, help="memory per GPU")
    k.add_argument("--weights-gib", type=_POS_FLOAT, help="weights per GPU (default: from the checkpoint)")
    k.add_argument("--mem-fraction-static", type=_float(0, 1), help="default: the spec's flag, else SGLang's heuristic")
    k.add_argument("--kv-budget-gib", type=_POS_FLOAT, help="KV+state budget per GPU, skipping the memory arithmetic")
    k.add_argument("--page-size", type=_POS_INT)
    k.add_argument("--context-len", type=_POS_INT, help="default: the spec's --context-length, else the model's")
    k.add_argument("--contexts", type=_list(_POS_INT), help="context lengths to fit, e.g. 8192,32768,131072,262144")
    k.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"],
                   help="what-if speculative decoding (NEXTN: the checkpoint's own MTP layers)")
    k.add_argument("--speculative-num-steps", type=_POS_INT)
    k.add_argument("--speculative-eagle-topk", type=_POS_INT)
    k.add_argument("--speculative-num-draft-tokens", type=_POS_INT)
    k.add_argument("--mamba-ssm-dtype", choices=["float32", "bfloat16", "float16"], help="hybrid models' SSM state dtype")
    k.add_argument("--max-running-requests", type=_POS_INT)
    k.add_argument("--attention-backend", help="SGLang attention backend (moves the prefill graph reserve and page size)")
    k.add_argument("--compute-capability", type=_cc, help="GPU compute capability, e.g. 9.0 (H200), 10.0 (B200), 12.0 (RTX PRO 6000)")
    _add_output(k)
    k.set_defaults(fn=_cmd_kv)

    sv = sub.add_parser("service", help="render, check, diff, install or drift-check the systemd unit")
    sv.add_argument("action", choices=["render", "check", "diff", "install", "drift", "report"],
                    help="report: check + diff + install plan + drift, what 30_service shows")
    _add_deployment(sv)
    sv.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE", help="add or override one SGLang flag (what-if)")
    sv.add_argument("--out", metavar="FILE", help="render: write the unit here (a directory for multi-node)")
    sv.add_argument("--installed", metavar="FILE", help="diff, report: the installed unit (default: systemd.unit_path or /etc/systemd/system/<name>.service)")
    sv.add_argument("--yes", action="store_true", help="install: really do it (default: dry run)")
    sv.add_argument("--root", metavar="DIR", help="install: prefix for the unit path (testing, chroots)")
    sv.add_argument("--systemctl", metavar="CMD", help="install: systemctl command to use")
    sv.add_argument("--ready-url", metavar="URL", type=_url, help="install: readiness URL (default: http://host:port + systemd.ready_path)")
    sv.add_argument("--ready-timeout", type=_POS_FLOAT, metavar="S", help="install: readiness timeout (default: systemd.timeout_start_sec)")
    sv.add_argument("--url", metavar="URL", type=_url, help="drift, report: server base URL (default: http://host:port from the spec)")
    _add_output(sv)
    sv.set_defaults(fn=_cmd_service)

    b = sub.add_parser("bench", help="benchmark a running OpenAI-compatible server (SGLang, or llama-server for demos)")
    b.add_argument("--url", type=_url, help="server base URL (default: the spec's host:port)")
    _add_deployment(b)
    b.add_argument("--model", help="model name to send (default: the server's first /v1/models entry)")
    b.add_argument("--concurrency", type=_list(_POS_INT), metavar="1,2,4,...", help="fixed-concurrency levels (default: the spec's plan)")
    b.add_argument("--rate", type=_list(_POS_FLOAT), metavar="R,...", help="Poisson request-rate levels (requests/s)")
    g = b.add_mutually_exclusive_group()
    g.add_argument("--requests", type=_POS_INT, metavar="N", help="measured requests per level")
    g.add_argument("--duration", type=_POS_FLOAT, metavar="S", help="measure each level for S seconds")
    b.add_argument("--workload", help="random | code | longctx | prefix | agentic | trace:FILE (Mooncake JSONL; trace:synthetic) | FILE.jsonl")
    b.add_argument("--turns", type=_POS_INT, metavar="T", help="agentic: turns per session (default 4)")
    b.add_argument("--think-time", type=_float(lo_ok=True), metavar="S", help="agentic: pause between turns (default 0)")
    b.add_argument("--think-dist", choices=["fixed", "exp"], help="agentic: think time fixed, or exponential with that mean")
    b.add_argument("--tool-result-len", type=_int(0), metavar="N", help="agentic: synthetic tool-result tokens per turn (default 256)")
    b.add_argument("--trace-speed", type=_POS_FLOAT, metavar="X", help="trace:FILE: replay X times as fast (default 1)")
    b.add_argument("--find-max", choices=["slo"], help="slo: bracket then bisect concurrency (or --rate START) for the "
                   "highest load meeting the spec's SLOs, instead of the fixed levels")
    b.add_argument("--workers", type=_POS_INT, metavar="N", help="load-generator processes for fixed-concurrency levels "
                   "(default 1): each takes every N-th request and a share of the concurrency, one clock, records merged")
    b.add_argument("--transport", choices=["h1", "aiohttp"], help="HTTP client for the streamed requests: "
                   "h1 (asyncio protocol over httptools, parsed as bytes arrive; default) or aiohttp")
    b.add_argument("--input-len", type=_POS_INT, metavar="N")
    b.add_argument("--output-len", type=_POS_INT, metavar="N")
    b.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    b.add_argument("--tokenizer", metavar="DIR", help="dir with tokenizer.json for exact lengths and client token counts")
    b.add_argument("--warmup", type=_int(0), metavar="N", help="warm-up requests per level")
    b.add_argument("--out", metavar="DIR", help="write records.jsonl and summary.json here")
    b.add_argument("--compare-url", metavar="URL", type=_url, help="A/B: the same workload against this second endpoint")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--timeout", type=_POS_FLOAT, default=600.0, metavar="S", help="per-request timeout")
    b.add_argument("--flush-cache", action="store_true",
                   help="POST /flush_cache before each level (default: the spec's benchmark.flush_cache, off)")
    b.add_argument("--archive", default=str(OUTPUTS), metavar="DIR",
                   help="compare with this deployment's newest benchmark archived here (default: outputs/; '' to skip)")
    _add_output(b)
    b.set_defaults(fn=_cmd_bench)

    ac = sub.add_parser("accuracy", help="KV-quantization error offline; long-context recall, greedy identity and tool calls live")
    ac.add_argument("probe", choices=["kvquant", "recall", "identity", "report", "toolcall"],
                    help="report: all four, what 50_accuracy shows (live probes skip without --url)")
    _add_deployment(ac)
    ac.add_argument("--url", type=_url, help="recall: the endpoint (default: the spec's); identity: speculative decoding on")
    ac.add_argument("--compare-url", type=_url, help="recall, report: A/B second endpoint (e.g. BF16 KV); identity: speculative decoding off")
    ac.add_argument("--spec-off-url", type=_url, help="report: the same model with speculative decoding off (greedy identity)")
    ac.add_argument("--lengths", type=_list(_POS_INT), metavar="N,...", help="recall: haystack token lengths (default: the spec's, up to --context-length)")
    ac.add_argument("--depths", type=_list(_float(0, 1, lo_ok=True)), metavar="F,...", help="recall: needle depths as fractions (default: the spec's)")
    ac.add_argument("--per-cell", type=_POS_INT, default=1, help="recall: needles per length × depth cell")
    ac.add_argument("--tokenizer", metavar="DIR", help="dir with tokenizer.json: exact prompt lengths")
    ac.add_argument("--seed", type=int, default=0)
    ac.add_argument("--prompts", type=_POS_INT, default=8, help="identity: number of prompts")
    ac.add_argument("--max-tokens", type=_POS_INT, default=64, help="identity: greedy tokens per prompt")
    ac.add_argument("--model", help="toolcall: the served model name (default: the first /v1/models lists)")
    ac.add_argument("--tool-choice", choices=["auto", "required"], default="auto",
                    help="toolcall, report: auto (default: what agent loops send) or required (the server must call a "
                         "tool; prose is then a fail: the chat template or parser ignores the tools)")
    ac.add_argument("--out", metavar="DIR", help="recall, report: archive the prompts here")
    _add_output(ac)
    ac.set_defaults(fn=_cmd_accuracy)

    vf = sub.add_parser("verify", help="the running server against the plan: its start-up log and /server_info")
    _add_deployment(vf)
    src = vf.add_mutually_exclusive_group()
    src.add_argument("--log", metavar="FILE", help="a saved server log (default: the unit's journal)")
    src.add_argument("--unit", metavar="NAME", help="systemd unit whose journal to read (default: the spec's systemd.unit_name)")
    vf.add_argument("--url", type=_url, help="compare /server_info of this server (default: the spec's host:port)")
    vf.add_argument("--since", type=_since, metavar="TIME", help="read from this time, e.g. '2026-01-05 10:00' (default: the unit's last start)")
    _add_output(vf)
    vf.set_defaults(fn=_cmd_verify)

    pu = sub.add_parser("push", help="upload local runs that are not yet in the archive store (what a failed upload left)")
    _add_deployment(pu)
    pu.add_argument("--out", default=str(OUTPUTS), metavar="DIR", help="archive root (default: outputs/)")
    pu.add_argument("--archive-url", type=_archive_url, default=None, metavar="URL",
                    help="s3://BUCKET/PREFIX (default: $RUNBOOK_ARCHIVE_URL, else the spec's archive.url)")
    pu.add_argument("--run", action="append", default=[], metavar="RUN_ID", help="upload exactly this run (again); repeatable")
    pu.add_argument("--json", action="store_true", help="print the uploads as JSON")
    pu.set_defaults(fn=_cmd_push)

    fl = sub.add_parser("fleet", help="one static index of every host's runs in an archive store")
    fl.add_argument("--from", dest="source", required=True, type=_archive_url, metavar="URL", help="s3://BUCKET/PREFIX the hosts upload to")
    fl.add_argument("--out", default="fleet", metavar="DIR", help="write index.html and fleet.json here (default: fleet/)")
    fl.add_argument("--links", choices=["relative", "presigned"], default="relative",
                    help="run links relative to PREFIX (the page served from the store; see --publish) or presigned URLs")
    fl.add_argument("--link-base", type=_url, default=None, metavar="URL", help="relative links under this base, e.g. https://runbooks.example.com/fleet")
    fl.add_argument("--expires", type=_float(1, 7 * 86400), default=7 * 86400, metavar="S", help="presigned links' lifetime (default and max 7 days)")
    fl.add_argument("--trend", type=_POS_INT, default=30, metavar="N", help="runs per host and deployment in the trends (default 30)")
    fl.add_argument("--workers", type=_int(1), default=64, metavar="N", help="summaries read concurrently (default 64)")
    fl.add_argument("--publish", action="store_true", help="also write index.html and fleet.json to PREFIX/ in the store")
    fl.add_argument("--json", action="store_true", help="print the fleet JSON")
    fl.set_defaults(fn=_cmd_fleet)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    try:
        return fn(args)
    except LockHeld as e:
        print(f"runbook: {e}", file=sys.stderr)
        return 75
    except RunbookError as e:
        print(f"runbook: error: {e}", file=sys.stderr)
        return 2
