"""Runs a TFF learning process inside the Python process, on TensorFlow's devices.

TFF 0.87's local execution context runs every TensorFlow computation in a
`worker_binary` child process that is built without CUDA and serves
unauthenticated gRPC on all interfaces. This module runs the same process
without it:

1. TFF's own compiler turns `process.next` into its MapReduceForm
   (`tff.backends.mapreduce.get_map_reduce_form_for_computation`) and
   `process.initialize` into one TensorFlow computation
   (`get_state_initialization_computation`). The learning process itself is
   TFF's, built by TFF's builders, unchanged.
2. Every part of the form is a plain TensorFlow graph. Each is imported once
   into a `tf.compat.v1.wrap_function` and called like any concrete function,
   so TensorFlow places its ops on a GPU when one is visible.
3. A round is the MapReduceForm's semantics spelled out in Python
   (`tff.backends.mapreduce.get_computation_for_map_reduce_form` is the
   reference): `prepare` on the server state, `work` on each client's dataset
   and the broadcast, `zero`/`accumulate` over the clients in the order they
   were given, `report`, then `update`.

Why clients give results independent of timing: each call of a part first runs
the graph's own initializer (`initialize_op`, which creates the model's and
metrics' variables afresh, as TFF's executor does), on variables private to the
slot that runs it; clients run concurrently (one slot per concurrent client,
spread round-robin over the devices), but their outputs are accumulated in
client order.

Two details that matter for results equal to TFF's runtime: graphs imported
side by side must not share function-library names (they are suffixed per
import), and a `tf.data.Dataset` iterated twice reshuffles, so callers pass
fresh client datasets to every `next` (the pipeline builds them per round).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import threading
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

_IMPORTS = itertools.count()


def _no_grappler():
  """TFF's compiler would rewrite the parts with Grappler before handing them
  over; TensorFlow's function runtime optimizes them again when it instantiates
  them, as TFF's own runtime does for the original computations. Skipping the
  extra pass keeps the arithmetic the same as TFF's runtime."""
  config = tf.compat.v1.ConfigProto()
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config


_NO_GRAPPLER = _no_grappler()
_IMPORT_LOCK = threading.Lock()


def _unique_suffix() -> str:
  with _IMPORT_LOCK:
    return f"ip{next(_IMPORTS)}"


def _binding_leaves(binding) -> list[tuple[str, str]]:
  """(kind, tensor name) of every leaf of a TFF TensorFlow binding, in type order."""
  kind = binding.WhichOneof("binding")
  if kind == "tensor":
    return [("tensor", binding.tensor.tensor_name)]
  if kind == "sequence":
    return [("sequence", binding.sequence.variant_tensor_name)]
  if kind == "struct":
    return [leaf for element in binding.struct.element for leaf in _binding_leaves(element)]
  raise ValueError(f"unsupported TensorFlow binding {kind!r}")


def _type_leaves(type_spec) -> list:
  """The TensorType/SequenceType leaves of `type_spec`, in the order of its bindings."""
  if isinstance(type_spec, computation_types.FederatedType):
    return _type_leaves(type_spec.member)
  if isinstance(type_spec, computation_types.StructType):
    return [leaf for _, element in structure.iter_elements(type_spec)
            for leaf in _type_leaves(element)]
  return [type_spec]


def _flatten(value, type_spec) -> list:
  """The leaves of `value` (Python containers, Structs, arrays, datasets) in type order."""
  if isinstance(type_spec, computation_types.FederatedType):
    return _flatten(value, type_spec.member)
  if isinstance(type_spec, computation_types.StructType):
    elements = structure.iter_elements(structure.from_container(value))
    return [leaf for (_, v), (_, t) in zip(elements, structure.iter_elements(type_spec))
            for leaf in _flatten(v, t)]
  return [value]


def flatten_value(value, type_spec) -> list:
  """The leaves of `value` as a TensorFlow computation takes them: tensors, and
  a dataset's variant tensor (how TFF itself feeds a sequence)."""
  out = []
  for leaf, leaf_type in zip(_flatten(value, type_spec), _type_leaves(type_spec)):
    if isinstance(leaf_type, computation_types.SequenceType):
      out.append(leaf._variant_tensor)  # noqa: SLF001
    else:
      out.append(tf.convert_to_tensor(leaf, leaf_type.dtype))
  return out


