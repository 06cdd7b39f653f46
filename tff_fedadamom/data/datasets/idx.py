"""A reader for the IDX format of (Fashion-)MNIST, optionally gzip-compressed.

IDX: two zero bytes, a type code (0x08 = uint8, ...), the number of dimensions, then
each dimension as a big-endian uint32, then the data in C order, big-endian.

A gzip-compressed file is decompressed once per machine: its plain copy is kept in
the user's cache (`cache_dirs`, kind `data`; `$TFF_FEDADAMOM_DATA_CACHE_DIR` moves
it), and later reads map that copy into memory, so the processes of one machine
share its pages. The copy is named after the compressed file's path, size and
modification time, so a changed file is decompressed again (its new copy replaces
the old one), and written whole before it is renamed into place.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
import mmap
import os

import numpy as np

from tff_fedadamom import cache_dirs
from tff_fedadamom.atomic_io import atomic_write_bytes

LOG = logging.getLogger(__name__)

_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
# The environment variable that moves the decompressed copies (e.g. for a test session).
DATA_DIRECTORY_ENV = "TFF_FEDADAMOM_DATA_CACHE_DIR"


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads one IDX file into a native-endian, read-only numpy array.

  The last few arrays read are kept while their file's size and modification
  time stay the same, so the runs one process makes one after another share them.
  """
  path = os.fspath(path)
  stat = os.stat(path)
  return _read_idx(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)  # Fashion-MNIST's four files
def _read_idx(path: str, mtime_ns: int, size: int) -> np.ndarray:
  if not path.endswith(".gz"):
    # Read, not mapped: a file changed in place while mapped would crash the
    # process (SIGBUS) where a read one is only out of date. The copies below
    # are only ever replaced by a rename, which leaves a mapped one intact.
    with open(path, "rb") as f:
      return _parse(path, f.read())
  copy = decompressed_path(path, mtime_ns, size)
  if os.path.isfile(copy):
    try:
      # Mapped read-only. (A copy is never empty: an empty file, which cannot be
      # mapped, fails `_parse` before it is written.)
      with open(copy, "rb") as f:
        return _parse(path, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError) as error:  # written whole, so damaged since, or unreadable
      LOG.warning("decompressing %s again: its copy %s is damaged or unreadable (%s)", path,
                  copy, error)
  with gzip.open(path, "rb") as f:
    data = f.read()
  array = _parse(path, data)  # a corrupt file raises before anything is written
  try:
    atomic_write_bytes(copy, data)
    _remove_older_copies(copy)
  except OSError as error:
    LOG.warning("could not keep a decompressed copy of %s in %s (%s); set $%s to a "
                "writable folder to decompress it once", path, os.path.dirname(copy),
                error, DATA_DIRECTORY_ENV)
  return array


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def decompressed_path(path: str, mtime_ns: int, size: int) -> str:
  """Where the plain copy of the gzip-compressed IDX file `path` is kept:
  `<digest of the path>-<digest of its size and modification time>.idx`."""
  return os.path.join(cache_dirs.directory("data", DATA_DIRECTORY_ENV),
                      f"{_digest(os.path.realpath(path))}-{_digest(f'{size} {mtime_ns}')}.idx")


def _remove_older_copies(copy: str) -> None:
  """Removes the copies of earlier versions of `copy`'s file: one copy per file.
  (A process that maps one keeps its pages until it unmaps them.)"""
  folder, name = os.path.split(copy)
  prefix = name.split("-")[0] + "-"
  for other in os.listdir(folder):
    if other.startswith(prefix) and other.endswith(".idx") and other != name:
      try:
        os.remove(os.path.join(folder, other))
      except FileNotFoundError:  # removed by another process meanwhile
        pass


def _parse(path: str, data: bytes | mmap.mmap) -> np.ndarray:
  """The array an IDX file's bytes `data` hold. Raises ValueError on a bad header or size."""
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
    raise ValueError(f"{path} is not an IDX file (bad magic {bytes(data[:4])!r}).")
  ndim = data[3]
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f"{path}: the header of {ndim} dimensions is cut short.")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
  dtype = np.dtype(_DTYPES[data[2]])
  expected = int(np.prod(shape)) * dtype.itemsize
  if len(data) - header != expected:
    raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data), "
                     f"but the file holds {len(data) - header}.")
  # Over `bytes` or a read-only map, the array is read-only already: not copied.
  array = np.frombuffer(data, dtype, offset=header).reshape(shape)
  if dtype.itemsize > 1:
    # Big-endian on disk: a native-order copy. Bytes have no order.
    array = array.astype(dtype.newbyteorder("="), copy=True)
    array.setflags(write=False)
  return array
