"""A real Prometheus beside the demo and the alert tests: Debian's prometheus-node-exporter (its textfile collector
only) serving a directory the runbook writes its metrics to, and Prometheus scraping it every second with the
shipped rules (deploy/prometheus/runbook.rules.yml), each rule's `for:` shortened so that an alert pends and fires
within seconds. Both on loopback, in a directory of their own; `stop()` ends them."""
from __future__ import annotations

import json
import os
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from runbook.core import oscalls, paths, ports
from runbook.core.errors import RunbookError

FOR = "2s"                # the shipped rules wait 5m before they page
EXPORTERS = ("prometheus-node-exporter", "node_exporter")
STOP_GRACE_S = 10.0       # SIGTERM, then SIGKILL to the group


class Missing(RunbookError):
    """Prometheus or node_exporter is not installed."""


def exe(*names: str) -> str:
    for n in names:
        found = shutil.which(n)
        if found:
            return found
    raise Missing(f"{names[0]} is not installed (Debian: apt-get install prometheus prometheus-node-exporter; "
                  ".ci/run installs both)")


def rules_file() -> Path:
    """The shipped rules: in the checkout's deploy/ (the wheel does not carry them)."""
    root = paths.repo_root()
    if root is None:
        raise Missing("the alert rules ship in the checkout's deploy/prometheus/, not in the wheel: run this from a checkout")
    return root / "deploy" / "prometheus" / "runbook.rules.yml"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def until(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    """probe() until it returns something truthy; bounded, with the last answer in the error."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            last = probe()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def shortened(rules: dict[str, Any]) -> dict[str, Any]:
    for g in rules["groups"]:
        for r in g["rules"]:
            r["for"] = FOR
    return rules


class Stack:
    """node_exporter and Prometheus in `workdir`: `textfiles` is the collector's directory. `rules`: a rules
    document instead of the shipped one (kept as given); `jobs`: scrape configs beside node_exporter's."""

    def __init__(self, workdir: Path, rules: dict[str, Any] | None = None, jobs: Sequence[dict[str, Any]] = ()):
        self.textfiles = workdir / "textfile"
        self.textfiles.mkdir(parents=True, exist_ok=True)
        self.node_port, self.prom_port = ports.free_port(), ports.free_port()
        doc = rules or shortened(yaml.safe_load(rules_file().read_text()))
        (workdir / "rules.yml").write_text(yaml.safe_dump(doc))
        conf = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(workdir / "rules.yml")],
                "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{self.node_port}"]}]},
                                   *jobs]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(conf))
        node, prom = exe(*EXPORTERS), exe("prometheus")
        # through the OS layer: each in a session of its own, killed by the kernel if the demo or the test dies
        self.logs = [open(workdir / "node.log", "w"), open(workdir / "prometheus.log", "w")]  # noqa: SIM115 (stop() closes)
        self.procs = [
            oscalls.SessionChild(node, [node, f"--web.listen-address=127.0.0.1:{self.node_port}", "--collector.disable-defaults",
                                        "--collector.textfile", f"--collector.textfile.directory={self.textfiles}"],
                                 self.logs[0].fileno(), os.environ),
            oscalls.SessionChild(prom, [prom, f"--config.file={workdir / 'prometheus.yml'}",
                                        f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.prom_port}"],
                                 self.logs[1].fileno(), os.environ),
        ]
        self.api = f"http://127.0.0.1:{self.prom_port}/api/v1"
        try:
            until("Prometheus ready",
                  lambda: urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}/-/ready", timeout=2).status == 200)
        except BaseException:
            self.stop()
            raise

    def get(self, path: str) -> Any:
        return get_json(f"{self.api}/{path}")

    def query(self, q: str) -> list[dict[str, Any]]:
        return list(self.get(f"query?query={urllib.parse.quote(q)}")["data"]["result"])

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        return [a for a in self.get("alerts")["data"]["alerts"] if a["labels"]["alertname"] == name and a["state"] == state]

    def stop(self) -> None:
        for p in self.procs:
            p.stop(STOP_GRACE_S)
        for f in self.logs:
            f.close()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *a: object) -> None:
        self.stop()
