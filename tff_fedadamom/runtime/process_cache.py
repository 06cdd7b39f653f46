"""A persistent, machine-wide cache of compiled learning processes.

Compiling a learning process gives the same graphs for every config of one
structure; this cache keeps each structure's `compiled.CompiledProcess` as one
file, built once per machine. Key: the experiment's `parts.process_structure`
plus the versions of TensorFlow, TFF and this package's source (`versions`).

Files: `<directory>/<key>.tffproc`, `CompiledProcess.to_bytes` after a header
naming the key, the versions and the bytes' SHA-256, written atomically (a
killed writer's temporary file is removed once `STALE_TMP_S` old). Concurrent
builders of one key wait on a lock file: the first builds, the others load. An
entry failing a check is rebuilt, with a warning. After each write the least
recently used entries (a load touches one) go until the directory fits.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import time
from typing import Callable, Optional

from tff_fedadamom import cache_dirs
from tff_fedadamom.atomic_io import atomic_write_bytes
from tff_fedadamom.runtime.compiled import CompiledProcess

LOG = logging.getLogger(__name__)

SUFFIX = ".tffproc"
MAGIC = b"tff-fedadamom compiled process\n"
# Default bound of the directory (an entry holds the model's initial weights).
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
# Temporary files of writers that were killed are removed after this long.
STALE_TMP_S = 3600.0
# The environment variable that moves the default directory (e.g. for a test session).
DIRECTORY_ENV = "TFF_FEDADAMOM_CACHE_DIR"


def default_directory() -> str:
  """`$TFF_FEDADAMOM_CACHE_DIR`, else `$XDG_CACHE_HOME/tff-fedadamom/processes`, else
  `~/.cache/tff-fedadamom/processes`."""
  return cache_dirs.directory("processes", DIRECTORY_ENV)


@functools.lru_cache(maxsize=1)
def versions() -> dict:
  """TensorFlow's and TFF's versions and a digest of this package's source files."""
  import tensorflow as tf
  import tensorflow_federated as tff

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for folder, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
          digest.update(f.read())
  return {"tensorflow": tf.__version__, "tensorflow_federated": tff.__version__,
          "tff_fedadamom_source": digest.hexdigest()[:16]}


def process_key(structure: str) -> str:
  """The cache key of a learning process whose config has `parts.process_structure`
  `structure` (see the module doc)."""
  text = json.dumps({"structure": structure, "versions": versions()}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


class ProcessCache:
  """Compiled learning processes on disk, one file per key, in `directory`
  (default `default_directory()`), at most `max_bytes` in all."""

  def __init__(self, directory: Optional[str] = None, max_bytes: int = DEFAULT_MAX_BYTES):
    if not isinstance(max_bytes, int) or max_bytes < 1:
      raise ValueError(f"ProcessCache `max_bytes` must be an integer >= 1, found {max_bytes!r}")
    self.directory = os.path.abspath(os.path.expanduser(directory or default_directory()))
    self.max_bytes = max_bytes

  def path(self, key: str) -> str:
    return os.path.join(self.directory, key + SUFFIX)

  def get_or_build(self, key: str, build: Callable[[], CompiledProcess]) -> CompiledProcess:
    """The entry of `key`, or `build()`'s result, stored under `key` first
    (while one process builds a key, others asking for it wait, then load)."""
    compiled = self.load(key)
    if compiled is not None:
      return compiled
    os.makedirs(self.directory, exist_ok=True)
    with self._locked(key):
      compiled = self.load(key, quiet=True)
      if compiled is not None:
        return compiled
      compiled = build()
      self.store(key, compiled)
    self.evict()
    return compiled

  def load(self, key: str, quiet: bool = False) -> Optional[CompiledProcess]:
    """The entry of `key`, or None when there is none or it fails a check (a
    warning says which, unless `quiet`)."""
    path = self.path(key)
    try:
      with open(path, "rb") as f:
        data = f.read()
    except FileNotFoundError:
      return None
    try:
      compiled = _decode(data, key)
    except ValueError as e:
      if not quiet:
        LOG.warning("process cache: rebuilding %s: %s", path, e)
      return None
    with contextlib.suppress(OSError):
      os.utime(path)  # most recently used
    return compiled

  def store(self, key: str, compiled: CompiledProcess) -> None:
    """Writes the entry of `key` atomically."""
    atomic_write_bytes(self.path(key), _encode(compiled, key))

  def entries(self) -> list[tuple[str, int, float]]:
    """(path, size, modification time) of every entry, least recently used first."""
    out = []
    with contextlib.suppress(FileNotFoundError):
      for name in os.listdir(self.directory):
        if name.endswith(SUFFIX):
          path = os.path.join(self.directory, name)
          with contextlib.suppress(FileNotFoundError):
            st = os.stat(path)
            out.append((path, st.st_size, st.st_mtime))
    return sorted(out, key=lambda e: e[2])

  def evict(self) -> list[str]:
    """Removes (and returns) the least recently used entries until the directory
    fits `max_bytes`, and writers' temporary files older than `STALE_TMP_S`."""
    entries = self.entries()
    total = sum(size for _, size, _ in entries)
    removed = []
    for path, size, _ in entries:
      if total <= self.max_bytes:
        break
      for doomed in (path, path[:-len(SUFFIX)] + ".lock"):
        with contextlib.suppress(FileNotFoundError):
          os.remove(doomed)
      total -= size
      removed.append(path)
    now = time.time()
    with contextlib.suppress(FileNotFoundError):
      for name in os.listdir(self.directory):
        path = os.path.join(self.directory, name)
        if name.endswith(".tmp"):
          with contextlib.suppress(FileNotFoundError):
            if now - os.stat(path).st_mtime > STALE_TMP_S:
              os.remove(path)
    return removed

  @contextlib.contextmanager
  def _locked(self, key: str):
    import fcntl

    with open(os.path.join(self.directory, key + ".lock"), "a") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
      yield


def _encode(compiled: CompiledProcess, key: str) -> bytes:
  body = compiled.to_bytes()
  header = {"key": key, "versions": versions(),
            "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
  return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + body


def _decode(data: bytes, key: str) -> CompiledProcess:
  """The entry's process. Raises ValueError naming the first check it fails."""
  if not data.startswith(MAGIC):
    raise ValueError("not an entry of this cache")
  line, _, body = data[len(MAGIC):].partition(b"\n")
  try:
    header = json.loads(line)
  except json.JSONDecodeError:
    raise ValueError("unreadable header") from None
  if header.get("key") != key:
    raise ValueError(f"it holds key {header.get('key')!r}")
  if header.get("versions") != versions():
    raise ValueError(f"built by {header.get('versions')}, this is {versions()}")
  if header.get("size") != len(body) or header.get("sha256") != hashlib.sha256(body).hexdigest():
    raise ValueError("checksum mismatch (a damaged or partly written file)")
  return CompiledProcess.from_bytes(body)
