"""Digits: scikit-learn's 1,797 8x8 grey handwritten digits (10 classes).

Source: the UCI "Optical Recognition of Handwritten Digits" test set (Alpaydin and
Kaynak, 1998), bundled with scikit-learn as ``sklearn.datasets.load_digits``.

Pixel values are counts 0-16, scaled to [0, 1] float32 (not uint8/255, which would not
represent them exactly). A stratified, seeded ``test_fraction`` of every class is held out.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_fedadamom.data.base import CentralizedData, not_found
from tff_fedadamom.data.datasets._common import stratified_split


def load(*, path: Optional[str] = None, seed: int = 0,
         test_fraction: float = 0.2) -> CentralizedData:
  """Loads the bundled data (``path`` is not used: the data ship with scikit-learn)."""
  del path
  try:
    from sklearn.datasets import load_digits
  except ImportError as e:
    raise not_found("scikit-learn (its bundled digits data)", "the current Python "
                    "environment", "`pip install scikit-learn`") from e
  bunch = load_digits()
  images = (bunch.images / 16.0).astype(np.float32)[..., None]
  labels = bunch.target.astype(np.int32)
  train, test = stratified_split(labels, test_fraction, seed)
  return CentralizedData(images[train], labels[train], images[test], labels[test], 10)
