import pytest

from bench.rawsse import RawServer


@pytest.fixture
def raw():
    """make(handler, **kw) -> a started RawServer; every one is stopped after the test."""
    started = []

    def make(handler, **kw):
        srv = RawServer(handler, **kw).start()
        started.append(srv)
        return srv
    yield make
    for s in started:
        s.stop()
