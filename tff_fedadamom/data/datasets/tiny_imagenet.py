"""Tiny ImageNet: 200 classes, 100,000 train / 10,000 validation 64x64 colour images.

Source: the Stanford CS231n challenge, http://cs231n.stanford.edu/tiny-imagenet-200.zip
(a subset of ImageNet). No package ships it: ``path`` is the ``tiny-imagenet-200`` folder
(or its parent): ``wnids.txt``, ``train/<wnid>/images/*.JPEG`` and ``val/images/*.JPEG``
labelled by ``val/val_annotations.txt``. The official test images have no labels, so the
validation set serves as the test set.

Labels index the sorted wnids. JPEGs are decoded with ``tf.io.decode_jpeg`` forced to
three channels (a few Tiny ImageNet images are greyscale).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedadamom.data.base import CentralizedData, not_found
from tff_fedadamom.data.datasets._common import find_dir

FOLDER = "tiny-imagenet-200"
REQUIRED = ("wnids.txt", "train", os.path.join("val", "val_annotations.txt"),
            os.path.join("val", "images"))
IMAGE_SIZE = 64
HOW_TO_GET = ("download http://cs231n.stanford.edu/tiny-imagenet-200.zip, unzip it, and "
              f"pass the {FOLDER!r} folder (or the folder containing it) as path=...")


def _decode_one(file: tf.Tensor) -> tf.Tensor:
  image = tf.io.decode_jpeg(tf.io.read_file(file), channels=3)
  size = tf.shape(image)[:2]
  return tf.cond(
      tf.reduce_all(tf.equal(size, IMAGE_SIZE)),
      lambda: image,
      lambda: tf.cast(tf.clip_by_value(tf.round(tf.image.resize(
          image, (IMAGE_SIZE, IMAGE_SIZE), antialias=True)), 0, 255), tf.uint8))


def _decode(files: list[str]) -> np.ndarray:
  """Decodes JPEGs in parallel with tf.data, in file order, into one uint8 array."""
  images = np.empty((len(files), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
  ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
  ds = ds.map(_decode_one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  for i, batch in enumerate(ds.batch(1024).as_numpy_iterator()):
    images[i * 1024:i * 1024 + len(batch)] = batch
  return images


def load(*, path: Optional[str] = None, seed: int = 0) -> CentralizedData:
  """Decodes the train and validation JPEGs under ``path[/tiny-imagenet-200]``."""
  del seed
  folder = find_dir(path, FOLDER, REQUIRED,
                    f"Tiny ImageNet folder {FOLDER!r} with {', '.join(REQUIRED)}", HOW_TO_GET)
  with open(os.path.join(folder, "wnids.txt")) as f:
    wnids = sorted({line.strip() for line in f if line.strip()})
  index = {wnid: i for i, wnid in enumerate(wnids)}
  train_files, train_labels = [], []
  for wnid in wnids:
    image_dir = os.path.join(folder, "train", wnid, "images")
    if not os.path.isdir(image_dir):
      raise not_found(f"Tiny ImageNet training images of class {wnid}", image_dir,
                      HOW_TO_GET)
    names = sorted(n for n in os.listdir(image_dir) if n.lower().endswith((".jpeg", ".jpg")))
    train_files += [os.path.join(image_dir, n) for n in names]
    train_labels += [index[wnid]] * len(names)
  val_files, val_labels = [], []
  with open(os.path.join(folder, "val", "val_annotations.txt")) as f:
    for line in f:
      fields = line.split("\t")
      if len(fields) >= 2 and fields[1].strip() in index:
        val_files.append(os.path.join(folder, "val", "images", fields[0].strip()))
        val_labels.append(index[fields[1].strip()])
  missing = [f for f in val_files if not os.path.isfile(f)]
  if missing:
    raise not_found(f"{len(missing)} Tiny ImageNet validation image(s), e.g. "
                    f"{os.path.basename(missing[0])}", os.path.dirname(missing[0]),
                    HOW_TO_GET)
  return CentralizedData(_decode(train_files), np.asarray(train_labels, np.int32),
                         _decode(val_files), np.asarray(val_labels, np.int32), len(wnids))
