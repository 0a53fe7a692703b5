"""The model's tokenizer, when a tokenizer.json is on this machine (exact prompt lengths)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


def load_tokenizer(path: Optional[str | Path]) -> Any:
    """A `tokenizers.Tokenizer` from DIR/tokenizer.json (or the file itself); None when absent."""
    if not path:
        return None
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(f))
