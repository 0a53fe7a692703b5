"""Stage 60: tune, which finds the configuration to serve by launching candidate servers one at a time."""
