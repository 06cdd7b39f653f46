"""Partition invariants: coverage, no empty client, seeding, heterogeneity, label limits."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tff_fedadamom.data import PARTITIONERS, partition_summary
from tff_fedadamom.data import partition as partition_lib

LABELS = np.repeat(np.arange(10), 60)  # 600 examples, 10 balanced classes


def _same_partition(a, b):
  """Whether two partitions give every client the same examples, in order."""
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _assert_exact_cover(parts, n, num_clients):
  assert len(parts) == num_clients
  assert all(len(p) > 0 for p in parts), [len(p) for p in parts]
  allocated = np.concatenate(parts)
  assert allocated.dtype == np.int64
  np.testing.assert_array_equal(np.sort(allocated), np.arange(n))


@pytest.mark.parametrize("method", sorted(PARTITIONERS))
def test_every_example_exactly_once_and_no_empty_client(method):
  parts = partition_lib.partition(LABELS, 17, method=method, seed=3)
  _assert_exact_cover(parts, len(LABELS), 17)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(20, 300), num_clients=st.integers(1, 20),
       num_classes=st.integers(1, 8), seed=st.integers(0, 2**32 - 1),
       alpha=st.floats(0.01, 50.0))
def test_dirichlet_invariants_hold_for_any_input(n, num_clients, num_classes, seed, alpha):
  labels = np.random.default_rng(seed).integers(0, num_classes, n)
  parts = partition_lib.dirichlet(labels, num_clients, seed=seed, alpha=alpha)
  _assert_exact_cover(parts, n, num_clients)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(30, 300), num_clients=st.integers(1, 10),
       num_classes=st.integers(1, 6), k=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_shards_invariants_hold_for_any_input(n, num_clients, num_classes, k, seed):
  labels = np.random.default_rng(seed).integers(0, num_classes, n)
  present = len(np.unique(labels))
  if num_clients * k < present:
    with pytest.raises(ValueError, match="shards"):
      partition_lib.shards(labels, num_clients, seed=seed, shards_per_client=k)
    return
  parts = partition_lib.shards(labels, num_clients, seed=seed, shards_per_client=k)
  _assert_exact_cover(parts, n, num_clients)
  assert max(len(np.unique(labels[p])) for p in parts) <= k


@pytest.mark.parametrize("method", sorted(PARTITIONERS))
def test_same_seed_same_partition_different_seed_different(method):
  a = partition_lib.partition(LABELS, 12, method=method, seed=7)
  b = partition_lib.partition(LABELS, 12, method=method, seed=7)
  c = partition_lib.partition(LABELS, 12, method=method, seed=8)
  assert len(a) == len(c) == 12
  assert _same_partition(a, b)
  assert not _same_partition(a, c)


def test_partitioners_neither_use_nor_advance_the_global_rng():
  np.random.seed(1)
  first = partition_lib.partition(LABELS, 5, method="dirichlet", seed=0)
  state = np.random.get_state()[1].copy()
  np.random.seed(999)
  second = partition_lib.partition(LABELS, 5, method="dirichlet", seed=0)
  assert _same_partition(first, second)
  np.random.seed(1)
  partition_lib.partition(LABELS, 5, method="iid", seed=0)
  np.testing.assert_array_equal(np.random.get_state()[1], state)


def test_iid_is_pinned_to_the_pcg64_stream():
  # Same seed -> same partition on any machine: the stream of default_rng is fixed.
  parts = partition_lib.iid(np.zeros(10, int), 3, seed=0)
  assert [p.tolist() for p in parts] == [[2, 4, 6, 7], [3, 5, 9], [0, 1, 8]]


def test_iid_sizes_differ_by_at_most_one():
  sizes = [len(p) for p in partition_lib.iid(LABELS, 7, seed=0)]
  assert max(sizes) - min(sizes) <= 1


def test_lower_alpha_gives_higher_heterogeneity():
  tv = []
  for alpha in (0.05, 0.3, 1.0, 10.0, 1000.0):
    parts = partition_lib.dirichlet(LABELS, 20, seed=0, alpha=alpha)
    tv.append(partition_summary(LABELS, parts, 10)["heterogeneity"]["mean_tv_distance"])
  assert tv == sorted(tv, reverse=True), tv
  assert tv[0] > 0.6 and tv[-1] < 0.15, tv


def test_shards_gives_at_most_k_labels_and_balanced_sizes():
  for k in (1, 2, 3):
    parts = partition_lib.shards(LABELS, 20, seed=1, shards_per_client=k)
    assert max(len(np.unique(LABELS[p])) for p in parts) <= k
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= k
  # k = 1 and 10 clients over 10 balanced classes: one whole class per client.
  parts = partition_lib.shards(LABELS, 10, seed=0, shards_per_client=1)
  assert sorted(int(np.unique(LABELS[p])[0]) for p in parts) == list(range(10))


def test_empty_clients_are_filled_deterministically():
  # With a tiny alpha almost every class lands on one client; the fix-up must still
  # give all 40 clients something, identically on every call.
  labels = np.repeat(np.arange(2), 30)
  a = partition_lib.dirichlet(labels, 40, seed=5, alpha=0.001)
  _assert_exact_cover(a, 60, 40)
  b = partition_lib.dirichlet(labels, 40, seed=5, alpha=0.001)
  assert _same_partition(a, b)


@pytest.mark.parametrize("call, match", [
    (lambda: partition_lib.iid(LABELS[:3], 4, seed=0), "only 3 examples"),
    (lambda: partition_lib.iid(LABELS, 0, seed=0), "positive integer"),
    (lambda: partition_lib.dirichlet(LABELS, 3, seed=0, alpha=0.0), "alpha"),
    (lambda: partition_lib.shards(LABELS, 3, seed=0, shards_per_client=2), "classes"),
    (lambda: partition_lib.shards(LABELS, 3, seed=0, shards_per_client=0), "positive"),
    (lambda: partition_lib.partition(LABELS, 3, method="nope"), "dirichlet, iid, shards"),
    (lambda: partition_lib.partition(LABELS, 3, method="iid", alpha=1), "'alpha'.*none"),
    (lambda: partition_lib.partition(LABELS, 3, method="dirichlet", beta=1),
     "'beta'.*valid options: alpha"),
])
def test_bad_arguments_raise_value_error(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_registry_lists_options_with_defaults():
  assert dict(PARTITIONERS["dirichlet"].options) == {"alpha": 0.3}
  assert dict(PARTITIONERS["shards"].options) == {"shards_per_client": 2}
  assert dict(PARTITIONERS["iid"].options) == {}
  with pytest.raises(TypeError):
    PARTITIONERS["dirichlet"].options["alpha"] = 1.0
