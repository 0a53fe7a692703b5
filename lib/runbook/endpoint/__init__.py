"""Shared layer for talking to a running OpenAI-compatible server: the streamed request client and
reachability probes. Used by the bench and accuracy stages."""
