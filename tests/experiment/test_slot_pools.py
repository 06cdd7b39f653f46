"""Slots of a TensorFlow computation are shared by every `TFComputation` of the
same bytes, devices and feed source in a process (`tf_computation._slot_pool`)."""

import gc

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.runtime import graph_defs, tf_computation
from tff_fedadamom.runtime.tf_computation import Feed


def _serialized(offset: float) -> bytes:
  computation = tff.tensorflow.computation(lambda x: x + offset, tf.float32)
  return tf_computation.serialize(computation)


def _computation(serialized: bytes, **kwargs):
  return tf_computation.TFComputation(tf_computation.deserialize(serialized), **kwargs)


def test_same_bytes_share_slots_and_a_call_is_a_function_of_its_argument():
  one, other = _serialized(1.0), _serialized(2.0)
  a, b, c = _computation(one), _computation(one), _computation(other)
  assert a._slots is b._slots and a._slots is not c._slots
  assert (a(np.float32(1.0)), b(np.float32(5.0)), c(np.float32(1.0))) == (2.0, 6.0, 3.0)
  assert a(np.float32(1.0)) == 2.0


def test_other_devices_or_feed_sources_get_slots_of_their_own():
  serialized = _serialized(1.0)
  cpu = tf.config.list_logical_devices("CPU")[0].name
  assert _computation(serialized)._slots is not _computation(serialized, devices=[cpu])._slots
  source, another = object(), object()
  feed = lambda source: Feed([], 0, lambda: [], source=source)  # noqa: E731
  fed = _computation(serialized, feed=feed(source))
  assert _computation(serialized, feed=feed(source))._slots is fed._slots
  assert _computation(serialized, feed=feed(another))._slots is not fed._slots
  assert _computation(serialized, feed=Feed([], 0, lambda: []))._slots is not fed._slots


def test_each_holder_may_use_its_slots_at_once():
  """Two runs side by side, each with its own computation of the same bytes,
  may call as many slots at once as each would alone."""
  serialized = _serialized(4.0)
  a, b = _computation(serialized, slots_per_device=2), _computation(serialized)
  assert a._slots._limit == 3
  del b
  gc.collect()
  assert a._slots._limit == 2


def test_slots_go_with_the_last_computation_holding_them():
  serialized = _serialized(3.0)
  a = _computation(serialized)
  a(np.float32(0.0))
  before = len(tf_computation._POOLS)
  del a
  gc.collect()
  assert len(tf_computation._POOLS) == before - 1


def test_the_key_ignores_the_nodes_debug_information_alone():
  """The same computation built in two processes differs only in its nodes'
  debug information (the numbering of the functions TFF inlined)."""
  from tensorflow_federated.proto.v0 import computation_pb2
  from tensorflow_federated.python.tensorflow_libs import serialization_utils

  proto = computation_pb2.Computation.FromString(_serialized(1.0))

  def changed(change):
    copy = computation_pb2.Computation()
    copy.CopyFrom(proto)
    graph_def = serialization_utils.unpack_graph_def(copy.tensorflow.graph_def)
    change(graph_def.node[-1])
    copy.tensorflow.graph_def.CopyFrom(serialization_utils.pack_graph_def(graph_def))
    return graph_defs.digest(copy)

  debug = lambda node: node.experimental_debug_info.original_func_names.append("f_7")  # noqa: E731
  device = lambda node: setattr(node, "device", "/device:CPU:0")  # noqa: E731
  assert changed(debug) == graph_defs.digest(proto) != changed(device)
