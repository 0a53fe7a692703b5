"""How long `runbook fleet` takes over thousands of runs in an S3 store (moto's server on 127.0.0.1).

Uploads N synthetic completed runs (summary.json, summary.html, two notebook HTML files, _COMPLETE)
spread over hosts × deployments, then times the index: one listing, concurrent summary reads, build,
render. Prints the figures.

    .venv/bin/python benchmarks/fleet_index.py [--runs 3000] [--hosts 20] [--deployments 5] [--workers 64]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from runbook import fleet


def _server(port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2)
            return p
        except OSError:
            time.sleep(0.2)
    p.kill()
    raise SystemExit("moto server did not start")


def _summary(host: str, dep: str, i: int) -> dict:
    day, sec = divmod(i, 86400)
    code = 1 if i % 17 == 0 else 0
    return {"run_id": f"run{i:06d}-{dep}", "deployment": dep, "host": host,
            "started": f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}T{sec // 3600:02d}:00:00+00:00",
            "exit_code": code, "verdict": "checks failed" if code else "all notebooks ran, no check failed",
            "findings": {"pass": 40, "warn": 2, "fail": code, "skip": 3, "info": 5}, "git_commit": "0123456789ab",
            "notebooks": [{"name": f"{n}", "status": "ok", "duration_s": 3.2, "failed_findings":
                           ([{"id": "kv.fit", "status": "fail", "title": "context does not fit",
                              "remedy": "raise the pool"}] if code and n == "20_kv_memory" else [])}
                          for n in ("00_environment", "10_quant_config", "20_kv_memory", "30_service", "40_benchmark", "50_accuracy")],
            "metrics": {"kv_tokens_planned": 2034058, "kv_tokens_observed": 2034058 - i % 100,
                        "output_tok_s": {f"c{c}": 100.0 * c - i % 50 for c in (1, 2, 4, 8, 16, 32, 64)},
                        "max_concurrency_within_slo": 32, "recall": 0.95, "greedy_identical": 1.0}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--hosts", type=int, default=20)
    ap.add_argument("--deployments", type=int, default=5)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
    srv = _server(port)
    try:
        import s3fs

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"}, skip_instance_cache=True,
                               use_listings_cache=False)
        fs.mkdir("bench")
        t0 = time.perf_counter()
        batch: dict[str, bytes] = {}
        for i in range(a.runs):
            host, dep = f"gpu-{i % a.hosts:03d}", f"deploy-{(i // a.hosts) % a.deployments}"
            s = _summary(host, dep, i)
            base = f"bench/fleet/{host}/{s['run_id']}"
            batch[f"{base}/summary.json"] = json.dumps(s, indent=2).encode()
            for f in ("summary.html", "20_kv_memory.html", "40_benchmark.html"):
                batch[f"{base}/{f}"] = b"<html></html>"
            if len(batch) >= 2000:
                fs.pipe(batch)
                batch = {}
        if batch:
            fs.pipe(batch)
        fs.pipe({f"bench/fleet/gpu-{i % a.hosts:03d}/run{i:06d}-deploy-{(i // a.hosts) % a.deployments}/_COMPLETE": b"{}"
                 for i in range(a.runs)})
        print(f"populated {a.runs} runs ({a.runs * 5} objects) in {time.perf_counter() - t0:.1f} s")
        totals, lists, reads, builds, renders = [], [], [], [], []
        out = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
        for _ in range(a.repeat):
            t = time.perf_counter()
            fl = fleet.collect("s3://bench/fleet", workers=a.workers, fs=fs, root="bench/fleet")
            doc = fleet.build(fl)
            t_r = time.perf_counter()
            html, js = fleet.write(doc, out)
            renders.append(time.perf_counter() - t_r)
            totals.append(time.perf_counter() - t)
            lists.append(fl.timings["list_s"])
            reads.append(fl.timings["read_s"])
            builds.append(fl.timings["build_s"])
        med = statistics.median
        print(f"runs indexed: {doc['runs']} ({fl.objects_listed} objects listed), cells {len(doc['cells'])}, workers {a.workers}")
        print(f"list {med(lists):.2f} s, read summaries {med(reads):.2f} s ({doc['runs'] / med(reads):.0f} summaries/s), "
              f"build {med(builds) * 1000:.0f} ms, render+write {med(renders) * 1000:.0f} ms")
        print(f"total {med(totals):.2f} s (median of {a.repeat}); index.html {html.stat().st_size / 1024:.0f} KiB, "
              f"fleet.json {js.stat().st_size / 1024:.0f} KiB")
    finally:
        srv.kill()


if __name__ == "__main__":
    main()
