"""Atomic file writes: a temporary file beside the target, then a rename, so an
interrupted write (kill, disk full) never leaves a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  path = os.fspath(path)
  directory = os.path.dirname(path) or "."
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                             dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, value: Any) -> None:
  atomic_write_text(path, json.dumps(value, indent=2, sort_keys=False, allow_nan=True) + "\n")
