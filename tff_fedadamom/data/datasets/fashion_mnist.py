"""Fashion-MNIST: 60,000 train / 10,000 test 28x28 grey images of 10 clothing classes.

Source: Xiao, Rasul and Vollgraf (2017), https://github.com/zalandoresearch/fashion-mnist,
read from the IDX gzip files of the Debian package ``dataset-fashion-mnist``
(``/usr/share/datasets/fashion-mnist``) or from any folder holding the same four files.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import CentralizedData, not_found
from tff_fedadamom.data.datasets.idx import read_idx

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
HOW_TO_GET = ("on Debian/Ubuntu `apt-get install dataset-fashion-mnist` (installs "
              f"{DEFAULT_DIR}), or download the four *-ubyte.gz files from "
              "https://github.com/zalandoresearch/fashion-mnist and pass their folder as "
              "path=...")


def _locate(folder: str, stem: str) -> Optional[str]:
  for name in (stem + ".gz", stem):
    if os.path.isfile(os.path.join(folder, name)):
      return os.path.join(folder, name)
  return None


def load(*, path: Optional[str] = None, seed: int = 0) -> CentralizedData:
  """Reads the four IDX files from ``path`` (default: the Debian package's folder)."""
  del seed  # The official train/test split is used as is.
  folder = os.path.expanduser(os.fspath(path)) if path is not None else DEFAULT_DIR
  found = {key: _locate(folder, stem) for key, stem in FILES.items()}
  missing = [FILES[k] + "[.gz]" for k, v in found.items() if v is None]
  if missing:
    raise not_found(f"Fashion-MNIST file(s) {', '.join(missing)}", folder, HOW_TO_GET)
  arrays = {key: read_idx(p) for key, p in found.items()}
  # The images are uint8 in the files: no copy (the arrays are read-only, and
  # `read_idx` keeps them for the process' later loads).
  return CentralizedData(arrays["x_train"].astype(np.uint8, copy=False)[..., None],
                         arrays["y_train"].astype(np.int32),
                         arrays["x_test"].astype(np.uint8, copy=False)[..., None],
                         arrays["y_test"].astype(np.int32), 10)
