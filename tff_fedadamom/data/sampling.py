"""Which clients train in a round: uniform sampling without replacement.

The round's clients are a function of (seed, round) alone: each round draws from
its own generator, seeded with the pair, and nothing touches a global RNG. So a
resumed run samples the clients an uninterrupted one would, and any process can
recompute a round's clients without the run's history (FedJAX's client samplers
are keyed by round too). A sampler is any callable `round_num -> list of client
ids`, like TFF's `client_selection_fn`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def sample_clients(client_ids: Sequence[Any], clients_per_round: int, seed: int,
                   round_num: int) -> list:
  """`clients_per_round` distinct clients of `client_ids`, a function of (seed, round) only."""
  rng = np.random.default_rng([seed, round_num])
  picked = rng.choice(len(client_ids), size=clients_per_round, replace=False)
  return [client_ids[i] for i in picked]


class UniformSampler:
  """`sample_clients` over fixed clients, count (in [1, len(client_ids)]) and seed:
  a callable of the round."""

  def __init__(self, client_ids: Sequence[Any], clients_per_round: int, seed: int):
    if not 1 <= clients_per_round <= len(client_ids):
      raise ValueError(f"UniformSampler `clients_per_round` must be an integer in "
                       f"[1, {len(client_ids)}], found {clients_per_round!r}.")
    self.client_ids = list(client_ids)
    self.clients_per_round = clients_per_round
    self.seed = seed

  def __call__(self, round_num: int) -> list:
    return sample_clients(self.client_ids, self.clients_per_round, self.seed, round_num)
