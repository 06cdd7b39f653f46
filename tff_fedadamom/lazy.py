"""Lazy package exports (PEP 562): a package's public names are imported from
their modules on first use. A package writes them as a literal `_EXPORTS =
{name: module}` (the layering test reads it) and sets

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable, Callable]:
  """The module-level `__getattr__` and `__dir__` of `package`."""

  def __getattr__(name):
    if name in exports:
      return getattr(importlib.import_module(exports[name]), name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

  def __dir__():
    return sorted(set(vars(sys.modules[package])) | set(exports))

  return __getattr__, __dir__
