"""The fleet index: every host's runs in one object store, one static page and one JSON.

`python -m runbook fleet --from s3://BUCKET/PREFIX --out DIR` lists the store once, reads the
summary.json of every run that has its `_COMPLETE` marker (concurrently; no notebook is downloaded)
and writes DIR/index.html and DIR/fleet.json: hosts × deployments, each cell's latest verdict, when it
ran, its failing findings and the trends of the figures the runner records (runner/figures.py).
"""
from runbook.fleet.index import Fleet, Written, build, collect, make, render_html, write
from runbook.fleet.options import FleetOptions

__all__ = ["Fleet", "FleetOptions", "Written", "build", "collect", "make", "render_html", "write"]
