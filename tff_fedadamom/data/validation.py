"""A validation set held out from the training clients: tuning without the test set.

Hparams chosen by their test accuracy make that test accuracy an optimistic
estimate. Here `fraction` of every training client's examples is set aside (a
draw seeded by the data seed and the client's position), the clients train on
the rest, and the pooled held-out examples are the validation set, evaluated
like the test set (`validation/...` metrics). Each client keeps at least one
example, and its remaining examples in their order.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from tff_fedadamom.data.base import FederatedData
from tff_fedadamom.data.client_data import (ArrayClientData, held_out_dataset,
                                           read_client_arrays)

# The stream of the data seed the split draws from (partitions draw from others).
_STREAM = 8_111


def hold_out_validation(data: FederatedData, fraction: float, seed: int) -> FederatedData:
  """`data` with `fraction` (in (0, 1)) of each training client's examples moved to
  `data.validation`."""
  if not 0 < fraction < 1:
    raise ValueError(f"fraction must be in (0, 1), found {fraction!r}")
  kept, held = {}, []
  for position, client_id in enumerate(data.train.client_ids):
    arrays = read_client_arrays(data.train, client_id)
    n = len(next(iter(arrays.values())))
    order = np.random.default_rng([seed, _STREAM, position]).permutation(n)
    out = np.sort(order[:min(n - 1, int(fraction * n))])
    stay = np.sort(order[len(out):])
    kept[client_id] = collections.OrderedDict((k, v[stay]) for k, v in arrays.items())
    held.append(collections.OrderedDict((k, v[out]) for k, v in arrays.items()))
  validation = held_out_dataset(collections.OrderedDict(
      (k, np.concatenate([h[k] for h in held])) for k in held[0]))
  return dataclasses.replace(data, train=ArrayClientData(kept), validation=validation)
