"""Numerics fingerprints: a short fixed computation per method, rounded and hashed.

A fingerprint changes with a method's numbers, not when code moves, nor from one machine to
another (README.md). Raw float32 bytes fail the last: oneDNN kernels dispatch on the CPU and
sum in other orders. So a server optimizer runs in float64, on two tensors (reductions over
all parameters, such as FedAdamom's vbar, see more than one) with pseudo-gradients of scale
1e-3 to 1e2 (epsilon-dominated to clipped regimes); a learning process keeps its float32, on
a linear model fed one-example batches with one nonzero input, a power of two: every product
is exact, no sum has two inexact terms, and the rest (client Adam/STORM steps, the mean over
clients, the server step) is elementwise, which every CPU rounds alike.

Every float or integer leaf of the weights and state is written with `DIGITS[dtype]`
significant digits and hashed. float64 keeps 8: six steps amplify a last-bit machine
difference (1e-16) by far less than 1e8, while a change of numerics moves values by much
more than 1e-8 (a test scales one update by 1.001). float32 keeps 5 of its 7.2 digits, two
orders above a last-bit difference after two rounds.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
from typing import Iterable

import numpy as np

STEPS = 6
ROUNDS = 2
# Bump when the computation's inputs or rounding change (every unit's key changes).
VERSION = 2
DIGITS = {np.dtype(np.float64): 8, np.dtype(np.float32): 5}
_SHAPES = ((3, 4), (5,))
_SCALES = (1.0, 1e-3, 10.0, 0.3, 1e2, 3e-2)


def digest(arrays: Iterable) -> str:
  """The hash of arrays as text with their dtypes and shapes (-0.0 as 0.0)."""
  h = hashlib.sha256(f"v{VERSION}".encode())
  for a in map(np.asarray, arrays):
    digits = DIGITS.get(a.dtype, DIGITS[np.dtype(np.float32)])
    text = " ".join(f"{float(v) + 0.0:.{digits - 1}e}" if a.dtype.kind == "f" else str(int(v))
                    for v in a.ravel())
    h.update(f"{a.dtype.str}{a.shape}:{text};".encode())
  return h.hexdigest()[:16]


def _numeric_leaves(structure) -> list:
  """Every number of a (nested) TF/NumPy structure, as arrays, in tf.nest order."""
  import tensorflow as tf

  values = [np.asarray(leaf.numpy() if hasattr(leaf, "numpy") else leaf)
            for leaf in tf.nest.flatten(structure)]
  return [value for value in values if value.dtype.kind in "fiub"]


def server_optimizer_fingerprint(name: str, **hparams) -> str:
  """Server optimizer `name`'s fingerprint; `hparams` override the defaults."""
  import tensorflow as tf

  from tff_fedadamom.methods import build_server_optimizer

  optimizer = build_server_optimizer(name, **hparams)
  rng = np.random.default_rng(20240601)
  weights = tuple(tf.constant(rng.normal(size=s), tf.float64) for s in _SHAPES)
  state = optimizer.initialize(tuple(tf.TensorSpec(s, tf.float64) for s in _SHAPES))
  for step in range(STEPS):
    scale = _SCALES[step % len(_SCALES)]
    grads = tuple(tf.constant(rng.normal(size=s) * scale, tf.float64) for s in _SHAPES)
    state, weights = optimizer.next(state, weights, grads)
  return digest(_numeric_leaves(weights) + _numeric_leaves(state))


# y = x W + b; three clients of 1-3 examples, each with one nonzero input, a power of two.
_W0 = np.array([[0.5, -0.25], [0.125, 1.0]], np.float32)
_CLIENTS = (
    ([[1.0, 0.0], [0.0, -2.0]], [[2.0, 0.0], [1.0, 1.0]]),
    ([[-1.0, 0.0], [0.0, 4.0], [0.5, 0.0]], [[-1.0, 2.0], [3.0, 0.0], [0.5, 0.5]]),
    ([[0.0, 0.25]], [[-1.0, 4.0]]),
)


def _linear_model_fn():
  import tensorflow as tf
  import tensorflow_federated as tff

  spec = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                                 y=tf.TensorSpec([None, 2], tf.float32))
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
      2, input_shape=(2,), kernel_initializer=tf.keras.initializers.Constant(_W0),
      bias_initializer=tf.keras.initializers.Constant(0.125))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)


def learning_process_fingerprint(name: str, client_learning_rate: float = 0.05,
                                 **hparams) -> str:
  """Learning process `name`'s fingerprint: `ROUNDS` rounds run in process, one
  client at a time, as the study's experiments run them."""
  import tensorflow as tf

  from tff_fedadamom.methods import get_spec, resolve_hparams
  from tff_fedadamom.runtime.inprocess import InProcessLearningProcess

  process = InProcessLearningProcess(
      get_spec(name).builder(_linear_model_fn, client_learning_rate,
                             **resolve_hparams(name, **hparams)),
      devices=["CPU:0"], max_concurrent_clients=1)
  datasets = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.array(x, np.float32), y=np.array(y, np.float32))).batch(1) for x, y in _CLIENTS]
  state = process.initialize()
  for _ in range(ROUNDS):
    state = process.next(state, datasets).state
  return digest(_numeric_leaves(state.global_model_weights)
                + _numeric_leaves(process.get_hparams(state)))


def _compute(name: str) -> str:
  from tff_fedadamom.methods import is_learning_process

  return (learning_process_fingerprint if is_learning_process(name)
          else server_optimizer_fingerprint)(name)


@functools.lru_cache(maxsize=1)
def _memo_key() -> str:
  from tff_fedadamom.runtime import process_cache

  with open(os.path.abspath(__file__), "rb") as f:
    text = json.dumps({**process_cache.versions(), "numpy": np.__version__,
                       "fingerprint.py": hashlib.sha256(f.read()).hexdigest()}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def memo_dir() -> str:
  """Where computed fingerprints are kept, a file each: beside the compiled learning
  processes (`runtime.process_cache`), in a folder named by the package's source, this
  file, TensorFlow, TFF and NumPy (a learning process's fingerprint costs seconds)."""
  from tff_fedadamom.runtime import process_cache

  return os.path.join(process_cache.default_directory(), "fingerprints", _memo_key())


@functools.lru_cache(maxsize=None)
def fingerprint(name: str) -> str:
  """Registry method `name`'s fingerprint, read from `memo_dir()` or computed and written
  there (atomically: concurrent writers write the same bytes)."""
  from tff_fedadamom.atomic_io import atomic_write_bytes

  path = os.path.join(memo_dir(), name)
  with contextlib.suppress(OSError), open(path) as f:
    value = f.read().strip()
    if value:
      return value
  value = _compute(name)
  with contextlib.suppress(OSError):  # a read-only cache directory: computed in each process
    os.makedirs(memo_dir(), exist_ok=True)
    atomic_write_bytes(path, value.encode())
  return value


def fingerprints(names: Iterable[str]) -> dict:
  return {n: fingerprint(n) for n in sorted(set(names))}
