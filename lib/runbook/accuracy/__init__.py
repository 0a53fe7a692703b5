"""Accuracy probes: KV quantization error offline (kvquant), long-context recall and greedy identity live."""
