"""runbook: the helper library behind the SGLang deployment notebooks."""
from runbook.core.errors import (
    InputError,
    LockHeld,
    RunbookError,
    SpecError,
)
from runbook.core.findings import Finding
from runbook.core.spec import Deployment
from runbook.core.spec import load as load_spec

__all__ = ["Deployment", "Finding", "InputError", "LockHeld", "RunbookError", "SpecError", "load_spec"]
__version__ = "0.1.0"
