"""Shared layer every stage may import: the deployment spec, findings, errors, secrets, file writes,
plots, statistics and the archive's read side."""

# The SGLang release whose source the rules here follow (memory arithmetic, quant resolution, flags).
# The Makefile reads this constant for the serving-env it builds; a test checks they agree.
SGLANG_VERSION = "0.5.23"