def _pack(leaves, type_spec):
  """Inverse of `_flatten`: `structure.Struct`s following `type_spec`."""
  if isinstance(type_spec, computation_types.FederatedType):
    return _pack(leaves, type_spec.member)
  if isinstance(type_spec, computation_types.StructType):
    return structure.Struct([(name, _pack(leaves, element))
                             for name, element in structure.iter_elements(type_spec)])
  return next(leaves)


def to_python(leaves, type_spec):
  """Flat numpy leaves -> the Python containers TFF's own contexts return."""
  return type_conversions.type_to_py_container(_pack(iter(leaves), type_spec), type_spec)


def _rename_functions(graph_def, suffix: str):
  """Suffixes every function-library name, and every reference to one.

  Function names are global in TensorFlow's eager context: two imported graphs
  whose libraries hold different functions of the same name would collide.
  """
  names = {f.signature.name: f"{f.signature.name}_{suffix}" for f in graph_def.library.function}
  if not names:
    return graph_def

  def fix_attr(attr):
    if attr.HasField("func") and attr.func.name in names:
      attr.func.name = names[attr.func.name]
    if attr.HasField("list"):
      for func in attr.list.func:
        if func.name in names:
          func.name = names[func.name]

  def fix_nodes(nodes):
    for node in nodes:
      if node.op in names:
        node.op = names[node.op]
      for attr in node.attr.values():
        fix_attr(attr)

  fix_nodes(graph_def.node)
  for function in graph_def.library.function:
    function.signature.name = names[function.signature.name]
    fix_nodes(function.node_def)
    for attr in function.attr.values():
      fix_attr(attr)
  for gradient in graph_def.library.gradient:
    gradient.function_name = names.get(gradient.function_name, gradient.function_name)
    gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)
  return graph_def


# Random ops that keep their state in the kernel: a seeded one restarts its
# sequence only when its kernel is created anew.
_STATEFUL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "Multinomial"})


def _has_stateful_random_ops(graph_def) -> bool:
  """Whether a function of the graph (a training loop's body) draws stateful random numbers."""
  return any(node.op in _STATEFUL_RANDOM_OPS
             for function in graph_def.library.function for node in function.node_def)


class _Slot:
  """One import of a TensorFlow computation: an initializer and a body sharing
  variables (by the import's own shared names), on one device."""

  def __init__(self, proto, param_leaves, device: Optional[str]):
    tf_proto = proto.tensorflow
    suffix = _unique_suffix()
    graph_def = serialization_utils.unpack_graph_def(tf_proto.graph_def)
    graph_def = _rename_functions(graph_def, suffix)
    graph_def = tensorflow_utils._uniquify_shared_names_with_suffix(  # noqa: SLF001
        graph_def, suffix)
    in_names = ([name for _, name in _binding_leaves(tf_proto.parameter)]
                if tf_proto.HasField("parameter") else [])
    out_names = _binding_leaves(tf_proto.result)
    init_name = tf_proto.initialize_op
    token_name = tf_proto.session_token_tensor_name
    signature = [tf.TensorSpec([], tf.variant) if isinstance(t, computation_types.SequenceType)
                 else tf.TensorSpec(t.shape, t.dtype) for t in param_leaves]
    traced = {}

    def body(*args):
      input_map = dict(zip(in_names, args))
      if token_name:
        input_map[token_name] = tf.constant("inprocess")
      wanted = [name for _, name in out_names] + ([init_name] if init_name else [])
      with tf.device(device):
        imported = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map, return_elements=wanted, name=suffix)
      traced["outputs"] = list(imported[:len(out_names)])
      traced["init"] = imported[len(out_names)] if init_name else None
      return traced["outputs"]

    wrapped = tf.compat.v1.wrap_function(body, signature)
    graph_inputs = [t for t in wrapped.inputs if t.dtype != tf.resource]
    self._init = (wrapped.prune(feeds=[], fetches=traced["init"])
                  if traced["init"] is not None else None)
    self._call = wrapped.prune(feeds=graph_inputs, fetches=traced["outputs"])
    self.device = device

  def __call__(self, flat_args):
    if self._init is not None:
      self._init()
    return self._call(*flat_args)


