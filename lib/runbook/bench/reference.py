"""SGLang's own benchmark client (`sglang.benchmark.serving`) on the same server as ours, level by level: our output
tok/s beside its, to show that our client measures what SGLang's does.

SGLang's client runs in the interpreter that has SGLang (the serving interpreter, `make serving-env`), imported
once — the import alone takes half a minute on a loaded 2-core machine — and then fed one run per line on its
stdin. Both clients send the same shape of work: random token ids of a fixed length (SGLang's `random-ids` with
`--random-range-ratio 1.0`, our `random` workload), a fixed output length under ignore_eos, a closed loop at the
concurrency. The two alternate A B B A per level, so a drift in the machine's load between runs falls on both.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook.bench import run as bench
from runbook.bench.settings import BenchSettings
from runbook.bench.sweep import parse_prometheus
from runbook.bench.telemetry import pick_gauges
from runbook.core.errors import RunbookError
from runbook.endpoint.reach import get, model_name, run_sync

# Run in the serving interpreter: one job (SGLang's argv and its output file) per stdin line, one JSON result per
# stdout line. SGLang's client prints its report on stdout: that goes to stderr, so stdout carries only results.
_DRIVER = r"""
import contextlib, json, sys
out = sys.stdout
from sglang.benchmark import serving
print(json.dumps({"ready": True}), file=out, flush=True)
for line in sys.stdin:
    job = json.loads(line)
    sys.argv = ["sglang.benchmark.serving", *job["argv"]]
    try:
        with contextlib.redirect_stdout(sys.stderr):
            serving.cli_main()
        with open(job["out"]) as f:
            res = json.loads(f.read().splitlines()[-1])
    except BaseException as e:  # its argument parser exits; any failure is this job's result
        res = {"failed": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(res), file=out, flush=True)
"""


class ReferenceError_(RunbookError):
    """SGLang's benchmark client could not run as asked."""


