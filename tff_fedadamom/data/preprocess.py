"""Per-client and test-set input pipelines.

A client's shuffle order and augmentation depend only on the seed passed in, which
callers derive with :func:`client_round_seed` from (experiment seed, round, client): a
hash stable across processes and machines (Python's ``hash()`` of a str is salted per
process), so a resumed run replays the same client data order.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Optional

import tensorflow as tf

AUGMENTATIONS = ("crop_flip",)
_DEFAULT_SHUFFLE_BUFFER = 1024
_CROP_PADDING = 4


def client_round_seed(seed: int, round_num: int, client_id) -> int:
  """A non-negative int63 seed from (seed, round, client), stable everywhere."""
  key = f"{int(seed)}|{int(round_num)}|{client_id}".encode("utf-8")
  digest = hashlib.blake2b(key, digest_size=8).digest()
  return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def _crop_flip(x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """CIFAR-style augmentation: zero-pad 4 pixels, random crop back, random h-flip."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  padded = tf.pad(x, [[_CROP_PADDING, _CROP_PADDING], [_CROP_PADDING, _CROP_PADDING],
                      [0, 0]])
  cropped = tf.image.stateless_random_crop(padded, tf.shape(x), seed=crop_seed)
  flipped = tf.image.stateless_random_flip_left_right(cropped, seed=flip_seed)
  return tf.ensure_shape(flipped, x.shape)


def _augment(ds: tf.data.Dataset, augment: str, seed: int) -> tf.data.Dataset:
  if augment not in AUGMENTATIONS:
    raise ValueError(f"Unknown augment {augment!r}; valid: {', '.join(AUGMENTATIONS)} "
                     "or None.")
  x_spec = ds.element_spec["x"]
  if x_spec.shape.rank != 3 or not x_spec.dtype.is_floating:
    raise ValueError(f"augment={augment!r} needs float images of shape (H, W, C); "
                     f"got x {x_spec}.")

  def apply(index, element):
    # One stateless seed per element position: same seed -> same augmentation. A
    # tensor seed (a graph input) is captured; a Python one becomes a constant made
    # inside, so nothing is captured from the caller's graph.
    base = seed if tf.is_tensor(seed) else tf.constant(seed, tf.int64)
    out = collections.OrderedDict(element)
    out["x"] = _crop_flip(out["x"], tf.stack([base, index]))
    return out

  return ds.enumerate().map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def client_dataset(ds: tf.data.Dataset, *, batch_size: int, local_epochs: int, seed,
                   shuffle_buffer=None, augment: Optional[str] = None,
                   drop_remainder: bool = False, prefetch: bool = True) -> tf.data.Dataset:
  """Shuffle, repeat for ``local_epochs``, (augment,) batch and prefetch one client's data.

  Args:
    local_epochs: Passes over the data, each shuffled anew in an order fixed by ``seed``.
    seed: This client's round seed (:func:`client_round_seed`), int or int64 tensor.
    shuffle_buffer: Default: the client's size when known (a full shuffle), else
      1024; an int or an int64 scalar tensor.
    augment: None, or ``"crop_flip"`` (4-pixel zero padding, random crop and
      horizontal flip, for CIFAR-like images), seeded with stateless ops.
    prefetch: Prefetch batches on a background thread: not for a pipeline built and
      read inside one TensorFlow call (``ClientTensors.dataset``).
  """
  if batch_size < 1 or local_epochs < 1:
    raise ValueError(f"batch_size and local_epochs must be >= 1, got {batch_size}, "
                     f"{local_epochs}.")
  if shuffle_buffer is None:
    # Static only when known without running anything (not when traced into a graph).
    size = tf.get_static_value(ds.cardinality())
    shuffle_buffer = int(size) if size is not None and size > 0 else _DEFAULT_SHUFFLE_BUFFER
  if local_epochs > 1:
    # Converting (or reading and parsing) once instead of once per epoch pays for itself.
    ds = ds.cache()
  if not tf.is_tensor(seed):
    seed = int(seed) & 0x7FFF_FFFF_FFFF_FFFF
  if not tf.is_tensor(shuffle_buffer):
    shuffle_buffer = max(int(shuffle_buffer), 1)
  ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  ds = ds.repeat(local_epochs)
  if augment is not None:
    ds = _augment(ds, augment, seed)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def test_dataset(ds: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
  """Batch (keeping the last partial batch, so every example counts) and prefetch."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


# Its name starts with "test": keep pytest from collecting it where it is imported.
test_dataset.__test__ = False
