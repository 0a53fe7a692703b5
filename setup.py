"""Package list for setuptools: lib/'s packages plus the top-level folders shipped as runbook/_data/.

pyproject's packages.find cannot list packages outside lib/, so the list is built here; where each
one comes from (package-dir) and which files it carries (package-data) stay in pyproject.toml."""
from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages("lib", include=["runbook", "runbook.*"])
      + ["runbook._data.notebooks", "runbook._data.deployments", "runbook._data.models"])