class TFComputation:
  """A TFF TensorFlow computation callable in-process, with `slots` concurrent callers
  per device.

  Arguments and results are Python containers as TFF's contexts use them
  (attrs classes, OrderedDicts, numpy arrays); results come back as numpy.
  """

  def __init__(self, computation, devices: Sequence[Optional[str]] = (None,),
               slots_per_device: int = 1, result_type=None):
    proto = computation._computation_proto  # noqa: SLF001
    if proto.WhichOneof("computation") != "tensorflow":
      raise TypeError(f"not a TensorFlow computation: {computation.type_signature}")
    self.type_signature = computation.type_signature
    # Seeded dropout is a stateful random op inside the training loop's body.
    # TFF's `dataset.reduce` loop creates its body's kernels afresh for every
    # client, so the masks restart with each client; a function called again
    # keeps its kernels and would continue the sequence, making a client's
    # masks depend on what ran before it on the same slot. Such computations
    # get fresh kernels for every call (a new import: slower, but a function of
    # the inputs alone, as in TFF's runtime).
    self.fresh_kernels = _has_stateful_random_ops(
        serialization_utils.unpack_graph_def(proto.tensorflow.graph_def))
    self._proto = proto
    # The containers of the results (TFF's compiler drops the Python container
    # types of the computations it derives; the caller may know them).
    self.result_type = result_type if result_type is not None else self.type_signature.result
    parameter = self.type_signature.parameter
    self._param_leaves = _type_leaves(parameter) if parameter is not None else []
    self._devices = list(devices)
    # Calls per device, for the record (`summary.json` names where rounds ran).
    self.calls: dict[Optional[str], int] = {}
    self._lock = threading.Lock()
    self._pools = []
    for device in self._devices:
      pool = queue.SimpleQueue()
      for _ in range(0 if self.fresh_kernels else slots_per_device):
        pool.put(_Slot(proto, self._param_leaves, device))
      self._pools.append(pool)

  @property
  def num_devices(self) -> int:
    return len(self._pools)

  def call_flat_leaves(self, leaves: Sequence[Any], device_index: int = 0) -> list:
    """Runs on device `device_index` with the parameter's flat leaves (see
    `flatten_value`); returns the flat result tensors."""
    device = self._devices[device_index % len(self._devices)]
    with self._lock:
      self.calls[device] = self.calls.get(device, 0) + 1
    if self.fresh_kernels:
      return _Slot(self._proto, self._param_leaves, device)(leaves)
    pool = self._pools[device_index % len(self._pools)]
    slot = pool.get()
    try:
      return slot(leaves)
    finally:
      pool.put(slot)

  def __call__(self, arg=None, device_index: int = 0):
    parameter = self.type_signature.parameter
    leaves = flatten_value(arg, parameter) if parameter is not None else []
    flat = [t.numpy() for t in self.call_flat_leaves(leaves, device_index)]
    return to_python(flat, self.result_type)


def visible_devices() -> list[str]:
  """The devices rounds run on by default: every visible GPU, else the first CPU."""
  gpus = tf.config.list_logical_devices("GPU")
  return [d.name for d in gpus] or [tf.config.list_logical_devices("CPU")[0].name]


def _short(name: str) -> str:
  return name.split("device:")[-1].upper()


def visible_names() -> list[str]:
  """Short names ('CPU:0', 'GPU:1', ...) of every device TensorFlow sees."""
  return [_short(d.name) for d in tf.config.list_logical_devices()]


def resolve_devices(devices: Optional[Sequence[str]]) -> list[str]:
  """Full TensorFlow names of `devices` ('GPU:1' -> '/job:localhost/.../device:GPU:1').

  Raises:
    ValueError: naming the first device TensorFlow does not see.
  """
  if not devices:
    return visible_devices()
  known = {_short(d.name): d.name for d in tf.config.list_logical_devices()}
  out = []
  for device in devices:
    if _short(str(device)).lstrip("/") not in known:
      raise ValueError(f"device {device!r} is not visible to TensorFlow")
    out.append(known[_short(str(device)).lstrip("/")])
  return out


