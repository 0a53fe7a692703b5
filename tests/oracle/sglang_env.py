"""Import SGLang 0.5.23's CPU-callable code in .venv-serving (run there, not in the runbook's venv).

What is emulated, and only this: `torchvision`. No CPU torchvision wheel is reachable from the
package registries here, and SGLang imports it only for image preprocessing (multimodal
processors, DeepSeek-OCR's config module), never in the config, quantization or memory-pool code
the differential tests call. Transformers decides torchvision is absent *before* the stand-in is
installed, so its own availability checks stay truthful.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
import warnings


class _Anything(type):
    def __getattr__(cls, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _anything(attr)


def _anything(name: str) -> type:
    return _Anything(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: self})


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []

        def __getattr__(attr: str):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _anything(attr)

        m.__getattr__ = __getattr__  # type: ignore[method-assign]
        return m

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Call before importing sglang."""
    import transformers.utils.import_utils  # noqa: F401  (decides torchvision is absent first)

    if not any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionStandIn())
    warnings.filterwarnings("ignore", module=r"sglang\..*")
