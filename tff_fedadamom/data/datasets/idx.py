"""A reader for the IDX format of (Fashion-)MNIST, optionally gzip-compressed.

IDX: two zero bytes, a type code (0x08 = uint8, ...), the number of dimensions, then
each dimension as a big-endian uint32, then the data in C order, big-endian.
"""

from __future__ import annotations

import functools
import gzip
import os

import numpy as np

_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads one IDX file (``.gz`` is decompressed) into a native-endian, read-only
  numpy array.

  A process decompresses a file once (Fashion-MNIST's training images take about
  0.3 s): the last few arrays read are kept while their file's size and
  modification time stay the same, so the runs of a sweep worker or of the paper
  study, one after another, share them.
  """
  path = os.fspath(path)
  stat = os.stat(path)
  return _read_idx(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)  # Fashion-MNIST's four files
def _read_idx(path: str, mtime_ns: int, size: int) -> np.ndarray:
  del mtime_ns, size  # the cache key: a changed file is read again
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
    raise ValueError(f"{path} is not an IDX file (bad magic {data[:4]!r}).")
  ndim = data[3]
  header = 4 + 4 * ndim
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
  dtype = np.dtype(_DTYPES[data[2]])
  expected = int(np.prod(shape)) * dtype.itemsize
  if len(data) - header != expected:
    raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data), "
                     f"but the file holds {len(data) - header}.")
  array = np.frombuffer(data, dtype, offset=header).reshape(shape)
  if dtype.itemsize > 1:
    # Big-endian on disk: a native-order copy. Bytes have no order, and an
    # array over the read `bytes` is read-only already (47 MB not copied for
    # Fashion-MNIST's training images).
    array = array.astype(dtype.newbyteorder("="), copy=True)
    array.setflags(write=False)
  return array


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
  """Writes an array as IDX (gzip when the name ends in ``.gz``); used to build fixtures."""
  path = os.fspath(path)
  array = np.asarray(array)
  codes = {np.dtype(v).newbyteorder("="): k for k, v in _DTYPES.items()}
  code = codes[array.dtype.newbyteorder("=")]
  payload = (bytes([0, 0, code, array.ndim])
             + np.asarray(array.shape, ">u4").tobytes()
             + array.astype(np.dtype(_DTYPES[code])).tobytes())
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(payload)