class InProcessLearningProcess:
  """A `tff.learning.templates.LearningProcess`, run in this Python process.

  Same calls as the process it wraps: `initialize()`, `next(state, client_data)`
  (returning TFF's `LearningProcessOutput`), `get_model_weights(state)`, and
  `get_hparams`/`set_hparams` when the process has them; states and metrics are
  the same Python containers as TFF's own context returns.

  Example:

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=..., server_optimizer_fn=...,
        loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR)  # ops may leave the CPU
    process = InProcessLearningProcess(process)
    state = process.initialize()
    for datasets in rounds:                       # fresh tf.data.Datasets each round
      state, metrics = process.next(state, datasets)

  Args:
    process: The learning process (TFF's builders' output, or any process whose
      `next` TFF can compile to MapReduceForm).
    devices: TensorFlow device names the clients are spread over, round-robin
      (client i of a round runs on `devices[i % len(devices)]`); server-side
      parts run on the first. Default: every visible GPU, else the CPU.
    max_concurrent_clients: How many clients run at once (at least one per
      device). Default: one per device, two on a lone CPU (the CPU's thread
      pools then have two clients' ops to interleave).
  """

  def __init__(self, process, devices: Optional[Sequence[str]] = None,
               max_concurrent_clients: Optional[int] = None):
    self._process = process
    self.devices = resolve_devices(devices)
    if max_concurrent_clients is not None and max_concurrent_clients < 1:
      raise ValueError(
          f"max_concurrent_clients must be an integer >= 1 or None, found {max_concurrent_clients!r}")
    if max_concurrent_clients is None:
      max_concurrent_clients = 2 if self.devices[0].endswith("CPU:0") and len(self.devices) == 1 \
          else len(self.devices)
    self.max_concurrent_clients = max(max_concurrent_clients, len(self.devices))
    mrf = tff.backends.mapreduce.get_map_reduce_form_for_computation(
        process.next, grappler_config=_NO_GRAPPLER)
    for name in ("secure_sum_bitwidth", "secure_sum_max_input", "secure_modular_sum_modulus"):
      if _type_leaves(getattr(mrf, name).type_signature.result):
        raise NotImplementedError(
            f"the process uses secure aggregation ({name}); the in-process backend "
            "runs plain sums only: use runtime.backend: tff_cpp")
    server = [self.devices[0]]
    init = tff.backends.mapreduce.get_state_initialization_computation(
        process.initialize, grappler_config=_NO_GRAPPLER)
    self._initialize = TFComputation(init, server, result_type=process.initialize.type_signature.result)
    self._prepare = TFComputation(mrf.prepare, server)
    slots = -(-self.max_concurrent_clients // len(self.devices))
    self._work = TFComputation(mrf.work, self.devices, slots_per_device=slots)
    self._zero = TFComputation(mrf.zero, server)
    self._accumulate = TFComputation(mrf.accumulate, server)
    self._report = TFComputation(mrf.report, server)
    self._update = TFComputation(mrf.update, server, result_type=process.next.type_signature.result)
    self._state_type = process.next.type_signature.parameter[0]
    self._pool = concurrent.futures.ThreadPoolExecutor(
        self.max_concurrent_clients, thread_name_prefix="tff-client")
    self._extra: dict[str, TFComputation] = {}

  @property
  def process(self):
    """The wrapped TFF learning process."""
    return self._process

  @property
  def state_type(self):
    return self._state_type

  def initialize(self):
    return self._initialize()

  def next(self, state, client_data: Sequence[Any]):
    """One round: `prepare`, `work` per client (concurrently), `accumulate` in
    client order, `report`, `update`."""
    state_leaves = flatten_value(state, self._state_type)
    broadcast = self._prepare.call_flat_leaves(state_leaves)
    futures = [self._pool.submit(self._work.call_flat_leaves,
                                 [dataset._variant_tensor, *broadcast], i)  # noqa: SLF001
               for i, dataset in enumerate(client_data)]
    accumulator = self._zero.call_flat_leaves([])
    for future in futures:  # client order, whatever order they finish in
      accumulator = self._accumulate.call_flat_leaves([*accumulator, *future.result()])
    report = self._report.call_flat_leaves(accumulator)
    result = self._update.call_flat_leaves([*state_leaves, *report])
    return to_python([t.numpy() for t in result], self._update.result_type)

  def _tf_computation(self, name: str) -> TFComputation:
    if name not in self._extra:
      computation = getattr(self._process, name, None)
      if computation is None:
        raise AttributeError(f"the learning process has no {name!r}")
      self._extra[name] = TFComputation(computation, [self.devices[0]])
    return self._extra[name]

  def get_model_weights(self, state):
    return self._tf_computation("get_model_weights")(state)

  def get_hparams(self, state):
    return self._tf_computation("get_hparams")(state)

  def set_hparams(self, state, hparams):
    return self._tf_computation("set_hparams")([state, hparams])

  def close(self) -> None:
    """Stops the client threads (also done when the object is collected)."""
    self._pool.shutdown(wait=True)

  def __del__(self):
    pool = getattr(self, "_pool", None)
    if pool is not None:
      pool.shutdown(wait=False)
