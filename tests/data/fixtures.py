"""Writers of tiny data-set files in the real on-disk formats, for the loader tests."""

from __future__ import annotations

import gzip
import os
import pickle
import sqlite3
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedadamom.data.datasets.idx import _DTYPES


def cifar_image_rows(n: int, offset: int = 0) -> np.ndarray:
  """``n`` rows of 3072 bytes: image i has red plane i+offset, green 100+i, blue 200+i
  (so that a wrong CHW/HWC reshape is visible)."""
  rows = np.empty((n, 3, 1024), dtype=np.uint8)
  for i in range(n):
    rows[i, 0], rows[i, 1], rows[i, 2] = (i + offset) % 100, 100 + i % 50, 200 + i % 50
  return rows.reshape(n, 3072)


def _dump(obj: dict, file: str) -> None:
  # The original pickles come from Python 2: their keys load as bytes.
  with open(file, "wb") as f:
    pickle.dump({k.encode(): v for k, v in obj.items()}, f, protocol=2)


def write_cifar10(root: str, per_batch: int = 4, test: int = 5,
                  seed: Optional[int] = None) -> str:
  """CIFAR-10's five train batches of `per_batch` images and a test batch.

  By default the images are `cifar_image_rows` (flat colour planes a loader test
  can recognise); with a `seed`, uniformly random pixels, for code that trains
  on them (flat planes make normalization layers divide by a zero variance).
  """
  rng = np.random.default_rng(seed) if seed is not None else None

  def rows(n, offset=0):
    if rng is None:
      return cifar_image_rows(n, offset=offset)
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)

  folder = os.path.join(root, "cifar-10-batches-py")
  os.makedirs(folder)
  for b in range(1, 6):
    _dump({"batch_label": b"training batch", "labels": [(b + i) % 10 for i in range(per_batch)],
           "data": rows(per_batch, offset=b * per_batch),
           "filenames": [b"x.png"] * per_batch}, os.path.join(folder, f"data_batch_{b}"))
  _dump({"labels": [i % 10 for i in range(test)], "data": rows(test)},
        os.path.join(folder, "test_batch"))
  return folder


def write_cifar100(root: str, train: int = 12, test: int = 6) -> str:
  folder = os.path.join(root, "cifar-100-python")
  os.makedirs(folder)
  for name, n in (("train", train), ("test", test)):
    _dump({"fine_labels": [(7 * i) % 100 for i in range(n)],
           "coarse_labels": [i % 20 for i in range(n)],
           "data": cifar_image_rows(n)}, os.path.join(folder, name))
  _dump({"fine_label_names": [b"apple"] * 100}, os.path.join(folder, "meta"))
  return folder


def _jpeg(file: str, shape: tuple[int, int, int], value: int) -> None:
  image = tf.fill(shape, tf.constant(value, tf.uint8))
  tf.io.write_file(file, tf.io.encode_jpeg(image, quality=100))


def write_tiny_imagenet(root: str, wnids=("n02", "n01"), per_class: int = 3) -> str:
  """Standard layout; one greyscale and one 50x40 image test channel forcing and resize."""
  folder = os.path.join(root, "tiny-imagenet-200")
  for wnid in wnids:
    images = os.path.join(folder, "train", wnid, "images")
    os.makedirs(images)
    for i in range(per_class):
      shape = (64, 64, 1) if i == 1 else (50, 40, 3) if i == 2 else (64, 64, 3)
      _jpeg(os.path.join(images, f"{wnid}_{i}.JPEG"), shape, 40 * (1 + i))
    with open(os.path.join(folder, "train", wnid, f"{wnid}_boxes.txt"), "w") as f:
      f.write("")
  os.makedirs(os.path.join(folder, "val", "images"))
  os.makedirs(os.path.join(folder, "test", "images"))
  with open(os.path.join(folder, "val", "val_annotations.txt"), "w") as f:
    for i, wnid in enumerate(list(wnids) * 2):
      _jpeg(os.path.join(folder, "val", "images", f"val_{i}.JPEG"), (64, 64, 3), 200)
      f.write(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63\n")
  with open(os.path.join(folder, "wnids.txt"), "w") as f:
    f.write("\n".join(wnids) + "\n")
  return folder


def _example(pixels: np.ndarray, label: int) -> bytes:
  features = tf.train.Features(feature={
      "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=pixels.reshape(-1))),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
  })
  return tf.train.Example(features=features).SerializeToString()


def write_emnist_sqlite(folder: str, num_writers: int = 3, per_writer: int = 4) -> str:
  """An ``emnist_all.sqlite`` with TFF's schema: ``examples`` (split_name, client_id,
  serialized tf.Example with float ``pixels`` 28x28 and int64 ``label``) and
  ``client_metadata``; the same writers appear in the train and test splits."""
  file = os.path.join(folder, "emnist_all.sqlite")
  with sqlite3.connect(file) as con:
    con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,"
                " serialized_example_proto BLOB NOT NULL);")
    con.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT "
                "NOT NULL, num_examples INTEGER NOT NULL);")
    for split in ("digits_only_train", "digits_only_test", "all_train", "all_test"):
      num_classes = 10 if split.startswith("digits") else 62
      for w in range(num_writers):
        writer = f"f{w:04d}_00"
        for i in range(per_writer):
          pixels = np.full((28, 28), 0.25 * (w + 1), np.float32)
          con.execute("INSERT INTO examples VALUES (?, ?, ?);",
                      (split, writer, _example(pixels, (w * 7 + i) % num_classes)))
        con.execute("INSERT INTO client_metadata VALUES (?, ?, ?);",
                    (writer, split, per_writer))
  return file


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
  """Writes an array as IDX (gzip when the name ends in ``.gz``)."""
  path = os.fspath(path)
  array = np.asarray(array)
  codes = {np.dtype(v).newbyteorder("="): k for k, v in _DTYPES.items()}
  code = codes[array.dtype.newbyteorder("=")]
  payload = (bytes([0, 0, code, array.ndim])
             + np.asarray(array.shape, ">u4").tobytes()
             + array.astype(np.dtype(_DTYPES[code])).tobytes())
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(payload)
