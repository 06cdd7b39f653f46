"""ArrayClientData: ids, element types, per-client graphs, the serializable lookup."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.data import ArrayClientData
from tff_fedadamom.data.client_data import arrays_to_dataset, client_id_strings, held_out_dataset


def _data(num_clients=12, per_client=5):
  n = num_clients * per_client
  arrays = collections.OrderedDict(
      x=(np.arange(n * 16) % 256).astype(np.uint8).reshape(n, 4, 4, 1),
      y=(np.arange(n) % 3).astype(np.int64))
  parts = np.array_split(np.arange(n), num_clients)
  return arrays, parts, ArrayClientData.from_partition(arrays, parts)


def test_ids_are_zero_padded_and_sort_numerically():
  assert client_id_strings(3) == ["c0000", "c0001", "c0002"]
  ids = client_id_strings(12345)
  assert ids[-1] == "c12344" and sorted(ids) == ids
  _, _, cd = _data()
  assert cd.client_ids == client_id_strings(12)
  assert isinstance(cd, tff.simulation.datasets.ClientData)


def test_client_dataset_holds_that_clients_examples_as_float_and_int32():
  arrays, parts, cd = _data()
  ds = cd.create_tf_dataset_for_client("c0007")
  assert ds.element_spec == cd.element_type_structure
  assert cd.element_type_structure == collections.OrderedDict(
      x=tf.TensorSpec((4, 4, 1), tf.float32), y=tf.TensorSpec((), tf.int32))
  got = list(ds.as_numpy_iterator())
  idx = parts[7]
  assert len(got) == len(idx) == cd.client_sizes["c0007"]
  np.testing.assert_allclose(np.stack([e["x"] for e in got]),
                             arrays["x"][idx].astype(np.float32) / 255.0)
  np.testing.assert_array_equal([e["y"] for e in got], arrays["y"][idx])


def test_client_graph_captures_only_that_clients_data():
  # 6,000 examples of 1 KiB in 60 clients: one client's dataset graph must be about
  # one client's 100 KiB, nowhere near the 6 MiB of the whole set.
  n = 6000
  arrays = collections.OrderedDict(
      x=np.random.default_rng(0).integers(0, 255, (n, 32, 32, 1), dtype=np.uint8),
      y=np.zeros(n, np.int32))
  cd = ArrayClientData.from_partition(arrays, np.array_split(np.arange(n), 60))
  graph = cd.create_tf_dataset_for_client("c0003")._as_serialized_graph().numpy()
  assert 100 * 1024 <= len(graph) < 300 * 1024


def test_serializable_dataset_fn_and_dataset_computation_agree():
  _, _, cd = _data()
  direct = [e["y"] for e in cd.create_tf_dataset_for_client("c0005").as_numpy_iterator()]
  via_fn = [e["y"] for e in cd.serializable_dataset_fn(tf.constant("c0005"))
            .as_numpy_iterator()]
  assert via_fn == direct
  via_tff = [e["y"] for e in cd.dataset_computation("c0005").as_numpy_iterator()]
  assert via_tff == direct
  everything = list(cd.create_tf_dataset_from_all_clients(seed=0).as_numpy_iterator())
  assert len(everything) == 60


def test_unknown_client_and_bad_input_raise():
  _, _, cd = _data()
  with pytest.raises(ValueError, match="not a client"):
    cd.create_tf_dataset_for_client("c9999")
  with pytest.raises(ValueError, match="at least one client"):
    ArrayClientData({})
  with pytest.raises(ValueError, match="non-empty"):
    ArrayClientData({"a": {"x": np.zeros((0, 2)), "y": np.zeros(0)}})
  with pytest.raises(ValueError, match="signature"):
    ArrayClientData({"a": {"x": np.zeros((1, 2)), "y": np.zeros(1)},
                     "b": {"x": np.zeros((1, 3)), "y": np.zeros(1)}})


@pytest.mark.parametrize("n", [2503, 7])
def test_a_held_out_set_converts_in_blocks_to_the_same_examples(n):
  rng = np.random.default_rng(n)
  arrays = collections.OrderedDict(x=rng.integers(0, 256, (n, 5, 3), dtype=np.uint8),
                                   y=rng.integers(0, 10, n).astype(np.int64))
  per_example = arrays_to_dataset(arrays)
  blocks = held_out_dataset(arrays)
  assert blocks.element_spec == per_example.element_spec
  assert int(blocks.cardinality()) == n
  expected, actual = list(per_example.batch(1000)), list(blocks.batch(1000))
  assert len(actual) == len(expected) == -(-n // 1000)
  for e, a in zip(expected, actual):
    for key in ("x", "y"):
      np.testing.assert_array_equal(a[key].numpy(), e[key].numpy())
  # Arrays that need no conversion are sliced as they are.
  floats = collections.OrderedDict(x=rng.normal(size=(n, 2)).astype(np.float32))
  np.testing.assert_array_equal(next(iter(held_out_dataset(floats).batch(n)))["x"], floats["x"])
