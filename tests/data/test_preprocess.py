"""Client and test input pipelines: shapes, epochs, seeded order, augmentation."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedadamom.data import preprocess
from tff_fedadamom.data.preprocess import client_dataset, client_round_seed


def _client(n=10, shape=(6, 6, 3)):
  x = np.arange(n * int(np.prod(shape)), dtype=np.float32).reshape((n,) + shape)
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x / x.max(), y=np.arange(n, dtype=np.int32)))


def _labels(ds):
  return np.concatenate([b["y"].numpy() for b in ds]).tolist()


def test_batch_shapes_and_remainder():
  ds = client_dataset(_client(10), batch_size=4, local_epochs=1, seed=0)
  assert [int(b["y"].shape[0]) for b in ds] == [4, 4, 2]
  assert ds.element_spec["x"].shape.as_list() == [None, 6, 6, 3]
  dropped = client_dataset(_client(10), batch_size=4, local_epochs=1, seed=0,
                           drop_remainder=True)
  assert [int(b["y"].shape[0]) for b in dropped] == [4, 4]


def test_epochs_multiply_elements_and_each_epoch_is_a_permutation():
  labels = _labels(client_dataset(_client(10), batch_size=3, local_epochs=3, seed=5))
  assert len(labels) == 30
  for epoch in range(3):
    assert sorted(labels[10 * epoch:10 * (epoch + 1)]) == list(range(10))
  assert labels[:10] != labels[10:20]  # reshuffled every epoch


def test_same_seed_same_order_other_round_other_order():
  seed_r1 = client_round_seed(0, 1, "c0001")
  a = _labels(client_dataset(_client(32), batch_size=8, local_epochs=1, seed=seed_r1))
  b = _labels(client_dataset(_client(32), batch_size=8, local_epochs=1, seed=seed_r1))
  c = _labels(client_dataset(_client(32), batch_size=8, local_epochs=1,
                             seed=client_round_seed(0, 2, "c0001")))
  assert a == b
  assert a != c and sorted(a) == sorted(c)
  assert a != list(range(32))


def test_client_round_seed_is_stable_and_distinct():
  # A fixed value: the derivation must not depend on the process (no hash()).
  assert client_round_seed(0, 0, "c0000") == 3714418032788926715
  seeds = {client_round_seed(s, r, c) for s in (0, 1) for r in range(5)
           for c in ("c0000", "c0001", 7)}
  assert len(seeds) == 30
  assert all(0 <= s < 2**63 for s in seeds)


def test_crop_flip_keeps_shapes_is_seeded_and_changes_images():
  run = lambda seed: [b["x"].numpy() for b in client_dataset(
      _client(8), batch_size=8, local_epochs=1, seed=seed, shuffle_buffer=1,
      augment="crop_flip")]
  plain = next(iter(client_dataset(_client(8), batch_size=8, local_epochs=1, seed=3,
                                   shuffle_buffer=1)))["x"].numpy()
  a, b, c = run(3), run(3), run(4)
  assert a[0].shape == (8, 6, 6, 3) and a[0].dtype == np.float32
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.array_equal(a[0], c[0])
  assert not np.array_equal(a[0], plain)
  # Crops of a zero-padded image: values come from the image or the zero padding.
  assert set(np.unique(a[0])) <= set(np.unique(plain)) | {0.0}


def test_augment_rejects_unknown_names_and_non_images():
  with pytest.raises(ValueError, match="crop_flip"):
    client_dataset(_client(), batch_size=2, local_epochs=1, seed=0, augment="mixup")
  flat = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=np.zeros((4, 60), np.float32), y=np.zeros(4, np.int32)))
  with pytest.raises(ValueError, match=r"\(H, W, C\)"):
    client_dataset(flat, batch_size=2, local_epochs=1, seed=0, augment="crop_flip")


def test_shuffle_buffer_defaults_to_client_size_for_a_full_shuffle():
  order = lambda ds, buf: _labels(client_dataset(ds, batch_size=64, local_epochs=1,
                                                 seed=11, shuffle_buffer=buf))
  assert order(_client(40), None) == order(_client(40), 40)
  assert order(_client(40), None) != order(_client(40), 2)
  unknown = _client(40).filter(lambda e: True)  # cardinality unknown: 1024 buffer
  assert order(unknown, None) == order(unknown, 1024)


def test_test_dataset_batches_everything():
  ds = preprocess.test_dataset(_client(10), batch_size=4)
  assert [int(b["y"].shape[0]) for b in ds] == [4, 4, 2]
  with pytest.raises(ValueError):
    preprocess.test_dataset(_client(10), batch_size=0)
