"""What notebook 10 and `runbook quant` show: the weights and KV-cache tables, the flags to set. Each takes the stage's
report and returns None for an empty one (an input error: `registry.display`)."""
from __future__ import annotations

from typing import Any

from runbook.core.registry import display
from runbook.core.units import GIB


@display
def weights_frame(rep: Any):
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    w = rep.weights
    return pd.Series({"algorithm": w.algo, "method": w.quant_method, "producer": f"{w.producer or ''} {w.producer_version or ''}".strip(),
                      "group size": w.group_size, "block size": w.block_size, "config read from": w.source,
                      "kept in higher precision": ", ".join(w.kept_precision_kinds) or "—",
                      "total GiB": w.total_bytes and round(w.total_bytes / GIB, 1),
                      "per GPU GiB": w.bytes_per_gpu and round(w.bytes_per_gpu / GIB, 1)}, name="weights", dtype=object).to_frame()


@display
def kv_cache_frame(rep: Any):
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    kv = rep.kv_cache
    return pd.Series({"declared": kv.declared, "declared in": kv.declared_in, "auto resolves to": kv.auto_resolves_to,
                      "--kv-cache-dtype": kv.flag, "effective": kv.effective, "KV layers": kv.kv_layers,
                      "layers with scales": kv.layers_with_scales, "coverage": kv.scale_coverage,
                      "scale tensors (examples)": ", ".join(kv.scale_tensor_names) or "—"}, name="kv cache", dtype=object).to_frame()


@display
def flags_frame(rep: Any):
    """The SGLang flags to set for this checkpoint, one row each."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return pd.Series(rep.recommended_flags, name="value", dtype=object).to_frame()
