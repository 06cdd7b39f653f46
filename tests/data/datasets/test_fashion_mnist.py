"""Fashion-MNIST from the Debian package's IDX files (real data), and the IDX reader."""

import gzip
import os

import numpy as np
import pytest

from tests.data.fixtures import write_idx
from tff_fedadamom.data import DataNotFoundError, load_federated_data
from tff_fedadamom.data.datasets import fashion_mnist
from tff_fedadamom.data.datasets import idx
from tff_fedadamom.data.datasets.idx import read_idx


def test_real_files_parse_to_the_official_splits():
  data = fashion_mnist.load()
  assert data.x_train.shape == (60000, 28, 28, 1) and data.x_train.dtype == np.uint8
  assert data.x_test.shape == (10000, 28, 28, 1)
  assert data.y_train.dtype == np.int32
  # Known facts of the published files: 6,000 / 1,000 per class; the first image of
  # both splits is an ankle boot (9).
  np.testing.assert_array_equal(np.bincount(data.y_train), np.full(10, 6000))
  np.testing.assert_array_equal(np.bincount(data.y_test), np.full(10, 1000))
  assert data.y_train[0] == 9 and data.y_test[0] == 9
  assert data.x_train.max() == 255 and data.x_train[0, 0, 0, 0] == 0


def test_federated_fashion_mnist_shapes_and_clients():
  fd = load_federated_data("fashion_mnist", num_clients=10, partition="iid", seed=0)
  assert fd.input_shape == (28, 28, 1) and fd.num_classes == 10
  assert len(fd.train.client_ids) == 10
  assert sum(fd.train.client_sizes.values()) == 60000
  assert int(fd.test.cardinality()) == 10000
  x = next(iter(fd.train.create_tf_dataset_for_client("c0004").batch(500)))["x"].numpy()
  assert x.dtype == np.float32 and x.min() == 0.0 and x.max() == 1.0
  assert fd.partition_summary["partition"] == {"method": "iid", "options": {}, "seed": 0}


def test_path_overrides_the_folder(tmp_path):
  rng = np.random.default_rng(0)
  for stem, array in [("train-images-idx3-ubyte", rng.integers(0, 255, (6, 28, 28))),
                      ("train-labels-idx1-ubyte", np.arange(6) % 3),
                      ("t10k-images-idx3-ubyte", rng.integers(0, 255, (2, 28, 28))),
                      ("t10k-labels-idx1-ubyte", np.array([1, 2]))]:
    write_idx(tmp_path / (stem + ".gz"), array.astype(np.uint8))
  data = fashion_mnist.load(path=str(tmp_path))
  assert data.x_train.shape == (6, 28, 28, 1)
  np.testing.assert_array_equal(data.y_test, [1, 2])


def test_missing_files_say_what_where_and_how(tmp_path):
  write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, np.uint8))  # not gzipped
  with pytest.raises(DataNotFoundError) as err:
    load_federated_data("fashion_mnist", path=str(tmp_path))
  message = str(err.value)
  assert "train-images-idx3-ubyte" in message and "t10k-labels-idx1-ubyte" in message
  assert "train-labels-idx1-ubyte[" not in message  # found uncompressed
  assert str(tmp_path) in message and "apt-get install dataset-fashion-mnist" in message
  assert isinstance(err.value, FileNotFoundError)


def test_idx_round_trip_and_corrupt_files(tmp_path):
  array = np.arange(24, dtype=np.int32).reshape(2, 3, 4) - 5
  write_idx(tmp_path / "a.idx.gz", array)
  read = read_idx(tmp_path / "a.idx.gz")
  np.testing.assert_array_equal(read, array)
  # Big-endian on disk, native in memory, and read-only like a one-byte array.
  assert read.dtype == np.dtype("=i4") and not read.flags.writeable
  with gzip.open(tmp_path / "bad.gz", "wb") as f:
    f.write(b"\x00\x00\x08\x01\x00\x00\x00\x09abc")  # says 9 bytes, holds 3
  with pytest.raises(ValueError, match="9 bytes"):
    read_idx(tmp_path / "bad.gz")
  (tmp_path / "text").write_text("hello")
  with pytest.raises(ValueError, match="not an IDX"):
    read_idx(tmp_path / "text")


def test_a_file_is_read_once_until_it_changes(tmp_path):
  path = tmp_path / "a.idx"
  write_idx(path, np.arange(6, dtype=np.uint8))
  first = read_idx(path)
  assert read_idx(path) is first  # kept: the runs of one process share it
  assert not first.flags.writeable  # so that no run can change another's
  write_idx(path, np.arange(7, dtype=np.uint8))
  os.utime(path, ns=(1, 1))  # a new modification time even on a coarse clock
  np.testing.assert_array_equal(read_idx(path), np.arange(7, dtype=np.uint8))


