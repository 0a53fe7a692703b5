"""Stage 10: what SGLang will do with the checkpoint's weight and KV-cache quantization.
`evaluate(spec)` is the entry point (`runbook quant`, 10_quant_config); `inspect` reads one
checkpoint without a spec."""
from runbook.core.lazy import exports
from runbook.quant.stage import STAGE, QuantOptions, evaluate

# Imported on first use (core/lazy.py): the registry imports this package to read its contract.
__getattr__, __dir__ = exports(__name__, {"KVCache": "declared", "QuantReport": "analysis", "Weights": "declared",
    "for_deployment": "analysis", "inspect": "analysis", "scale_tensors": "declared", "kv_cache_frame": "report",
    "flags_frame": "report", "weights_frame": "report"})

__all__ = ["STAGE", "KVCache", "QuantOptions", "QuantReport", "Weights", "evaluate", "flags_frame", "for_deployment", "inspect",
           "kv_cache_frame", "scale_tensors", "weights_frame"]
