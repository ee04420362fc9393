"""Lets SGLang 0.5.23 import on a machine without CUDA.

Two things break there, both at import time and neither on any code path a CPU server runs:
PyPI's torchvision is CUDA-linked, so its C ops never load and ``torchvision._meta_registrations``
fails on the missing ``torchvision::nms``/``qnms`` schemas; and there is no CPU build of
``sgl_kernel``, which a few SGLang modules import at load time. A meta-path finder fixes both
lazily, at the moment those modules are imported: it declares the two op schemas (no kernels), and
serves a stub ``sgl_kernel`` (submodules included) whose names can be imported and read but
raise if they are ever called.

`install` is cheap (it imports nothing) because it runs at every interpreter start-up, from the
``.pth`` file the setup script drops into the virtual environment: SGLang spawns its scheduler and
detokenizer as fresh interpreters, and each must get the fix before its first SGLang import.
The finder never acts where CUDA is present, unless ``SGLBLEND_KERNEL_STUB=1`` asks for the
``sgl_kernel`` stub on a GPU machine that lacks the real package. The module sits at the top of the
package, importing nothing of it, because both the launchers and the SGLang plugin install it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

STUB_ENV = "SGLBLEND_KERNEL_STUB"
_TORCHVISION_META = "torchvision._meta_registrations"
_KERNEL_PACKAGE = "sgl_kernel"
_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_torchvision_fragment: Any = None
_cuda_present: bool | None = None


def cuda_present() -> bool:
    """Whether this process can see a CUDA device (decided once; torch is imported lazily)."""
    global _cuda_present
    if _cuda_present is None:
        import torch

        _cuda_present = torch.version.cuda is not None and torch.cuda.is_available()
    return _cuda_present


class KernelUnavailableError(RuntimeError):
    """Raised when code calls into the stub ``sgl_kernel``: that path needs the real CUDA kernels."""


class _Unavailable:
    """A name inside the stub: attribute access works (module-level constants such as
    ``scalar_types.uint4b8`` are read at import time), calling it raises."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise KernelUnavailableError(
            f"{self._qualname} was called, but only sgl-blend's stub of sgl_kernel is installed; "
            "this code path needs the CUDA sgl_kernel package"
        )

    def __repr__(self) -> str:
        return f"<sgl-blend stub {self._qualname}>"


class _KernelStubModule(types.ModuleType):
    SGL_BLEND_STUB: bool  # set on each stub, which `_is_stub` reads

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")


class _KernelStubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _KernelStubModule(spec.name)
        module.__path__ = []
        module.SGL_BLEND_STUB = True
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _declare_torchvision_schemas() -> None:
    global _torchvision_fragment
    import torch

    if _torchvision_fragment is not None or hasattr(torch.ops.torchvision, "nms"):
        return
    _torchvision_fragment = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _TORCHVISION_SCHEMAS:
        _torchvision_fragment.define(schema)


def _wants_kernel_stub() -> bool:
    if importlib.machinery.PathFinder.find_spec(_KERNEL_PACKAGE) is not None:
        return False
    return os.environ.get(STUB_ENV) == "1" or not cuda_present()


class CpuCompatFinder(importlib.abc.MetaPathFinder):
    """Intercepts exactly two imports; every other name falls through in a string comparison."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == _TORCHVISION_META:
            if not cuda_present():
                _declare_torchvision_schemas()
            return None
        if fullname == _KERNEL_PACKAGE:
            wanted = _wants_kernel_stub()
        else:
            wanted = fullname.startswith(_KERNEL_PACKAGE + ".") and _is_stub(sys.modules.get(_KERNEL_PACKAGE))
        if wanted:
            return importlib.util.spec_from_loader(fullname, _KernelStubLoader(), is_package=True)
        return None


def _is_stub(module: types.ModuleType | None) -> bool:
    return getattr(module, "SGL_BLEND_STUB", False) is True


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, CpuCompatFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, CpuCompatFinder())


def kernel_stub_active() -> bool:
    """Whether this process is running with the stub ``sgl_kernel``."""
    return _is_stub(sys.modules.get(_KERNEL_PACKAGE))