def test_a_gzipped_file_is_decompressed_once_per_machine(tmp_path, monkeypatch):
  """The first read keeps a plain copy in the data cache; a later process (here:
  the in-process memo cleared) maps that copy and never opens the gzip file."""
  monkeypatch.setenv(idx.DATA_DIRECTORY_ENV, str(tmp_path / "cache"))
  path = tmp_path / "a.idx.gz"
  array = (np.arange(60, dtype=np.int32).reshape(3, 4, 5) * 7 - 100)
  write_idx(path, array)
  np.testing.assert_array_equal(read_idx(path), array)
  stat = os.stat(path)
  copy = idx.decompressed_path(str(path), stat.st_mtime_ns, stat.st_size)
  assert os.listdir(tmp_path / "cache") == [os.path.basename(copy)]  # no temporary file left
  assert gzip.decompress(path.read_bytes()) == open(copy, "rb").read()

  idx._read_idx.cache_clear()  # noqa: SLF001 - as a new process starts
  def no_gzip(*_, **__):
    raise AssertionError("the gzip file was decompressed again")
  monkeypatch.setattr(idx.gzip, "open", no_gzip)
  again = read_idx(path)
  np.testing.assert_array_equal(again, array)
  assert again.dtype == np.dtype("=i4") and not again.flags.writeable
  monkeypatch.undo()

  # A changed file is another copy, which replaces the old one; a copy of
  # another file stays.
  monkeypatch.setenv(idx.DATA_DIRECTORY_ENV, str(tmp_path / "cache"))
  write_idx(tmp_path / "other.idx.gz", array[:1])
  read_idx(tmp_path / "other.idx.gz")
  write_idx(path, array[:2])
  os.utime(path, ns=(1, 1))
  np.testing.assert_array_equal(read_idx(path), array[:2])
  np.testing.assert_array_equal(again, array)  # mapped from the removed copy: intact
  stat = os.stat(path)
  kept = sorted(os.listdir(tmp_path / "cache"))
  assert len(kept) == 2 and os.path.basename(copy) not in kept
  assert os.path.basename(idx.decompressed_path(str(path), stat.st_mtime_ns,
                                                stat.st_size)) in kept


def test_a_damaged_copy_is_decompressed_again_and_an_unwritable_cache_only_warns(
    tmp_path, monkeypatch, caplog):
  monkeypatch.setenv(idx.DATA_DIRECTORY_ENV, str(tmp_path / "cache"))
  path = tmp_path / "b.idx.gz"
  array = np.arange(50, dtype=np.uint8).reshape(5, 10)
  write_idx(path, array)
  read_idx(path)
  stat = os.stat(path)
  copy = idx.decompressed_path(str(path), stat.st_mtime_ns, stat.st_size)
  with open(copy, "r+b") as f:
    f.truncate(20)  # cut short after it was written
  idx._read_idx.cache_clear()  # noqa: SLF001 - as a new process starts
  with caplog.at_level("WARNING", logger=idx.__name__):
    np.testing.assert_array_equal(read_idx(path), array)
  assert "is damaged" in caplog.text and str(path) in caplog.text
  assert os.path.getsize(copy) == 4 + 2 * 4 + array.size  # whole again

  # A cache folder that cannot be made: the array is read all the same.
  (tmp_path / "file").write_text("not a folder")
  monkeypatch.setenv(idx.DATA_DIRECTORY_ENV, str(tmp_path / "file" / "cache"))
  idx._read_idx.cache_clear()  # noqa: SLF001
  caplog.clear()
  with caplog.at_level("WARNING", logger=idx.__name__):
    np.testing.assert_array_equal(read_idx(path), array)
  assert idx.DATA_DIRECTORY_ENV in caplog.text


def test_decompressed_copies_live_in_the_users_cache_unless_moved(tmp_path, monkeypatch):
  monkeypatch.delenv(idx.DATA_DIRECTORY_ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  copy = idx.decompressed_path("/data/a.gz", 1, 2)
  assert os.path.dirname(copy) == str(tmp_path / "xdg" / "tff-fedadamom" / "data")
  assert idx.decompressed_path("/data/a.gz", 1, 3) != copy  # another size: another copy
  monkeypatch.setenv(idx.DATA_DIRECTORY_ENV, str(tmp_path / "own"))
  assert os.path.dirname(idx.decompressed_path("/data/a.gz", 1, 2)) == str(tmp_path / "own")
