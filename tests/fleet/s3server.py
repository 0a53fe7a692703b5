"""A real S3-compatible server process for the fleet tests: moto's standalone server on 127.0.0.1.

The client side is the real s3fs/botocore over HTTP. The server's request log (one line per answered
request, in the order answered) is kept, so tests can check which object was written last."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from runbook.core.ports import free_port  # the one picker: tune, the demo servers and the tests

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQ = re.compile(r'"(GET|PUT|POST|DELETE|HEAD) (\S+) HTTP/[\d.]+" (\d{3})')




class S3Server:
    def __init__(self, tmp: Path, port: int | None = None):
        self.tmp = tmp
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.requests: list[tuple[str, str, int]] = []      # (method, path, status), in answer order
        self.on_request: Callable[[str, str, int], None] | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a host sets: the endpoint and credentials of the store, nothing else (no ~/.aws here)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "AKIATESTFLEET", "AWS_SECRET_ACCESS_KEY": "fleet-test-secret-key",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(self.tmp / "no-aws-config"),
                "AWS_SHARED_CREDENTIALS_FILE": str(self.tmp / "no-aws-credentials"), "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self, timeout: float = 90) -> S3Server:
        self.requests = []
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=5).read()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"moto server not answering on {self.endpoint} after {timeout} s")

    def _drain(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = _REQ.search(_ANSI.sub("", line))
            if m:
                req = (m.group(1), m.group(2), int(m.group(3)))
                self.requests.append(req)
                if self.on_request:
                    self.on_request(*req)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(key="AKIATESTFLEET", secret="fleet-test-secret-key", client_kwargs={"endpoint_url": self.endpoint},
                                 skip_instance_cache=True, use_listings_cache=False)

    def make_bucket(self, name: str) -> None:
        self.fs().mkdir(name)
