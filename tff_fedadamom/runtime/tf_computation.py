"""A TFF TensorFlow computation, called in this Python process.

TFF serializes a TensorFlow computation as a GraphDef with bindings that name
its parameter and result tensors, and an `initialize_op` that creates its
variables. `TFComputation` imports the graph into a `tf.compat.v1.wrap_function`
(as TFF's `tensorflow_utils.deserialize_and_call_tf_computation` does), once
per slot, on the device the slot is for.

Every call first runs the graph's initializer and then its body, on variables
private to the slot (their shared names, and function-library names, carry
the import's suffix), so a call is a function of its arguments alone and slots
can run concurrently.

The `TFComputation`s of one computation (`graph_defs.digest`) on the same
devices and feed share their slots (`_SlotPool`): imports are where a new
process spends its time, and processes of one model, data and clients share
`work`, `zero`, `accumulate` and `report`, so a worker meeting a sweep's next
optimizer imports only its server computations.

With a `Feed`, a slot takes a client's example tensors and round seed in place
of the dataset its `work` takes (`data.client_tensors` says why) and builds the
data in the same graph: a client's round is one TensorFlow call.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import types
import weakref
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import type_serialization
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tff_fedadamom.runtime import graph_defs
from tff_fedadamom.runtime.eager_release import release
from tff_fedadamom.runtime.py_containers import flatten_value, to_python, type_leaves


class Feed:
  """What turns a slot's own arguments into the computation's leading parameters.

  Attributes:
    signature: `tf.TensorSpec`s of the arguments that replace the parameters.
    replaces: How many leading parameter leaves they replace.
    to_params: `(*feed_args) -> list` of those parameter tensors (graph-building).
    to_element: Optional, for a lone sequence parameter of one element (the
      stacked batches of `algorithms.unrolled`): `(*feed_args) -> its flat
      tensors`, so no dataset is built and read back (`inputs`).
    source: What the feed's ops are built from (the run's `ClientTensors`),
      by which slots are shared (`_slot_pool`). None: this feed alone.
  """

  def __init__(self, signature: Sequence[tf.TensorSpec], replaces: int, to_params,
               to_element=None, source=None):
    if to_element is not None and replaces != 1:
      raise ValueError(f"to_element replaces one sequence parameter, not {replaces}")
    self.signature = list(signature)
    self.replaces = replaces
    self.to_params = to_params
    self.to_element = to_element
    self.source = source

  def inputs(self, graph_def, sequence: str) -> Callable[[Sequence], tuple[dict, list]]:
    """For a slot importing `graph_def`, whose first parameter is the tensor
    named `sequence`: a function `(feed args) -> (input map entries, the
    replaced parameters' tensors)`, called while the slot's graph is built.

    With `to_element` and a `DatasetToSingleElement` op that alone reads
    `sequence`, that op is removed from `graph_def`: the input map gives its
    outputs (and its control edges), and the parameter is an empty dataset.
    """
    op = sequence.split(":")[0]
    readers = [node for node in graph_def.node if self.to_element
               and any(i.split(":")[0].lstrip("^") == op for i in node.input)]
    if len(readers) != 1 or readers[0].op != "DatasetToSingleElement":
      return lambda args: ({}, list(self.to_params(*args)))
    name, outputs = readers[0].name, len(readers[0].attr["output_types"].list.type)
    kept = [node for node in graph_def.node if node.name != name]
    del graph_def.node[:]
    graph_def.node.extend(kept)

    def element_inputs(args):
      element = list(self.to_element(*args))
      if len(element) != outputs:
        raise ValueError(f"the feed gives {len(element)} element tensors, the computation "
                         f"reads {outputs}")
      entries = {f"{name}:{i}": t for i, t in enumerate(element)}
      entries[f"^{name}"] = element[0]
      return entries, [tf.data.Dataset.range(0)._variant_tensor]  # noqa: SLF001

    return element_inputs


_IMPORTS = itertools.count()
_IMPORT_LOCK = threading.Lock()


def _flat_call(function, args) -> list:
  """Calls a concrete function through its flat signature: TensorFlow 2.14's
  `ConcreteFunction.__call__` formats every argument tensor as text
  (`bind_function_inputs` -> `Tensor.__repr__`), costlier than a small graph's run."""
  return function._call_flat(args, function.captured_inputs)  # noqa: SLF001


