"""Shared facts about the model: where it lives, its checkpoint headers and config, its architecture,
its tokenizer, a GGUF file's header (`gguf`). Stages read the model only through this package."""
