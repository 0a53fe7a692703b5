"""`python -m runbook.demo runbook [--out DIR] [--no-llama]`: the whole runbook on the real SGLang server on CPU
(demo/runbook.py); `build` and `serve` are llama-server's (demo/llama.py)."""
import sys

from runbook.demo import llama, runbook

args = sys.argv[1:]
sys.exit(runbook.main(args[1:]) if args[:1] == ["runbook"] else llama.main(args))
