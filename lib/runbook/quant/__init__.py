"""Stage 10: what SGLang will do with the checkpoint's weight and KV-cache quantization.
`evaluate(spec)` is the entry point (`runbook quant`, 10_quant_config); `inspect_checkpoint` reads one
checkpoint without a spec."""
from runbook.quant.analysis import QuantReport, assess, inspect_checkpoint
from runbook.quant.declared import KVCache, Weights, scale_tensors
from runbook.quant.report import flags_frame, kv_cache_frame, weights_frame
from runbook.quant.stage import STAGE, QuantOptions, evaluate

__all__ = ["STAGE", "KVCache", "QuantOptions", "QuantReport", "Weights", "evaluate", "assess", "inspect_checkpoint",
           "kv_cache_frame", "scale_tensors", "weights_frame", "flags_frame"]
