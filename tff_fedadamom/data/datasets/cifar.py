"""CIFAR-10 and CIFAR-100: 50,000 train / 10,000 test 32x32 colour images.

Source: Krizhevsky (2009), https://www.cs.toronto.edu/~kriz/cifar.html. No package ships
them: ``path`` is the standard "python version" folder (or its parent),
``cifar-10-batches-py`` (``data_batch_1..5``, ``test_batch``) or ``cifar-100-python``
(``train``, ``test``, with fine and coarse labels).

Each pickle holds ``data`` (N x 3072 uint8, the red, green then blue 32x32 planes of every
image) and the labels; they are unpickled with ``encoding="bytes"`` so that the original
Python 2 pickles load, and reshaped to HWC.
"""

from __future__ import annotations

import os
import pickle
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import CentralizedData
from tff_fedadamom.data.datasets._common import find_dir

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = "test_batch"
CIFAR100_DIR = "cifar-100-python"
LABEL_MODES = {"fine": ("fine_labels", 100), "coarse": ("coarse_labels", 20)}


def _read(file: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
  with open(file, "rb") as f:
    raw = pickle.load(f, encoding="bytes")
  batch = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in raw.items()}
  if label_key not in batch:
    raise ValueError(f"{file}: no {label_key!r} entry (found {sorted(batch)}).")
  data = np.asarray(batch["data"], dtype=np.uint8)
  if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
    raise ValueError(f"{file}: expected data of shape (N, 3072), got {data.shape}.")
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
  return images, np.asarray(batch[label_key], dtype=np.int32)


def _how(url: str, folder: str) -> str:
  return (f"download {url}, extract it, and pass the extracted {folder!r} folder (or the "
          "folder containing it) as path=...")


def load_cifar10(*, path: Optional[str] = None, seed: int = 0) -> CentralizedData:
  """Reads ``data_batch_1..5`` and ``test_batch`` from ``path[/cifar-10-batches-py]``."""
  del seed
  required = CIFAR10_TRAIN + (CIFAR10_TEST,)
  folder = find_dir(path, CIFAR10_DIR, required,
                    f"CIFAR-10 folder {CIFAR10_DIR!r} with {', '.join(required)}",
                    _how("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                         CIFAR10_DIR))
  train = [_read(os.path.join(folder, name), "labels") for name in CIFAR10_TRAIN]
  x_test, y_test = _read(os.path.join(folder, CIFAR10_TEST), "labels")
  return CentralizedData(np.concatenate([x for x, _ in train]),
                         np.concatenate([y for _, y in train]), x_test, y_test, 10)


def load_cifar100(*, path: Optional[str] = None, seed: int = 0,
                  label_mode: str = "fine") -> CentralizedData:
  """Reads ``train`` and ``test`` from ``path[/cifar-100-python]``; ``label_mode`` picks
  the 100 fine or the 20 coarse (superclass) labels."""
  del seed
  if label_mode not in LABEL_MODES:
    raise ValueError(f"cifar100: label_mode must be one of {', '.join(LABEL_MODES)}, "
                     f"got {label_mode!r}.")
  key, num_classes = LABEL_MODES[label_mode]
  folder = find_dir(path, CIFAR100_DIR, ("train", "test"),
                    f"CIFAR-100 folder {CIFAR100_DIR!r} with train, test",
                    _how("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                         CIFAR100_DIR))
  x_train, y_train = _read(os.path.join(folder, "train"), key)
  x_test, y_test = _read(os.path.join(folder, "test"), key)
  return CentralizedData(x_train, y_train, x_test, y_test, num_classes)
