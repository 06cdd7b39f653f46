"""A TFF TensorFlow computation, called in this Python process.

TFF serializes a TensorFlow computation as a GraphDef with bindings that name
its parameter and result tensors, and an `initialize_op` that creates its
variables. `TFComputation` imports the graph into a `tf.compat.v1.wrap_function`
(the import TFF's own `tensorflow_utils.deserialize_and_call_tf_computation`
does), once per slot, and calls it like any concrete function, so TensorFlow
places the ops on the device the slot was imported on.

Every call first runs the graph's initializer and then its body, on variables
private to the slot (their shared names carry the slot's suffix), so a call is
a function of its arguments alone and slots can run concurrently. Graphs
imported side by side would collide on function-library names, which are
suffixed per import too.

The `TFComputation`s of one computation (`graph_defs.digest`) on the same devices and
feed share their slots (`_SlotPool`): a slot serves any caller, and first
calls are where a new process spends its time. The processes of one model,
data and clients with different server optimizers have the same `work`, `zero`,
`accumulate` and `report`, so a trial worker meeting the next optimizer of a
sweep imports and compiles only that optimizer's server computations.
"""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from typing import Any, Optional, Sequence

import tensorflow as tf
from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import type_serialization
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tff_fedadamom.runtime import graph_defs
from tff_fedadamom.runtime.eager_release import release
from tff_fedadamom.runtime.feed import Feed
from tff_fedadamom.runtime.py_containers import flatten_value, to_python, type_leaves

_IMPORTS = itertools.count()
_IMPORT_LOCK = threading.Lock()


def _unique_suffix() -> str:
  with _IMPORT_LOCK:
    return f"ip{next(_IMPORTS)}"


def _flat_call(function, args) -> list:
  """Calls a concrete function through its flat signature.

  `ConcreteFunction.__call__` binds its arguments to the structured signature,
  and TensorFlow 2.14 formats every argument tensor as text on that path
  (`bind_function_inputs` -> `Tensor.__repr__`): milliseconds a call, more
  than a small graph's whole run. The graph's inputs are already flat and
  typed here, so the call goes straight to the function's flat entry point.
  """
  return function._call_flat(args, function.captured_inputs)  # noqa: SLF001


class _Slot:
  """One import of a TensorFlow computation: an initializer and a body sharing
  variables (by the import's own shared names), on one device."""

  def __init__(self, proto, param_leaves, device: Optional[str], feed: Optional[Feed] = None):
    tf_proto = proto.tensorflow
    suffix = _unique_suffix()
    graph_def = serialization_utils.unpack_graph_def(tf_proto.graph_def)
    graph_def = graph_defs.rename_functions(graph_def, suffix)
    graph_def = tensorflow_utils._uniquify_shared_names_with_suffix(  # noqa: SLF001
        graph_def, suffix)
    in_names = ([name for _, name in graph_defs.binding_leaves(tf_proto.parameter)]
                if tf_proto.HasField("parameter") else [])
    out_names = graph_defs.binding_leaves(tf_proto.result)
    init_name = tf_proto.initialize_op
    token_name = tf_proto.session_token_tensor_name
    signature = [tf.TensorSpec([], tf.variant) if isinstance(t, computation_types.SequenceType)
                 else tf.TensorSpec(t.shape, t.dtype) for t in param_leaves]
    replaced = 0
    if feed is not None:
      signature = feed.signature + signature[feed.replaces:]
      replaced = len(feed.signature)
      feed_inputs = feed.inputs(graph_def, in_names[0])
    traced = {}

    def body(*args):
      with tf.device(device):
        input_map = {}
        if feed is not None:
          input_map, params = feed_inputs(args[:replaced])
          args = [*params, *args[replaced:]]
        input_map.update(zip(in_names, args))
        if token_name:
          input_map[token_name] = tf.constant("inprocess")
        wanted = [name for _, name in out_names] + ([init_name] if init_name else [])
        imported = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map, return_elements=wanted, name=suffix)
      traced["outputs"] = list(imported[:len(out_names)])
      traced["init"] = imported[len(out_names)] if init_name else None
      return traced["outputs"]

    wrapped = tf.compat.v1.wrap_function(body, signature)
    self._init = (wrapped.prune(feeds=[], fetches=traced["init"])
                  if traced["init"] is not None else None)
    if [t.dtype for t in wrapped.inputs] != [s.dtype for s in signature]:
      raise AssertionError(f"an import took inputs beyond its signature: {wrapped.inputs}")
    # The body is the wrapped function itself: its outputs are the computation's
    # results, and the function runtime runs only the ops they need (the
    # initializer is not among them). A prune to those outputs would copy the
    # graph op by op in Python (`lift_to_graph`): seconds for a char-LSTM.
    self._call = wrapped
    self.device = device

  def __call__(self, flat_args):
    if self._init is not None:
      _flat_call(self._init, [])
    return _flat_call(self._call, list(flat_args))


class _Serialized:
  """What `TFComputation` reads of a TFF computation (its proto and type),
  rebuilt from the proto's bytes: no TFF tracing, no user Python."""

  def __init__(self, serialized: bytes):
    self._computation_proto = computation_pb2.Computation.FromString(serialized)
    self.type_signature = type_serialization.deserialize_type(self._computation_proto.type)


def serialize(computation) -> bytes:
  """The bytes of a TFF TensorFlow computation's proto (see `deserialize`)."""
  return computation._computation_proto.SerializeToString()  # noqa: SLF001