class SGLangClient:
    """`sglang.benchmark.serving` kept imported in a child process of its own (its own session, waited for on close)."""

    def __init__(self, python: str | Path, start_timeout_s: float = 300.0):
        """`python`: an interpreter with SGLang installed (the deployment's serving.python)."""
        self.python = str(python)
        self._dir = tempfile.TemporaryDirectory(prefix="sglang-bench-")
        self._err = open(Path(self._dir.name) / "stderr.log", "w+")  # noqa: SIM115 - closed in close()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        try:
            self.proc = subprocess.Popen([self.python, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err, text=True, start_new_session=True, env=env)
        except OSError as e:
            self._err.close()
            self._dir.cleanup()
            raise ReferenceError_(f"SGLang's benchmark client: {self.python} does not run ({e.strerror})") from None
        self.runs = 0
        try:
            self._read(start_timeout_s, "import sglang.benchmark.serving")
        except BaseException:
            self.close(timeout_s=2)      # it never got going: nothing to let finish
            raise

    def tail(self) -> str:
        self._err.flush()
        lines = [ln.strip() for ln in Path(self._err.name).read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:]) or "(no output)"

    def _read(self, timeout_s: float, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else None
        if line is None:
            raise ReferenceError_(f"SGLang's benchmark client: {what} took over {timeout_s:.0f} s: {self.tail()}")
        if not line:
            rc = self.proc.wait(10)
            raise ReferenceError_(f"SGLang's benchmark client exited with {rc} during {what}: {self.tail()}")
        return json.loads(line)

    def submit(self, url: str, model: str, tokenizer: str | Path, concurrency: int, requests: int, input_len: int,
               output_len: int, seed: int = 0, warmup: int = 1) -> None:
        """Start one run of SGLang's client (sglang-oai backend: streamed /v1/completions, ignore_eos); `result()`
        waits for it."""
        self.runs += 1
        out = Path(self._dir.name) / f"run{self.runs}.jsonl"
        argv = ["--backend", "sglang-oai", "--base-url", url, "--model", model, "--tokenizer", str(tokenizer),
                "--dataset-name", "random-ids", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
                "--random-range-ratio", "1.0", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
                "--warmup-requests", str(warmup), "--seed", str(seed), "--disable-tqdm", "--output-file", str(out)]
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"argv": argv, "out": str(out)}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ReferenceError_(f"SGLang's benchmark client is gone: {self.tail()}") from None

    def result(self, timeout_s: float = 900.0) -> dict[str, Any]:
        """The submitted run's result line (`completed`, `duration`, `total_output_tokens`, `output_throughput`,
        `median_ttft_ms`, …)."""
        res = self._read(timeout_s, f"run {self.runs}")
        if "failed" in res:
            raise ReferenceError_(f"SGLang's benchmark client failed in run {self.runs}: {res['failed']}; {self.tail()}")
        return res

    def run(self, url: str, model: str, tokenizer: str | Path, concurrency: int, requests: int, input_len: int,
            output_len: int, seed: int = 0, warmup: int = 1, timeout_s: float = 900.0) -> dict[str, Any]:
        """One run of SGLang's client, waited for."""
        self.submit(url, model, tokenizer, concurrency, requests, input_len, output_len, seed, warmup)
        return self.result(timeout_s)

    def close(self, timeout_s: float = 15.0) -> None:
        """End its input and wait for it; SIGKILL to its session if it outlives `timeout_s`. Idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        for f in (self.proc.stdout, self._err):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._dir.cleanup()

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *a: object) -> None:
        self.close()


@dataclass
class SideBySide:
    concurrency: int
    ours: list[dict[str, Any]]        # our level summaries (bench.run), in run order
    theirs: list[dict[str, Any]]      # SGLang's result lines, in run order
    order: str                        # e.g. "OSSO": ours, SGLang's, SGLang's, ours

    def ours_tok_s(self) -> float:
        """Output tokens over the summed windows of our runs: the runs pooled, as if one."""
        return sum(s["output_tokens"] for s in self.ours) / sum(s["window_s"] for s in self.ours)

    def theirs_tok_s(self) -> float:
        return sum(r["total_output_tokens"] for r in self.theirs) / sum(r["duration"] for r in self.theirs)

    def ratio(self) -> float:
        return self.ours_tok_s() / self.theirs_tok_s()

    def row(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "order": self.order,
                "ours_output_tok_s": self.ours_tok_s(), "sglang_output_tok_s": self.theirs_tok_s(), "ratio": self.ratio(),
                "ours_runs_tok_s": [s["output_tok_s"] for s in self.ours],
                "sglang_runs_tok_s": [r["output_throughput"] for r in self.theirs],
                "ours_output_tokens": [s["output_tokens"] for s in self.ours],
                "sglang_output_tokens": [r["total_output_tokens"] for r in self.theirs],
                "ours_ttft_ms_p50": [s["ttft_ms"]["p50"] for s in self.ours],
                "sglang_ttft_ms_p50": [r["median_ttft_ms"] for r in self.theirs],
                "ours_tpot_ms_p50": [s["tpot_ms"]["p50"] for s in self.ours],
                "sglang_tpot_ms_p50": [r["median_tpot_ms"] for r in self.theirs]}


def _ours(o: BenchSettings) -> dict[str, Any]:
    """Our one random-workload level under `o` (its concurrency), without telemetry."""
    res = bench.run(o)
    if not res.summary["levels"] or not res.summary["levels"][0]["completed"]:
        raise ReferenceError_(f"our benchmark at concurrency {o.concurrency[0]} measured nothing: "
                              + "; ".join(f.title for f in res.findings if f.status in ("fail", "skip")))
    return res.summary["levels"][0]


def _running(url: str) -> float:
    _, body = get(url + "/metrics", timeout=10, max_bytes=64 << 20)
    return pick_gauges(parse_prometheus(body.decode("utf-8", "replace"))).get("num_running_reqs", 0.0)


def side_by_side(client: SGLangClient, url: str, tokenizer: str | Path, concurrency: list[int], requests: int, input_len: int,
                 output_len: int, model: str | None = None, seed: int = 0, together: bool = False,
                 start_timeout_s: float = 120.0) -> list[SideBySide]:
    """Per concurrency, the same work from both clients on the same server. Alternating (default): ours, SGLang's,
    SGLang's, ours (A B B A), each alone. `together`: both at once, each at that concurrency (the server sees twice
    it), ours started as soon as the server runs SGLang's first request — the machine's load, whatever it does,
    falls on both alike, so the ratio holds on a busy machine where runs alone vary several-fold. Needs the server's
    /metrics (num_running_reqs). `client`: SGLang's client, started by the caller and reused level after level."""
    model = model or run_sync(model_name(url, None))
    ours_at = BenchSettings(url=url, model=model, requests=requests, workload="random", input_len=input_len,
                            output_len=output_len, tokenizer=str(tokenizer), telemetry=False)
    out = []
    for c in concurrency:
        k0 = seed * 100 + c * 10
        if together:
            client.submit(url, model, tokenizer, c, requests, input_len, output_len, seed=k0, warmup=0)
            deadline = time.monotonic() + start_timeout_s
            while _running(url) < 1:
                if time.monotonic() > deadline:
                    raise ReferenceError_(f"SGLang's client sent nothing within {start_timeout_s:.0f} s: {client.tail()}")
                time.sleep(0.05)
            ours = [_ours(ours_at.model_copy(update={"concurrency": [c], "seed": k0 + 1, "warmup": 0}))]
            out.append(SideBySide(c, ours, [client.result()], "together"))
            continue
        ours, theirs = [], []
        for k, who in enumerate("OSSO"):
            if who == "O":
                ours.append(_ours(ours_at.model_copy(update={"concurrency": [c], "seed": k0 + k, "warmup": 1})))
            else:
                theirs.append(client.run(url, model, tokenizer, c, requests, input_len, output_len, seed=k0 + k))
        out.append(SideBySide(c, ours, theirs, "OSSO"))
    return out
