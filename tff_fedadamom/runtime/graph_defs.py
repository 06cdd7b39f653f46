"""What the in-process backend reads and rewrites in a TFF TensorFlow
computation's serialized graph (`tf_computation`)."""

from __future__ import annotations

import hashlib

from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.python.tensorflow_libs import serialization_utils


def binding_leaves(binding) -> list[tuple[str, str]]:
  """(kind, tensor name) of every leaf of a TFF TensorFlow binding, in type order."""
  kind = binding.WhichOneof("binding")
  if kind == "tensor":
    return [("tensor", binding.tensor.tensor_name)]
  if kind == "sequence":
    return [("sequence", binding.sequence.variant_tensor_name)]
  if kind == "struct":
    return [leaf for element in binding.struct.element for leaf in binding_leaves(element)]
  raise ValueError(f"unsupported TensorFlow binding {kind!r}")


def rename_functions(graph_def, suffix: str):
  """Suffixes every function-library name, and every reference to one.

  Function names are global in TensorFlow's eager context: two imported graphs
  whose libraries hold different functions of the same name would collide.
  """
  names = {f.signature.name: f"{f.signature.name}_{suffix}" for f in graph_def.library.function}
  if not names:
    return graph_def

  def fix_attrs(attrs):
    for func in _attr_functions(attrs):
      func.name = names.get(func.name, func.name)

  def fix_nodes(nodes):
    for node in nodes:
      node.op = names.get(node.op, node.op)
      fix_attrs(node.attr)

  fix_nodes(graph_def.node)
  for function in graph_def.library.function:
    function.signature.name = names[function.signature.name]
    fix_nodes(function.node_def)
    fix_attrs(function.attr)
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


def _attr_functions(attrs) -> list:
  """The function references (`NameAttrList`s) among an attr map's values."""
  out = []
  for attr in attrs.values():
    if attr.HasField("func"):
      out.append(attr.func)
    if attr.HasField("list"):
      out.extend(attr.list.func)
  return out


def _referenced_functions(nodes, names) -> set[str]:
  """Library functions that `nodes` call, except through a tf.data op, which
  instantiates its functions anew each run (their random kernels restart)."""
  found = set()
  for node in nodes:
    if node.op.endswith("Dataset") or node.op.endswith("DatasetV2"):
      continue
    found.add(node.op)
    found.update(func.name for func in _attr_functions(node.attr))
  return found & names


def needs_fresh_kernels(graph_def) -> bool:
  """Whether a stateful random op (seeded dropout) would keep its kernel, and so
  continue its sequence, from one call of the graph to the next."""
  if any(node.op in _STATEFUL_RANDOM_OPS for node in graph_def.node):
    return True  # Grappler turned the iterator loop into the graph's own while loop.
  functions = {f.signature.name: f for f in graph_def.library.function}
  names = set(functions)
  pending = _referenced_functions(graph_def.node, names)
  seen = set()
  while pending:
    name = pending.pop()
    seen.add(name)
    body = functions[name].node_def
    if any(node.op in _STATEFUL_RANDOM_OPS for node in body):
      return True
    pending |= _referenced_functions(body, names) - seen
  return False


def digest(proto) -> bytes:
  """SHA-256 of `proto` without its nodes' debug information, which names the
  functions TFF inlined by their process-wide numbering: the same computation
  built in two processes differs there alone."""
  graph_def = serialization_utils.unpack_graph_def(proto.tensorflow.graph_def)
  for nodes in [graph_def.node, *(f.node_def for f in graph_def.library.function)]:
    for node in nodes:
      node.ClearField("experimental_debug_info")
  rest = computation_pb2.Computation()
  rest.CopyFrom(proto)
  rest.tensorflow.ClearField("graph_def")
  return hashlib.sha256(graph_def.SerializeToString(deterministic=True) +
                        rest.SerializeToString(deterministic=True)).digest()