class _Slot:
  """One import of a TensorFlow computation: an initializer and a body sharing
  variables (by the import's own shared names), on one device."""

  def __init__(self, proto, param_leaves, device: Optional[str], feed: Optional[Feed] = None):
    tf_proto = proto.tensorflow
    with _IMPORT_LOCK:
      suffix = f"ip{next(_IMPORTS)}"
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
      traced["init"] = imported[len(out_names)] if init_name else None
      return list(imported[:len(out_names)])

    wrapped = tf.compat.v1.wrap_function(body, signature)
    self._init = (wrapped.prune(feeds=[], fetches=traced["init"])
                  if traced["init"] is not None else None)
    if [t.dtype for t in wrapped.inputs] != [s.dtype for s in signature]:
      raise AssertionError(f"an import took inputs beyond its signature: {wrapped.inputs}")
    # The body is the wrapped function itself: the function runtime runs only
    # the ops its outputs need (not the initializer). A prune to those outputs
    # would copy the graph op by op in Python (`lift_to_graph`), slow on big graphs.
    self._call = wrapped

  def __call__(self, flat_args):
    if self._init is not None:
      _flat_call(self._init, [])
    return _flat_call(self._call, list(flat_args))


def serialize(computation) -> bytes:
  """The bytes of a TFF TensorFlow computation's proto (see `deserialize`)."""
  return computation._computation_proto.SerializeToString()  # noqa: SLF001


def deserialize(serialized: bytes) -> types.SimpleNamespace:
  """What `TFComputation` reads of a TFF computation (its proto and type),
  rebuilt from `serialize`'s bytes: no TFF tracing, no user Python."""
  proto = computation_pb2.Computation.FromString(serialized)
  return types.SimpleNamespace(_computation_proto=proto,
                               type_signature=type_serialization.deserialize_type(proto.type))


class _SlotPool:
  """The slots of one computation on its devices, for every `TFComputation` of
  the same key (`_slot_pool`): idle slots per device, and how many exist."""

  def __init__(self, proto, param_leaves, devices: Sequence[Optional[str]],
               feed: Optional[Feed]):
    self._proto, self._param_leaves, self._devices = proto, param_leaves, list(devices)
    self._feed = feed  # kept: the pool's key holds the id of its source (`_slot_pool`)
    # A stateful random op (seeded dropout) outside a tf.data op keeps its kernel
    # from call to call: such computations get a new import per call.
    self.fresh_kernels = graph_defs.needs_fresh_kernels(
        serialization_utils.unpack_graph_def(proto.tensorflow.graph_def))
    self._idle = [queue.SimpleQueue() for _ in self._devices]
    self._made = [0] * len(self._devices)
    self._limit = 0  # slots per device its holders may use at once, together
    self._lock = threading.Lock()

  def reserve(self, per_device: int) -> None:
    """Adds a holder that may use `per_device` slots per device at once (a
    negative number: a holder gone)."""
    with self._lock:
      self._limit += per_device

  def new_slot(self, index: int) -> _Slot:
    return _Slot(self._proto, self._param_leaves, self._devices[index], self._feed)

  def take(self, index: int) -> _Slot:
    """An idle slot of device `index`: a new one while fewer than the holders'
    limit exist, else the next one a caller gives back."""
    with contextlib.suppress(queue.Empty):
      return self._idle[index].get_nowait()
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
  `graph_defs.digest`, the devices and the feed's source (by identity) and kind.
  A pool lives while a `TFComputation` holds it, and holds its first feed."""
  source = None if feed is None else (id(feed.source if feed.source is not None else feed),
                                      feed.to_element is not None)
  key = (graph_defs.digest(proto), tuple(devices), source)
  with _POOLS_LOCK:
    pool = _POOLS.get(key)
    if pool is None:
      pool = _POOLS[key] = _SlotPool(proto, param_leaves, devices, feed)
  return pool


class TFComputation:
  """A TFF TensorFlow computation callable in-process, with `slots_per_device`
  concurrent callers per device. Arguments and results are Python containers
  as TFF's contexts use them; results come back as numpy.
  """

  def __init__(self, computation, devices: Sequence[Optional[str]] = (None,),
               slots_per_device: int = 1, result_type=None, feed: Optional[Feed] = None):
    proto = computation._computation_proto  # noqa: SLF001
    if proto.WhichOneof("computation") != "tensorflow":
      raise TypeError(f"not a TensorFlow computation: {computation.type_signature}")
    self.type_signature = computation.type_signature
    # TFF's compiler drops the Python containers of the computations it derives.
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
