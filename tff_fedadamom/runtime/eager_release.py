"""Frees what TensorFlow 2.14 keeps of an eager tensor after it is gone.

On Python 3.11 every `EagerTensor` is created with storage for its instance
attributes (the inline values of CPython's managed `__dict__`: 16 bytes, more
once TensorFlow has set attributes such as `_tensor_shape` on some tensors),
and TensorFlow 2.14's deallocator frees the object but never that storage. So
each eager tensor a process creates leaves one small block behind for good
(`sys.getallocatedblocks()` grows by one per tensor). A round run part by part
creates about 160 of them (the outputs of `prepare`, each client's `work`,
`zero`, each `accumulate`, `report` and `update`, the state converted to
tensors, the clients' round seeds): over 1,000 rounds of digits/logistic that
was most of a run's memory growth (`benchmarks/round_memory.py`).

Deleting a tensor's `__dict__` frees that storage, and with it any attribute
cached there (a tensor recomputes its shape on demand); the tensor itself keeps
working, and its deallocator then leaves nothing behind. `release` does that
for the tensors a caller made and no longer needs. Tensors TensorFlow or Keras
create inside their own calls (a checkpoint's save, an evaluation) are out of
reach and still leak their block.
"""

from __future__ import annotations

from typing import Iterable

from tensorflow.python.framework import ops


def release(tensors: Iterable) -> None:
  """Frees the attribute storage of each eager tensor among `tensors`.

  Anything else (numpy arrays, graph tensors, None) is left alone. Only for
  tensors the caller created (a call's outputs, its own conversions) and is
  done with: the tensor stays valid, but loses what was cached on it.
  """
  for tensor in tensors:
    if isinstance(tensor, ops.EagerTensor):
      del tensor.__dict__
