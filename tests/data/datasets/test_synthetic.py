"""FedProx Synthetic(alpha, beta): devices, shapes, seeding, and heterogeneity."""

import numpy as np
import pytest

from tff_fedadamom.data import load_federated_data
from tff_fedadamom.data.datasets import synthetic


def test_default_devices_shapes_and_pooled_test_set():
  fd = load_federated_data("synthetic", seed=0)
  assert len(fd.train.client_ids) == 30 and fd.input_shape == (60,)
  assert fd.num_classes == 10
  devices = synthetic.generate(30, 1.0, 1.0, False, seed=0)
  sizes = fd.train.client_sizes
  assert len(devices) == 30
  for cid, (x, y) in zip(fd.train.client_ids, devices):
    assert len(y) >= 50
    assert sizes[cid] == int(len(y) * 0.9)
  assert int(fd.test.cardinality()) == sum(len(y) for _, y in devices) - sum(sizes.values())
  e = next(iter(fd.train.create_tf_dataset_for_client("c0000")))
  assert e["x"].shape == (60,) and e["x"].dtype.name == "float32"
  assert e["y"].dtype.name == "int32" and 0 <= int(e["y"]) < 10


def test_seeded_and_num_clients():
  a = synthetic.generate(5, 1.0, 1.0, False, seed=3)
  b = synthetic.generate(5, 1.0, 1.0, False, seed=3)
  c = synthetic.generate(5, 1.0, 1.0, False, seed=4)
  assert len(a) == len(b) == 5
  for (xa, ya), (xb, yb) in zip(a, b):
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
  assert not np.array_equal(a[0][0][:10], c[0][0][:10])
  fd = load_federated_data("synthetic", num_clients=7, seed=0, alpha=0.5, beta=0.5)
  assert len(fd.train.client_ids) == 7


def test_feature_covariance_decays_and_iid_is_more_homogeneous():
  x = np.concatenate([x for x, _ in synthetic.generate(10, 0.0, 0.0, True, seed=0)])
  var = x.var(axis=0)  # iid: v_k = 0, so var_j = j^-1.2
  np.testing.assert_allclose(var[[0, 9, 59]], np.array([1, 10, 60.0]) ** -1.2, rtol=0.15)
  het = lambda **kw: load_federated_data("synthetic", seed=0, **kw).partition_summary[
      "heterogeneity"]["mean_tv_distance"]
  assert het(iid=True) < het(alpha=1.0, beta=1.0)


def test_bad_options():
  with pytest.raises(ValueError, match="alpha and beta"):
    load_federated_data("synthetic", alpha=-1.0)
  with pytest.raises(ValueError, match="num_clients"):
    load_federated_data("synthetic", num_clients=0)
