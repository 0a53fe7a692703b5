"""runbook: the helper library behind the SGLang deployment notebooks."""
from .errors import EndpointError, InputError, LockHeld, RunbookError, SpecError
from .findings import Finding
from .spec import Deployment, load as load_spec

__all__ = ["Deployment", "EndpointError", "Finding", "InputError", "LockHeld", "RunbookError", "SpecError", "load_spec"]
__version__ = "0.1.0"
