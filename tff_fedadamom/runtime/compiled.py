"""A learning process compiled to TensorFlow graphs, as bytes: what the in-process
and ray backends run, and what the process cache (`process_cache`) stores.

Building a TFF learning process traces its Python and compiling it to
MapReduceForm runs TFF's compiler, the same work in every worker and run of
one structure. What the backends run afterwards is only TensorFlow graphs
(`FORM_COMPUTATIONS`, `INITIALIZE`, `EXTRAS`).

`compile_process` keeps each one's serialized proto. A proto's type keeps the
structure but not the Python containers TFF's contexts return
(`LearningAlgorithmState`, `ModelWeights`, ...), so those are kept beside it as
a tree of importable class names (`container_tree`) and put back on load.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pkgutil
import zipfile
from typing import Any, Mapping, Optional

# The MapReduceForm computations a round runs (in this order in a serialized bundle).
FORM_COMPUTATIONS = ("prepare", "work", "zero", "accumulate", "report", "update")
INITIALIZE = "initialize"
EXTRAS = ("get_model_weights", "get_hparams", "set_hparams")
# The form's secure-aggregation computations: the in-process backends run plain sums only.
_SECURE = ("secure_sum_bitwidth", "secure_sum_max_input", "secure_modular_sum_modulus")
# Bumped when the bundle's layout changes.
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class CompiledProcess:
  """A learning process as serialized TensorFlow computations.

  Attributes:
    computations: name -> serialized TFF computation proto.
    result_types: name -> the result type with its Python containers, for
      `INITIALIZE`, `next` (`update`'s result as `process.next`'s) and `EXTRAS`.
  """

  computations: Mapping[str, bytes]
  result_types: Mapping[str, Any]

  def computation(self, name: str):
    """The computation `name` as `TFComputation` takes it (no TFF tracing)."""
    from tff_fedadamom.runtime.tf_computation import deserialize

    if name not in self.computations:
      raise AttributeError(f"the learning process has no {name!r}")
    return deserialize(self.computations[name])

  @property
  def state_type(self):
    """The server state's type (the result of `initialize`)."""
    return self.result_types[INITIALIZE]

  def to_bytes(self) -> bytes:
    """A zip archive: `manifest.json` (the container trees), `parts/` (the
    computations) and `types/` (the result types)."""
    from tensorflow_federated.python.core.impl.types import type_serialization

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
      manifest = {"format": FORMAT, "parts": sorted(self.computations), "results": {}}
      for name, type_spec in self.result_types.items():
        archive.writestr(f"types/{name}.pb",
                         type_serialization.serialize_type(type_spec).SerializeToString())
        manifest["results"][name] = container_tree(type_spec)
      for name, data in self.computations.items():
        archive.writestr(f"parts/{name}.pb", data)
      archive.writestr("manifest.json", json.dumps(manifest, sort_keys=True))
    return buffer.getvalue()

  @classmethod
  def from_bytes(cls, data: bytes) -> "CompiledProcess":
    """Inverse of `to_bytes`. Raises ValueError on a bundle it cannot read."""
    from tensorflow_federated.proto.v0 import computation_pb2
    from tensorflow_federated.python.core.impl.types import type_serialization

    try:
      with zipfile.ZipFile(io.BytesIO(data)) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        if manifest.get("format") != FORMAT:
          raise ValueError(f"bundle format {manifest.get('format')!r}, expected {FORMAT}")
        computations = {name: archive.read(f"parts/{name}.pb") for name in manifest["parts"]}
        types = {}
        for name, tree in manifest["results"].items():
          proto = computation_pb2.Type.FromString(archive.read(f"types/{name}.pb"))
          types[name] = with_containers(type_serialization.deserialize_type(proto), tree)
    except (KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
      raise ValueError(f"not a compiled-process bundle: {e}") from None
    return cls(computations, types)


def compile_process(process) -> CompiledProcess:
  """A TFF learning process's computations as a `CompiledProcess` (one already
  compiled is returned as it is).

  Raises:
    NotImplementedError: the process uses secure aggregation (`tff_cpp` runs it).
  """
  if isinstance(process, CompiledProcess):
    return process
  import tensorflow_federated as tff

  from tff_fedadamom.runtime.py_containers import type_leaves
  from tff_fedadamom.runtime.tf_computation import serialize

  mrf = tff.backends.mapreduce.get_map_reduce_form_for_computation(process.next)
  for name in _SECURE:
    if type_leaves(getattr(mrf, name).type_signature.result):
      raise NotImplementedError(
          f"the process uses secure aggregation ({name}); the in-process backend "
          "runs plain sums only: use runtime.backend: tff_cpp")
  init = tff.backends.mapreduce.get_state_initialization_computation(process.initialize)
  computations = {name: serialize(getattr(mrf, name)) for name in FORM_COMPUTATIONS}
  computations[INITIALIZE] = serialize(init)
  types = {INITIALIZE: process.initialize.type_signature.result,
           "next": process.next.type_signature.result}
  for name in EXTRAS:
    computation = getattr(process, name, None)
    if computation is not None:
      computations[name] = serialize(computation)
      types[name] = computation.type_signature.result
  return CompiledProcess(computations, types)


def container_tree(type_spec) -> Optional[dict]:
  """The Python containers of `type_spec`, as JSON: `{"f": member}` for a
  federated type, `{"e": [elements], "c": "module:Class"}` for a struct (no "c"
  for a plain one), None for a leaf.

  Raises:
    ValueError: a container cannot be named by import (a class defined in a function).
  """
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.types import computation_types as ct

  if isinstance(type_spec, ct.FederatedType):
    return {"f": container_tree(type_spec.member)}
  if not isinstance(type_spec, ct.StructType):
    return None
  tree: dict[str, Any] = {"e": [container_tree(t) for _, t in
                                structure.iter_elements(type_spec)]}
  if isinstance(type_spec, ct.StructWithPythonType):
    cls = type_spec.python_container
    if "<locals>" in cls.__qualname__:
      raise ValueError(f"container {cls.__qualname__} is defined inside a function")
    tree["c"] = f"{cls.__module__}:{cls.__qualname__}"
  return tree


def with_containers(type_spec, tree: Optional[dict]):
  """`type_spec` (as deserialized: no containers) with `container_tree`'s containers."""
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.types import computation_types as ct

  if tree is None:
    return type_spec
  if "f" in tree:
    return ct.FederatedType(with_containers(type_spec.member, tree["f"]),
                            type_spec.placement, type_spec.all_equal)
  elements = [(name, with_containers(t, sub)) for (name, t), sub in
              zip(structure.iter_elements(type_spec), tree["e"])]
  if "c" not in tree:
    return ct.StructType(elements)
  container = pkgutil.resolve_name(tree["c"])
  if not isinstance(container, type):
    raise ValueError(f"container {tree['c']} is not a class")
  return ct.StructWithPythonType(elements, container)
