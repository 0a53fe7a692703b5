"""llama.cpp demo tooling, outside the runbook's stages: build `llama-server`, fetch a tiny GGUF model,
serve it, and run the whole runbook against it (`make demo`). Tests use it as the real CPU engine."""
