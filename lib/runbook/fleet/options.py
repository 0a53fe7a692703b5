"""`runbook fleet`'s settings, declared once: cli.py builds the verb's flags from these fields (flag, metavar,
help, the per-value check; a number's default is added to its help), as it does for `run` and every stage."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from runbook.core.options import FiniteFloat, Options, PosInt, Url
from runbook.runner.upload import ArchiveUrl

MAX_LINK_LIFETIME_S = 7 * 86400.0   # S3's ceiling for a presigned URL (SigV4)


class FleetOptions(Options):
    """Where the runs are read from, where the index is written, and how it links to the runs."""

    source: ArchiveUrl = Field(alias="from", description="s3://BUCKET/PREFIX the hosts upload to",
                               json_schema_extra={"metavar": "URL", "echo": False})   # may hold credentials
    out: Path = Field(Path("fleet"), description="write index.html and fleet.json here (default: fleet/)",
                      json_schema_extra={"metavar": "DIR"})
    links: Literal["relative", "presigned"] = Field(
        "relative", description="run links relative to PREFIX (the page served from the store; see --publish) or presigned URLs")
    link_base: Url | None = Field(None, description="relative links under this base, e.g. https://runbooks.example.com/fleet",
                                  json_schema_extra={"metavar": "URL"})
    expires: Annotated[FiniteFloat, Field(ge=1, le=MAX_LINK_LIFETIME_S)] = Field(
        MAX_LINK_LIFETIME_S, description="presigned links' lifetime (default and max 7 days)", json_schema_extra={"metavar": "S"})
    trend: PosInt = Field(30, description="runs per host and deployment in the trends", json_schema_extra={"metavar": "N"})
    workers: PosInt = Field(64, description="summaries read concurrently", json_schema_extra={"metavar": "N"})
    publish: bool = Field(False, description="also write index.html and fleet.json to PREFIX/ in the store",
                          json_schema_extra={"switch": True})
