"""Frees what TensorFlow 2.14 keeps of an eager tensor after it is gone.

On Python 3.11 every `EagerTensor` is created with storage for its instance
attributes (CPython's managed `__dict__`), and TensorFlow 2.14's deallocator
frees the object but never that storage: each eager tensor leaves one small
block behind for good, most of a long run's memory growth (a round creates a
tensor per output of every computation).

Deleting a tensor's `__dict__` frees that storage and any attribute cached
there (a tensor recomputes its shape on demand); the tensor keeps working.
"""

from __future__ import annotations

from typing import Iterable

from tensorflow.python.framework import ops


def release(tensors: Iterable) -> None:
  """Frees the attribute storage of each eager tensor among `tensors` (anything
  else is left alone). Only for tensors the caller created and is done with."""
  for tensor in tensors:
    if isinstance(tensor, ops.EagerTensor):
      del tensor.__dict__