def deserialize(serialized: bytes) -> _Serialized:
  """A computation `TFComputation` accepts, from `serialize`'s bytes."""
  return _Serialized(serialized)


class _SlotPool:
  """The slots of one computation on its devices, for every `TFComputation` of
  the same key (`_slot_pool`): idle slots per device, and how many exist."""

  def __init__(self, proto, param_leaves, devices: Sequence[Optional[str]],
               feed: Optional[Feed]):
    self._proto, self._param_leaves, self._devices = proto, param_leaves, list(devices)
    # Kept by the pool: a key holds the id of the feed's source (`_slot_pool`).
    self._feed = feed
    # Seeded dropout is a stateful random op in the training loop's body. TFF's
    # `dataset.reduce` loop makes its body's kernels afresh for every client,
    # so the masks restart with each client; the iterator loop's body keeps
    # its kernels from call to call, so a client's masks would depend on what
    # ran before it on the same slot. Such computations get fresh kernels for
    # every call (a new import: slower, but a function of the inputs alone).
    self.fresh_kernels = graph_defs.needs_fresh_kernels(
        serialization_utils.unpack_graph_def(proto.tensorflow.graph_def))
    self._idle = [queue.SimpleQueue() for _ in self._devices]
    self._made = [0] * len(self._devices)
    self._limit = 0  # slots per device its holders may use at once, together
    self._lock = threading.Lock()

  def reserve(self, per_device: int) -> None:
    """Adds a holder that may use `per_device` slots per device at once (a
    negative number: a holder gone). Slots are still made only when none is idle."""
    with self._lock:
      self._limit += per_device

  def new_slot(self, index: int) -> _Slot:
    return _Slot(self._proto, self._param_leaves, self._devices[index], self._feed)

  def take(self, index: int) -> _Slot:
    """An idle slot of device `index`: a new one while fewer than the holders'
    limit exist, else the next one a caller gives back."""
    try:
      return self._idle[index].get_nowait()
    except queue.Empty:
      pass
    with self._lock:  # one import at a time, as when they were all made up front
      if self._made[index] < self._limit:
        slot = self.new_slot(index)
        self._made[index] += 1
        return slot
    return self._idle[index].get()

  def give_back(self, index: int, slot: _Slot) -> None:
    self._idle[index].put(slot)


# key -> the `_SlotPool` that `TFComputation`s of that key share, while one holds it.
_POOLS: "weakref.WeakValueDictionary[tuple, _SlotPool]" = weakref.WeakValueDictionary()
_POOLS_LOCK = threading.Lock()


def _slot_pool(proto, param_leaves, devices: Sequence[Optional[str]],
               feed: Optional[Feed]) -> _SlotPool:
  """The process's `_SlotPool` for `proto` on `devices` with `feed`, keyed by
  `graph_defs.digest`, the devices and the feed's source (by identity) and kind. A pool
  lives while a `TFComputation` holds it, and holds its first feed (and so the
  source whose id is in its key)."""
  source = None if feed is None else (id(feed.source if feed.source is not None else feed),
                                      feed.to_element is not None)
  key = (graph_defs.digest(proto), tuple(devices), source)
  with _POOLS_LOCK:
    pool = _POOLS.get(key)
    if pool is None:
      pool = _POOLS[key] = _SlotPool(proto, param_leaves, devices, feed)
  return pool


class TFComputation:
  """A TFF TensorFlow computation callable in-process, with `slots` concurrent callers
  per device.

  Arguments and results are Python containers as TFF's contexts use them
  (attrs classes, OrderedDicts, numpy arrays); results come back as numpy.
  """

  def __init__(self, computation, devices: Sequence[Optional[str]] = (None,),
               slots_per_device: int = 1, result_type=None, feed: Optional[Feed] = None):
    proto = computation._computation_proto  # noqa: SLF001
    if proto.WhichOneof("computation") != "tensorflow":
      raise TypeError(f"not a TensorFlow computation: {computation.type_signature}")
    self.type_signature = computation.type_signature
    # The containers of the results (TFF's compiler drops the Python container
    # types of the computations it derives; the caller may know them).
    self.result_type = result_type if result_type is not None else self.type_signature.result
    parameter = self.type_signature.parameter
    self._devices = list(devices)
    self._slots = _slot_pool(proto,
                             type_leaves(parameter) if parameter is not None else [],
                             self._devices, feed)
    self.fresh_kernels = self._slots.fresh_kernels
    # Slots are imported on first need, at most `slots_per_device` per device.
    self._slots_per_device = 0 if self.fresh_kernels else slots_per_device
    self._slots.reserve(self._slots_per_device)
    weakref.finalize(self, self._slots.reserve, -self._slots_per_device)

  @property
  def num_devices(self) -> int:
    return len(self._devices)

  def call_flat_leaves(self, leaves: Sequence[Any], device_index: int = 0) -> list:
    """Runs on device `device_index` with the parameter's flat leaves (see
    `flatten_value`); returns the flat result tensors."""
    index = device_index % len(self._devices)
    if self.fresh_kernels:
      return self._slots.new_slot(index)(leaves)
    slot = self._slots.take(index)
    try:
      return slot(leaves)
    finally:
      self._slots.give_back(index, slot)

  def __call__(self, arg=None, device_index: int = 0):
    parameter = self.type_signature.parameter
    created = []
    leaves = flatten_value(arg, parameter, created) if parameter is not None else []
    outputs = self.call_flat_leaves(leaves, device_index)
    flat = [t.numpy() for t in outputs]
    release([*created, *outputs])
    return to_python(flat, self.result_type)
