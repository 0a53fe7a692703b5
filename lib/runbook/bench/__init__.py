"""Serving benchmarks: client (one streamed request -> record), workloads, metrics (pure), sweep, report."""
