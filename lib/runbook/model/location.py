"""Where a deployment's model files are on this machine (offline: never downloads)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from runbook.core.spec import Deployment

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelLocation:
    path: Path | None  # directory holding config.json, or None
    kind: str             # "local" | "hf-snapshot" | "card" | "missing"
    note: str

    @property
    def has_weights(self) -> bool:
        return self.path is not None and self.kind != "card" and any(self.path.glob("*.safetensors"))


def looks_like_repo_id(s: str) -> bool:
    return bool(_REPO_ID.match(s)) and not os.path.exists(s)


def hf_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The local snapshot of a Hugging Face repo in the HF cache, without touching the network."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a pinned requirement
        return None
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    except Exception:  # a malformed cache must not break the check
        return None


def locate(spec: Deployment) -> ModelLocation:
    """model.path as a local dir, else its HF snapshot, else the spec's model card."""
    m = spec.model
    local = spec.resolve_path(m.path)
    if local.is_dir():
        return ModelLocation(local, "local", f"checkpoint directory {local}")
    if looks_like_repo_id(m.path):
        snap = hf_snapshot(m.path, m.revision)
        if snap is not None:
            return ModelLocation(snap, "hf-snapshot", f"Hugging Face snapshot of {m.path} at {snap}")
    missing = f"{m.path} is neither a local directory nor a cached Hugging Face snapshot"
    if m.card:
        card = spec.resolve_path(m.card)
        if card.is_dir():
            return ModelLocation(card, "card",
                                 f"{m.path} is not on this machine; inspecting the model card {card} (configs only, no weights)")
        # the card is what the user pointed at: name it and where a relative one landed
        where = m.card if str(card) == m.card else f"{m.card} (resolved to {card})"
        return ModelLocation(None, "missing", f"model.card {where} {'is a file, not a directory' if card.exists() else 'does not exist'}, "
                                              f"and model.path {missing}")
    return ModelLocation(None, "missing", f"model.path {missing}")
