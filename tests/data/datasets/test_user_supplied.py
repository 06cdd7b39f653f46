"""CIFAR-10/100, Tiny ImageNet and (F)EMNIST on tiny files written in the real formats."""

import numpy as np
import pytest

from tff_fedadamom.data import DataNotFoundError, load_federated_data
from tff_fedadamom.data.datasets import cifar, tiny_imagenet
from tests.data import fixtures


def test_cifar10_reads_batches_as_hwc(tmp_path):
  fixtures.write_cifar10(str(tmp_path), per_batch=4, test=5)
  data = cifar.load_cifar10(path=str(tmp_path))  # the parent folder works too
  assert data.x_train.shape == (20, 32, 32, 3) and data.x_test.shape == (5, 32, 32, 3)
  assert data.num_classes == 10 and data.y_train.dtype == np.int32
  # Image 0 of data_batch_1 has red plane 4, green 100, blue 200 at every pixel.
  np.testing.assert_array_equal(data.x_train[0, 7, 9], [4, 100, 200])
  np.testing.assert_array_equal(data.y_train[:4], [1, 2, 3, 4])
  fd = load_federated_data("cifar10", path=str(tmp_path / "cifar-10-batches-py"),
                           num_clients=4, partition="iid")
  assert fd.input_shape == (32, 32, 3) and sorted(fd.train.client_sizes.values()) == [5] * 4
  x = next(iter(fd.test))["x"].numpy()
  np.testing.assert_allclose(x[0, 0], np.array([0, 100, 200]) / 255.0, rtol=1e-6)


def test_cifar100_label_modes(tmp_path):
  fixtures.write_cifar100(str(tmp_path))
  fine = load_federated_data("cifar100", path=str(tmp_path), num_clients=3, partition="iid")
  coarse = load_federated_data("cifar100", path=str(tmp_path), num_clients=3,
                               partition="iid", label_mode="coarse")
  assert fine.num_classes == 100 and coarse.num_classes == 20
  y_fine = sorted(int(e["y"]) for e in fine.test)
  assert y_fine == sorted((7 * i) % 100 for i in range(6))
  assert max(int(e["y"]) for e in coarse.test) < 20
  with pytest.raises(ValueError, match="fine, coarse"):
    load_federated_data("cifar100", path=str(tmp_path), label_mode="medium")


@pytest.mark.parametrize("name, folder, url", [
    ("cifar10", "cifar-10-batches-py", "cifar-10-python.tar.gz"),
    ("cifar100", "cifar-100-python", "cifar-100-python.tar.gz"),
    ("tiny_imagenet", "tiny-imagenet-200", "tiny-imagenet-200.zip"),
])
def test_missing_user_data_says_what_where_how(tmp_path, name, folder, url):
  with pytest.raises(DataNotFoundError) as err:
    load_federated_data(name, path=str(tmp_path))
  message = str(err.value)
  assert folder in message and str(tmp_path) in message and url in message
  with pytest.raises(DataNotFoundError, match="no path given"):
    load_federated_data(name)


def test_tiny_imagenet_layout(tmp_path):
  fixtures.write_tiny_imagenet(str(tmp_path), wnids=("n02", "n01"), per_class=3)
  data = tiny_imagenet.load(path=str(tmp_path / "tiny-imagenet-200"))
  assert data.num_classes == 2
  assert data.x_train.shape == (6, 64, 64, 3) and data.x_test.shape == (4, 64, 64, 3)
  # Labels index the sorted wnids: n01 -> 0, n02 -> 1; files are read class by class.
  np.testing.assert_array_equal(data.y_train, [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(data.y_test, [1, 0, 1, 0])
  # Greyscale image (#1) expanded to 3 channels, odd-sized image (#2) resized.
  assert abs(int(data.x_train[1].mean()) - 80) <= 2
  assert np.all(data.x_train[1, ..., 0] == data.x_train[1, ..., 2])
  assert abs(int(data.x_train[2, 32, 32, 0]) - 120) <= 2
  fd = load_federated_data("tiny_imagenet", path=str(tmp_path), num_clients=2,
                           partition="iid")
  assert fd.input_shape == (64, 64, 3) and fd.num_classes == 2


def test_tiny_imagenet_missing_validation_image(tmp_path):
  folder = fixtures.write_tiny_imagenet(str(tmp_path))
  (tmp_path / "tiny-imagenet-200" / "val" / "images" / "val_1.JPEG").unlink()
  with pytest.raises(DataNotFoundError, match="val_1.JPEG"):
    tiny_imagenet.load(path=folder)


@pytest.mark.parametrize("name, num_classes", [("emnist", 10), ("femnist", 62)])
def test_emnist_from_a_tff_sqlite_file(tmp_path, name, num_classes):
  fixtures.write_emnist_sqlite(str(tmp_path), num_writers=3, per_writer=4)
  fd = load_federated_data(name, path=str(tmp_path))
  assert fd.num_classes == num_classes and fd.input_shape == (28, 28, 1)
  assert fd.train.client_ids == ["f0000_00", "f0001_00", "f0002_00"]
  ds = fd.train.create_tf_dataset_for_client("f0001_00")
  assert ds.element_spec["x"].shape == (28, 28, 1) and ds.element_spec["y"].shape == ()
  got = list(ds.as_numpy_iterator())
  assert len(got) == 4 and got[0]["x"].dtype == np.float32
  np.testing.assert_allclose(got[0]["x"], 0.5)
  expected = sorted((7 + i) % num_classes for i in range(4))
  assert sorted(int(e["y"]) for e in got) == expected
  assert sum(1 for _ in fd.test) == 12
  capped = load_federated_data(name, path=str(tmp_path / "emnist_all.sqlite"),
                               max_clients=2, seed=0)
  assert len(capped.train.client_ids) == 2
  assert set(capped.train.client_ids) < set(fd.train.client_ids)
  cid = capped.train.client_ids[0]
  ys = [[int(e["y"]) for e in d.train.create_tf_dataset_for_client(cid).as_numpy_iterator()]
        for d in (capped, fd)]
  assert ys[0] == ys[1]


def test_emnist_missing_file_never_reaches_tff(tmp_path):
  with pytest.raises(DataNotFoundError) as err:
    load_federated_data("femnist", path=str(tmp_path))
  assert "emnist_all.sqlite" in str(err.value) and str(tmp_path) in str(err.value)
  assert "emnist_all.sqlite.lzma" in str(err.value)
  assert list(tmp_path.iterdir()) == []  # nothing downloaded or created
  with pytest.raises(ValueError, match="emnist_all.sqlite"):
    load_federated_data("emnist", path=str(tmp_path / "other.sqlite"))
  with pytest.raises(ValueError, match="max_clients"):
    load_federated_data("emnist", path=str(tmp_path), num_clients=3)
