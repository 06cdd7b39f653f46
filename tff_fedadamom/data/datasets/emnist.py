"""EMNIST digits and FEMNIST (62 classes), federated by writer, via TFF's own loader.

Source: Cohen et al. (2017) EMNIST, federated by writer by LEAF (Caldas et al. 2018), as
TFF publishes it: ``tff.simulation.datasets.emnist.load_data`` reading the SQLite file
``emnist_all.sqlite``.

TFF downloads that file when it is missing; here nothing may be downloaded, so the loader
first checks that it exists in ``path`` (default: TFF's cache folder ``~/.tff``).

Elements become ``x`` float32 (28, 28, 1) and ``y`` int32. Pixel values are kept as TFF
provides them (1.0 is the background, the inverse of MNIST), so results stay comparable
with published TFF baselines. Every writer's held-out examples form the test set.
"""

from __future__ import annotations

import collections
import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.data.base import FederatedData, not_found

FILE_NAME = "emnist_all.sqlite"  # What tff...emnist.load_data looks for in cache_dir.
DEFAULT_DIR = os.path.join("~", ".tff")
HOW_TO_GET = ("on a machine with internet access, download https://storage.googleapis.com/"
              f"tff-datasets-public/emnist_all.sqlite.lzma, decompress it (`unxz` / "
              f"`lzma -d`) to {FILE_NAME}, and pass its folder as path=...")


def _map_xy(ds: tf.data.Dataset) -> tf.data.Dataset:
  return ds.map(lambda e: collections.OrderedDict(
      x=tf.expand_dims(tf.cast(e["pixels"], tf.float32), -1),
      y=tf.cast(tf.reshape(e["label"], []), tf.int32)),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _load(name: str, only_digits: bool, path: Optional[str], seed: int,
          num_clients: Optional[int], max_clients: Optional[int]) -> FederatedData:
  if num_clients is not None:
    raise ValueError(f"{name} has natural clients (writers): num_clients does not apply; "
                     "use max_clients to cap their number.")
  if max_clients is not None and max_clients < 1:
    raise ValueError(f"{name}: max_clients must be >= 1 or None, got {max_clients}.")
  # ``path`` may name the folder holding the file or the file itself.
  file = os.path.expanduser(os.fspath(path if path is not None else DEFAULT_DIR))
  if not file.endswith(".sqlite"):
    file = os.path.join(file, FILE_NAME)
  if os.path.basename(file) != FILE_NAME:
    raise ValueError(f"{name}: TFF reads only a file named {FILE_NAME}, got {file}; "
                     "rename it or pass its folder.")
  if not os.path.isfile(file):
    raise not_found(f"EMNIST database {FILE_NAME} (for {name})", file, HOW_TO_GET)
  # The file exists, so TFF only opens it (its downloader returns before fetching).
  train, test = tff.simulation.datasets.emnist.load_data(
      only_digits=only_digits, cache_dir=os.path.dirname(file))
  train = train.preprocess(_map_xy)
  if max_clients is not None and max_clients < len(train.client_ids):
    ids = np.random.default_rng(seed).choice(train.client_ids, max_clients, replace=False)
    train = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
        sorted(str(i) for i in ids), train.serializable_dataset_fn)
  return FederatedData(
      name=name, train=train, test=_map_xy(test.create_tf_dataset_from_all_clients(seed=0)),
      input_shape=(28, 28, 1), num_classes=10 if only_digits else 62)


def load_emnist(*, path: Optional[str] = None, seed: int = 0,
                num_clients: Optional[int] = None,
                max_clients: Optional[int] = None) -> FederatedData:
  """EMNIST digits (10 classes, 3,383 writers)."""
  return _load("emnist", True, path, seed, num_clients, max_clients)


def load_femnist(*, path: Optional[str] = None, seed: int = 0,
                 num_clients: Optional[int] = None,
                 max_clients: Optional[int] = None) -> FederatedData:
  """FEMNIST: digits and letters (62 classes, 3,400 writers)."""
  return _load("femnist", False, path, seed, num_clients, max_clients)
