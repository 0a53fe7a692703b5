"""Scripts run by the *serving* interpreter (not by the runbook's): standard library + sglang only."""
