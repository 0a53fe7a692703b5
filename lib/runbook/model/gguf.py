"""A GGUF file's metadata (the header's key-value pairs, arrays left out): what the llama-server pre-check
needs to size the KV cache. Read by llama.cpp's own `gguf` package (GGUFReader maps the file, reads nothing more)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook.core.errors import InputError


def metadata(path: str | Path) -> dict[str, Any]:
    """The header's scalar and string values by key (arrays as None: token lists are not needed here);
    an InputError naming the file when it cannot be read or is not GGUF."""
    import gguf  # lazy: gguf and numpy behind it (~40 ms) only when a llama-server candidate is pre-checked

    p = Path(path)
    try:
        reader = gguf.GGUFReader(p)
        return {k: None if f.types and f.types[0] == gguf.GGUFValueType.ARRAY else f.contents()
                for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    except OSError as e:
        raise InputError(f"{p}: cannot read the model: {e.strerror or e}") from None
    except (ValueError, IndexError, KeyError, OverflowError) as e:
        raise InputError(f"{p}: not a GGUF model (cut short, corrupt or another format: {e}); "
                         "model.path must name a .gguf file") from None
