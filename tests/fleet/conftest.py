import pytest

from .s3server import S3Server


@pytest.fixture
def s3(tmp_path):
    srv = S3Server(tmp_path).start()
    srv.make_bucket("fleet-bkt")
    yield srv
    srv.kill()
