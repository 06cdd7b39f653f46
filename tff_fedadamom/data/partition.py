"""Partitioners: split a centralized data set's examples over simulated clients.

Every partitioner is ``fn(labels, num_clients, *, seed, **options) -> list[np.ndarray]``
of example indices (sorted, int64): every example goes to exactly one client; no client
is empty (it is given one example of the largest client); the result depends only on
the inputs and ``seed`` (``np.random.default_rng``, PCG64, the same stream on every
platform; never a global RNG), so a run can be resumed or repeated exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from tff_fedadamom.data.base import check_options, keyword_defaults


def _check_positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _check(labels: np.ndarray, num_clients: int) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}.")
  _check_positive_int("num_clients", num_clients)
  if len(labels) < num_clients:
    raise ValueError(f"Cannot give {num_clients} clients at least one example each: "
                     f"there are only {len(labels)} examples.")
  return labels


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
  """Fills empty clients from the largest one (lowest index on ties) and sorts."""
  parts = [np.asarray(p, dtype=np.int64) for p in parts]
  for i in range(len(parts)):
    if len(parts[i]) == 0:
      donor = int(np.argmax([len(p) for p in parts]))
      parts[i], parts[donor] = parts[donor][-1:], parts[donor][:-1]
  return [np.sort(p) for p in parts]


def iid(labels: np.ndarray, num_clients: int, *, seed: int) -> list[np.ndarray]:
  """A uniform random split; client sizes differ by at most one."""
  labels = _check(labels, num_clients)
  order = np.random.default_rng(seed).permutation(len(labels))
  return _finish(np.array_split(order, num_clients))


def dirichlet(labels: np.ndarray, num_clients: int, *, seed: int,
              alpha: float = 0.3) -> list[np.ndarray]:
  """The label skew of Hsu et al. (2019): each class is split among clients in
  Dirichlet(alpha) proportions; small alpha gives clients few, dominant labels."""
  labels = _check(labels, num_clients)
  if not alpha > 0:
    raise ValueError(f"dirichlet alpha must be > 0, got {alpha!r}.")
  rng = np.random.default_rng(seed)
  chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for label in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == label))
    shares = rng.dirichlet(np.full(num_clients, float(alpha)))
    cuts = (np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
    for client, piece in enumerate(np.split(members, cuts)):
      chunks[client].append(piece)
  return _finish([np.concatenate(c) for c in chunks])


def _shards_per_class(counts: np.ndarray, num_shards: int) -> np.ndarray:
  """Splits ``num_shards`` among classes in proportion to their sizes (largest
  remainder), at least one and at most ``count`` shards per class."""
  alloc = np.ones(len(counts), dtype=np.int64)
  quota = (num_shards - len(counts)) * counts / counts.sum()
  alloc += np.floor(quota).astype(np.int64)
  leftover = num_shards - alloc.sum()
  alloc[np.argsort(-(quota - np.floor(quota)), kind="stable")[:leftover]] += 1
  # A class cannot have more shards than examples: move the excess to the class whose
  # shards are currently largest.
  while np.any(alloc > counts):
    over = int(np.argmax(alloc - counts))
    alloc[over] -= 1
    room = np.where(alloc < counts, counts / alloc, -np.inf)
    alloc[int(np.argmax(room))] += 1
  return alloc


def shards(labels: np.ndarray, num_clients: int, *, seed: int,
           shards_per_client: int = 2) -> list[np.ndarray]:
  """The pathological split of McMahan et al. (2017): label-pure shards,
  ``shards_per_client`` per client, so a client sees at most that many labels."""
  labels = _check(labels, num_clients)
  _check_positive_int("shards_per_client", shards_per_client)
  classes, counts = np.unique(labels, return_counts=True)
  num_shards = num_clients * shards_per_client
  if num_shards < len(classes) or num_shards > len(labels):
    raise ValueError(
        f"shards: {num_clients} clients x {shards_per_client} shards = {num_shards} "
        f"shards, which must lie between the number of classes ({len(classes)}) and the "
        f"number of examples ({len(labels)}) so that every shard holds one label.")
  rng = np.random.default_rng(seed)
  pieces: list[np.ndarray] = []
  for label, n in zip(classes, _shards_per_class(counts, num_shards)):
    members = rng.permutation(np.flatnonzero(labels == label))
    pieces.extend(np.array_split(members, n))
  order = rng.permutation(num_shards)
  return _finish([np.concatenate([pieces[s] for s in order[i::num_clients]])
                  for i in range(num_clients)])


@dataclasses.dataclass(frozen=True)
class PartitionerSpec:
  """A registry entry: the partition function and its keyword options with defaults."""

  name: str
  fn: Callable[..., list[np.ndarray]]
  options: Mapping[str, Any]
  description: str


def _spec(fn: Callable[..., list[np.ndarray]], description: str) -> PartitionerSpec:
  return PartitionerSpec(fn.__name__, fn, keyword_defaults(fn, ("seed",)), description)


PARTITIONERS: Mapping[str, PartitionerSpec] = MappingProxyType({s.name: s for s in (
    _spec(dirichlet, "Per-class Dirichlet(alpha) label skew (Hsu et al. 2019); smaller "
          "alpha is more heterogeneous."),
    _spec(iid, "Uniform random split."),
    _spec(shards, "Label-pure shards per client (McMahan et al. 2017); at most "
          "shards_per_client labels per client."),
)})


def resolve_partition(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
  """Validates a partitioner name and options; returns the options with defaults."""
  if name not in PARTITIONERS:
    raise ValueError(f"Unknown partition {name!r}; valid partitions: "
                     f"{', '.join(sorted(PARTITIONERS))}.")
  options = dict(options or {})
  check_options("partition", name, options, PARTITIONERS[name].options)
  return {**PARTITIONERS[name].options, **options}


def partition(labels: np.ndarray, num_clients: int, *, method: str = "dirichlet",
              seed: int = 0, **options) -> list[np.ndarray]:
  """Runs the registered partitioner ``method`` with validated options."""
  resolved = resolve_partition(method, options)
  return PARTITIONERS[method].fn(labels, num_clients, seed=seed, **resolved)
