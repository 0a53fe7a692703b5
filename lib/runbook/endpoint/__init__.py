"""Shared layer for talking to a running OpenAI-compatible server: the streamed request client (over
one of its transports, transport.py) and reachability probes. Used by the bench and accuracy stages."""
