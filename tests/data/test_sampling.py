"""Client sampling: a function of (seed, round) alone."""

import numpy as np
import pytest

from tff_fedadamom.data.sampling import UniformSampler, sample_clients


def test_sample_clients_is_a_function_of_seed_and_round():
  ids = [f"c{i}" for i in range(20)]
  a = sample_clients(ids, 5, seed=1, round_num=7)
  assert a == sample_clients(ids, 5, seed=1, round_num=7)
  assert len(set(a)) == 5
  assert a != sample_clients(ids, 5, seed=1, round_num=8)
  assert a != sample_clients(ids, 5, seed=2, round_num=7)


def test_sample_clients_draws_from_the_generator_of_seed_and_round():
  ids = [f"c{i}" for i in range(20)]
  # The scheme is fixed (saved runs resume with the clients they sampled): numpy's
  # generator seeded with the (seed, round) pair, drawing without replacement.
  expected = np.random.default_rng([4, 9]).choice(20, size=6, replace=False)
  assert sample_clients(ids, 6, seed=4, round_num=9) == [f"c{i}" for i in expected]


def test_uniform_sampler_is_sample_clients_of_the_round():
  ids = [f"c{i}" for i in range(12)]
  sampler = UniformSampler(tuple(ids), 4, seed=3)
  for round_num in (1, 2, 50):
    assert sampler(round_num) == sample_clients(ids, 4, 3, round_num)
  # Rounds sampled out of order (a resumed run) get the same clients.
  assert [sampler(r) for r in (3, 1)] == [sample_clients(ids, 4, 3, r) for r in (3, 1)]


@pytest.mark.parametrize("count", [0, 13])
def test_uniform_sampler_rejects_a_count_it_cannot_draw(count):
  with pytest.raises(ValueError, match=r"clients_per_round.*\[1, 12\]"):
    UniformSampler([f"c{i}" for i in range(12)], count, seed=0)
