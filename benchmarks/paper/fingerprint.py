"""Numerics fingerprints: a short deterministic computation per method, hashed.

A unit of the study (a tuning trial, a final run, the escape simulation) is
identified by its config and by the fingerprint of every method it runs. The
fingerprint is the hash of the bytes a method computes on fixed inputs, so it
changes exactly when that method's numerics change (an update rule, a default
hparam, a bias-correction convention) and stays the same when code is only
moved, renamed or reformatted: a refactor keeps the committed units, a change of
the numerics runs their units again.

What is computed, per registry entry (`tff_fedadamom.optimizers`):

* a server optimizer (FedAvg ... FADAS, FedAdamom) is built with the registry's
  defaults and stepped `STEPS` times through its own `initialize`/`next` on two
  fixed float32 tensors (a 3x4 matrix and a 5-vector, so that reductions over all
  parameters, such as FedAdamom's vbar, see more than one tensor), with fixed
  pseudo-gradients whose scale spans 1e-3..1e2 per step (the small ones reach
  epsilon-dominated regimes, the large ones the clipped and normalized ones);
* a learning process (FedCAda, FAFED: their clients change too) is built with
  the registry's defaults on a tiny linear model and run for `ROUNDS` rounds on
  three fixed client data sets, so the client rule, the aggregation of the
  statistics and the server step all enter.

The hash covers the final weights and every floating or integer leaf of the
optimizer state (hparams included), as raw bytes in a fixed order. Nothing here
knows any method's expected numbers: the fingerprint is whatever the method
computes.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
from typing import Iterable, Mapping

import numpy as np

STEPS = 6
ROUNDS = 2
# The version of this computation itself: bump it when the fixed inputs above
# change (every unit then runs again, as it must).
VERSION = 1
_SHAPES = ((3, 4), (5,))
_SCALES = (1.0, 1e-3, 10.0, 0.3, 1e2, 3e-2)


def _digest(arrays: Iterable) -> str:
  h = hashlib.sha256(f"v{VERSION}".encode())
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def _numeric_leaves(structure) -> list:
  """Every number of a (nested) TF/NumPy structure, as arrays, in tf.nest order."""
  import tensorflow as tf

  out = []
  for leaf in tf.nest.flatten(structure):
    value = np.asarray(leaf.numpy() if hasattr(leaf, "numpy") else leaf)
    if value.dtype.kind in "fiub":
      out.append(value)
  return out


def server_optimizer_fingerprint(name: str, **hparams) -> str:
  """The fingerprint of server optimizer `name` (registry defaults, overridden by
  `hparams`: a test changes one and sees the fingerprint change)."""
  import tensorflow as tf

  from tff_fedadamom.optimizers import build_server_optimizer

  optimizer = build_server_optimizer(name, **hparams)
  rng = np.random.default_rng(20240601)
  weights = tuple(tf.constant(rng.normal(size=s).astype(np.float32)) for s in _SHAPES)
  state = optimizer.initialize(tuple(tf.TensorSpec(s, tf.float32) for s in _SHAPES))
  for step in range(STEPS):
    scale = np.float32(_SCALES[step % len(_SCALES)])
    grads = tuple(tf.constant(rng.normal(size=s).astype(np.float32) * scale)
                  for s in _SHAPES)
    state, weights = optimizer.next(state, weights, grads)
  return _digest(_numeric_leaves(weights) + _numeric_leaves(state))


# A linear model y = x W + b (2 inputs, 2 outputs) and three clients of 1-3 batches.
_W0 = np.array([[0.5, -0.25], [0.125, 1.0]], np.float32)
_CLIENTS = (
    ([[1.0, 2.0], [0.5, -1.0]], [[2.0, 0.0], [1.0, 1.0]]),
    ([[-1.0, 0.0], [3.0, 1.0], [0.0, 0.25]], [[-1.0, 2.0], [3.0, 0.0], [0.5, 0.5]]),
    ([[2.0, -2.0]], [[-1.0, 4.0]]),
)


def _linear_model_fn():
  import tensorflow as tf
  import tensorflow_federated as tff

  spec = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                                 y=tf.TensorSpec([None, 2], tf.float32))
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
      2, input_shape=(2,), kernel_initializer=tf.keras.initializers.Constant(_W0),
      bias_initializer=tf.keras.initializers.Constant(0.1))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)


def _client_datasets() -> list:
  import tensorflow as tf

  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.array(x, np.float32), y=np.array(y, np.float32))).batch(1)
      for x, y in _CLIENTS]


def learning_process_fingerprint(name: str, client_learning_rate: float = 0.05,
                                 **hparams) -> str:
  """The fingerprint of learning process `name` (FedCAda, FAFED): `ROUNDS` rounds
  of the registry's process, defaults overridden by `hparams`.

  The rounds run as the study's experiments run them, in this Python process
  (`pipeline.backends.inprocess`, one client at a time, accumulated in client order):
  TFF's default context would start a `worker_binary` that outlives the caller.
  """
  from tff_fedadamom.optimizers import get_spec, resolve_hparams
  from tff_fedadamom.pipeline.backends.inprocess import InProcessLearningProcess

  spec = get_spec(name)
  process = InProcessLearningProcess(
      spec.builder(_linear_model_fn, client_learning_rate, **resolve_hparams(name, **hparams)),
      devices=["CPU:0"], max_concurrent_clients=1)
  state = process.initialize()
  for _ in range(ROUNDS):
    state = process.next(state, _client_datasets()).state
  return _digest(_numeric_leaves(state.global_model_weights)
                 + _numeric_leaves(process.get_hparams(state)))


def _compute(name: str) -> str:
  from tff_fedadamom.optimizers import is_learning_process

  if is_learning_process(name):
    return learning_process_fingerprint(name)
  return server_optimizer_fingerprint(name)


# Where computed fingerprints are kept between processes: beside the compiled
# learning processes (`tff_fedadamom.pipeline.process_cache`), one file.
MEMO_FILE = "fingerprints.json"


@functools.lru_cache(maxsize=1)
def _memo_key() -> str:
  """What every fingerprint is a function of: the package's source, this file,
  the fixed inputs' version and the numeric libraries' versions. A memo entry
  made under another key is never read, so a changed update rule is computed
  afresh; a refactor only costs one recomputation (the units keep their keys,
  which hold the fingerprints, not this key)."""
  from tff_fedadamom.pipeline import process_cache

  with open(os.path.abspath(__file__), "rb") as f:
    this_file = hashlib.sha256(f.read()).hexdigest()[:16]
  text = json.dumps({**process_cache.versions(), "numpy": np.__version__,
                     "fingerprint.py": this_file, "version": VERSION}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def _memo_path() -> str:
  from tff_fedadamom.pipeline import process_cache

  return os.path.join(process_cache.default_directory(), MEMO_FILE)


def _read_memo() -> dict:
  try:
    with open(_memo_path()) as f:
      memo = json.load(f)
  except (OSError, ValueError):
    return {}
  entries = memo.get("fingerprints") if memo.get("key") == _memo_key() else None
  return dict(entries) if isinstance(entries, dict) else {}


def _write_memo(entries: Mapping[str, str]) -> None:
  """Adds `entries` to the memo (a whole-file atomic replace; a concurrent writer
  may drop an entry, which is then computed again)."""
  from tff_fedadamom.atomic_io import atomic_write_bytes

  merged = {**_read_memo(), **entries}
  path = _memo_path()
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, json.dumps({"key": _memo_key(), "fingerprints": merged},
                                        sort_keys=True).encode())
  except OSError:
    pass  # a read-only cache directory: fingerprints are computed in each process


@functools.lru_cache(maxsize=None)
def fingerprint(name: str) -> str:
  """The fingerprint of registry method `name` at its defaults: once per process,
  and once per machine for as long as the code and libraries stay the same
  (FedCAda's and FAFED's build a learning process, seconds each)."""
  memo = _read_memo()
  if name not in memo:
    memo[name] = _compute(name)
    _write_memo({name: memo[name]})
  return memo[name]


def fingerprints(names: Iterable[str]) -> Mapping[str, str]:
  """{name: fingerprint} for every method in `names`, sorted by name."""
  return {n: fingerprint(n) for n in sorted(set(names))}


def main() -> None:
  """Prints every registered method's fingerprint (`python -m
  benchmarks.paper.fingerprint`): compare across machines or commits."""
  from tff_fedadamom.optimizers import list_optimizers

  for name, value in fingerprints(list_optimizers()).items():
    print(f"{name} {value}")


if __name__ == "__main__":
  main()
