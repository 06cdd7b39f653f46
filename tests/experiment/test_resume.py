"""The checkpoint layout: a state's leaves packed into one array per dtype, given
back bit for bit in the initial state's shapes; checkpoints written one array
per leaf still load."""

import asyncio
import collections

import numpy as np
import pytest

from tests.helpers import state_leaves
from tff_fedadamom.experiment import resume


def _state(scale: float):
  """A nested state with leaves of several dtypes, shapes and sizes (a scalar and
  an empty array among them), dtypes interleaved."""
  return collections.OrderedDict(
      weights=[np.arange(12, dtype=np.float32).reshape(3, 4) * scale,
               np.float32(scale)],
      step=np.int64(7 * scale),
      slots=collections.OrderedDict(
          m=np.full((2, 2, 2), -scale, np.float32),
          count=np.array([1, 2, 3], np.int32) * int(scale),
          empty=np.zeros((0, 5), np.float32)),
      lr=np.float64(0.1 * scale),
      flag=np.array([True, False]))


def _assert_same_leaves(actual, expected):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    assert a.dtype == e.dtype and a.shape == e.shape
    np.testing.assert_array_equal(a, e)


def test_pack_holds_one_array_per_dtype_in_order_of_first_appearance():
  leaves = state_leaves(_state(3.0))
  packed = resume.pack_leaves(leaves)
  order = list(dict.fromkeys(leaf.dtype.str for leaf in leaves))
  assert len(order) == 5
  assert [(p.dtype.str, p.shape) for p in packed] == [
      (d, (sum(leaf.size for leaf in leaves if leaf.dtype.str == d),)) for d in order]
  float32 = packed[order.index("<f4")]
  np.testing.assert_array_equal(  # each leaf raveled in turn, in the leaves' order
      float32, np.concatenate([leaf.ravel() for leaf in leaves if leaf.dtype.str == "<f4"]))
  assert float32.size == 12 + 1 + 8 + 0


def test_unpack_gives_back_every_leaf_bit_for_bit_in_the_initial_shapes():
  leaves = state_leaves(_state(3.0))
  matrix = next(leaf for leaf in leaves if leaf.shape == (3, 4))
  matrix[1, 2] = np.nextafter(np.float32(1.0), np.float32(2.0))  # a last-bit value
  like = state_leaves(_state(0.0))  # same structure, other values
  _assert_same_leaves(resume.unpack_leaves(resume.pack_leaves(leaves), like), leaves)


def test_unpack_takes_a_checkpoint_of_one_array_per_leaf_as_it_is():
  leaves = state_leaves(_state(2.0))
  _assert_same_leaves(resume.unpack_leaves(leaves, state_leaves(_state(0.0))), leaves)


def test_unpack_refuses_arrays_of_another_state():
  like = state_leaves(_state(1.0))
  packed = resume.pack_leaves(like)
  with pytest.raises(ValueError, match="does not hold this run's state"):
    resume.unpack_leaves(packed[:-1], like)
  with pytest.raises(ValueError, match="does not hold this run's state"):
    resume.unpack_leaves([packed[0][:-1], *packed[1:]], like)


def test_saved_rounds_load_through_tffs_manager_in_both_layouts(tmp_path):
  """`save_state` writes the packed layout with TFF's manager; `load_checkpoint`
  reads it, and a round written one array per leaf (as before packing)."""
  manager = resume.state_manager(str(tmp_path))
  like = state_leaves(_state(0.0))
  resume.save_state(manager, _state(2.0), 2)
  asyncio.run(manager.save(state_leaves(_state(1.0)), version=1))  # the earlier layout
  stored = asyncio.run(manager.load(2, resume.pack_leaves(like)))
  assert len(stored) == len(resume.pack_leaves(like)) < len(like)
  leaves, round_num = resume.load_checkpoint(manager, like, str(tmp_path))
  assert round_num == 2
  _assert_same_leaves(leaves, state_leaves(_state(2.0)))
  leaves, round_num = resume.load_checkpoint(manager, like, str(tmp_path), at_most=1)
  assert round_num == 1
  _assert_same_leaves(leaves, state_leaves(_state(1.0)))
