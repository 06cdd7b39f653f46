"""The data layer's value types: what a loader returns and how a dataset is registered.

A *centralized* data set's loader (Fashion-MNIST, CIFAR, ...) returns
:class:`CentralizedData`, whose train part the registry splits over clients with a
partitioner; a *natural* one's (Shakespeare, EMNIST, Synthetic) has its own clients
and returns a finished :class:`FederatedData`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class DataNotFoundError(FileNotFoundError):
  """A data set's files are not where they were looked for: the message says what is
  missing, where it was looked for, and how to obtain it (nothing here downloads)."""


def not_found(what: str, looked_in, how: str) -> DataNotFoundError:
  """Builds the one uniform :class:`DataNotFoundError` message."""
  if isinstance(looked_in, (str, bytes)) or not hasattr(looked_in, "__iter__"):
    looked_in = [looked_in]
  places = ", ".join(str(p) for p in looked_in) or "(no location given)"
  return DataNotFoundError(f"{what} not found. Looked in: {places}. To obtain it: {how}")


def keyword_defaults(fn: Callable, skip: Iterable[str] = ()) -> Mapping[str, Any]:
  """``fn``'s keyword-only parameters and their defaults, read-only: a registry reads
  the options off the function, so the two cannot disagree."""
  return MappingProxyType({key: p.default for key, p in inspect.signature(fn).parameters.items()
                           if key not in skip and p.kind == p.KEYWORD_ONLY})


def check_options(kind: str, name: str, given: Iterable[str], valid: Iterable[str]) -> None:
  """Raises ValueError naming the options in ``given`` that the ``kind`` ``name`` lacks."""
  valid = sorted(valid)
  unknown = sorted(set(given) - set(valid))
  if unknown:
    raise ValueError(f"Unknown option(s) {', '.join(map(repr, unknown))} for {kind} "
                     f"{name!r}; valid options: {', '.join(valid) or '(none)'}.")


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """A federated data set ready for TFF.

  Attributes:
    train: Per-client training data; unbatched elements ``OrderedDict(x=..., y=...)``.
    test: The centralized held-out set, unbatched, with the same element structure.
    num_classes: Number of classes (for next-character tasks, the vocabulary size).
    partition_summary: :func:`tff_fedadamom.data.partition_summary`, or None where
      it would mean reading the whole data set (EMNIST from SQLite).
    validation: Held out from the training clients (`hold_out_validation`), or None.
  """

  name: str
  train: tff.simulation.datasets.ClientData
  test: tf.data.Dataset
  input_shape: tuple[int, ...]
  num_classes: int
  partition_summary: Optional[dict] = None
  validation: Optional[tf.data.Dataset] = None


@dataclasses.dataclass(frozen=True)
class CentralizedData:
  """One train and one test split as numpy arrays (images uint8 HWC, labels int)."""

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """A registry entry.

  Attributes:
    loader: ``loader(*, path, seed, **options) -> CentralizedData``, or with
      ``natural_clients`` (the data set has its own clients: no partitioner)
      ``loader(*, path, seed, num_clients, **options) -> FederatedData``.
    needs_path: The user must supply the files (``path=``).
    options: The data set's keyword options with their defaults (read-only).
  """

  name: str
  loader: Callable[..., Any]
  natural_clients: bool
  needs_path: bool
  options: Mapping[str, Any]
  description: str
  source: str
  license: str
