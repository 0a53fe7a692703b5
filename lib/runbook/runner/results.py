"""A notebook's results file: its findings plus named data, read back by the runner and the index."""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runbook.core.findings import Finding
from runbook.core.fsutil import atomic_write_json

SCHEMA = "runbook.results/1"


def save(path: str | Path, notebook: str, findings: Iterable[Finding], deployment: str | None = None, **data: Any) -> Path:
    """Write results JSON atomically: {schema, notebook, deployment, generated, findings, data}."""
    doc = {
        "schema": SCHEMA,
        "notebook": notebook,
        "deployment": deployment,
        "generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "findings": [f.to_dict() for f in findings],
        "data": data,
    }
    return atomic_write_json(path, doc)


def load(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    doc["findings"] = [Finding.from_dict(f) for f in doc.get("findings", [])]
    return doc
