"""Values <-> the flat leaves a TensorFlow computation takes and returns.

A TFF TensorFlow computation binds each leaf of its parameter and result type
(tensors, and a sequence's variant tensor) to one graph tensor, in type order.
`flatten_value` turns a value into those leaves; `to_python` turns a
computation's flat results back into the Python containers TFF's own contexts
return.

TFF's `type_conversions.type_to_py_container` walks the result type on every
call, a sizeable part of a small model's round. The containers depend on the
type alone, so here the walk is done once per type: TFF's own function converts
a struct of numbered marks, and that template becomes a function that copies
it with each mark's leaf (`_builder`; any container it does not know keeps
TFF's walk). `tf.nest.pack_sequence_as` would copy too, but kept a block or two
of memory per call for good (`tests/experiment/test_round_memory.py`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import attrs
import tensorflow as tf
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import type_conversions


def type_leaves(type_spec) -> list:
  """The TensorType/SequenceType leaves of `type_spec`, in the order of its bindings."""
  if isinstance(type_spec, computation_types.FederatedType):
    return type_leaves(type_spec.member)
  if isinstance(type_spec, computation_types.StructType):
    return [leaf for _, element in structure.iter_elements(type_spec)
            for leaf in type_leaves(element)]
  return [type_spec]


def _element_values(value) -> list:
  """The elements of a container in order, as `structure.from_container(value)`
  gives them, without its recursive inner function: each call of that leaves
  one behind in a reference cycle for the garbage collector."""
  if isinstance(value, structure.Struct):
    return [v for _, v in structure.iter_elements(value)]
  if attrs.has(type(value)):
    return list(attrs.asdict(value, recurse=False).values())
  if isinstance(value, Mapping):
    return list(value.values())
  if isinstance(value, (tuple, list)):  # namedtuples too, in field order
    return list(value)
  return [v for _, v in structure.iter_elements(structure.from_container(value))]


def _flatten(value, type_spec) -> list:
  """The leaves of `value` (Python containers, Structs, arrays, datasets) in type order."""
  if isinstance(type_spec, computation_types.FederatedType):
    return _flatten(value, type_spec.member)
  if isinstance(type_spec, computation_types.StructType):
    return [leaf for v, (_, t) in zip(_element_values(value), structure.iter_elements(type_spec))
            for leaf in _flatten(v, t)]
  return [value]


def flatten_value(value, type_spec, created: Optional[list] = None) -> list:
  """The leaves of `value` as a TensorFlow computation takes them: tensors, and
  a dataset's variant tensor. Tensors converted here are appended to `created`."""
  out = []
  for leaf, leaf_type in zip(_flatten(value, type_spec), type_leaves(type_spec)):
    if isinstance(leaf_type, computation_types.SequenceType):
      out.append(leaf._variant_tensor)  # noqa: SLF001
    else:
      out.append(tf.convert_to_tensor(leaf, leaf_type.dtype))
      if created is not None and out[-1] is not leaf:
        created.append(out[-1])
  return out


def pack(leaves, type_spec):
  """`structure.Struct`s following `type_spec`, filled from the iterator `leaves`."""
  if isinstance(type_spec, computation_types.FederatedType):
    return pack(leaves, type_spec.member)
  if isinstance(type_spec, computation_types.StructType):
    return structure.Struct([(name, pack(leaves, element))
                             for name, element in structure.iter_elements(type_spec)])
  return next(leaves)


class _Mark:
  """Stands for leaf `index` while the containers of a type are worked out."""

  __slots__ = ("index",)

  def __init__(self, index: int):
    self.index = index


def _builder(template) -> Optional[Callable[[Sequence], Any]]:
  """A function of the flat leaves that makes a fresh copy of `template`, each
  mark replaced by its leaf; None if `template` holds a container it does not
  know (TFF's walk then stays)."""
  if isinstance(template, _Mark):
    index = template.index
    return lambda leaves: leaves[index]
  cls = type(template)
  if attrs.has(cls):
    fields = attrs.fields(cls)
    if not all(f.init for f in fields):
      return None
    names = [f.name for f in fields]
    values = [getattr(template, name) for name in names]
    make = lambda items: cls(**dict(items))  # noqa: E731
  elif isinstance(template, dict):  # dict, OrderedDict: the template's key order
    names, values, make = list(template), list(template.values()), cls
  elif isinstance(template, (list, tuple)):
    names, values = None, list(template)
    make = (lambda items: cls(*items)) if hasattr(cls, "_fields") else cls  # namedtuple
  else:
    return None
  parts = [_builder(value) for value in values]
  if any(part is None for part in parts):
    return None
  if names is None:
    return lambda leaves: make([part(leaves) for part in parts])
  return lambda leaves: make([(n, part(leaves)) for n, part in zip(names, parts)])


def walk(leaves: Sequence, type_spec):
  """TFF's own conversion of flat leaves to its Python containers."""
  return type_conversions.type_to_py_container(pack(iter(leaves), type_spec), type_spec)


@functools.lru_cache(maxsize=512)
def _layout(type_spec) -> Optional[Callable[[Sequence], Any]]:
  """`_builder` of TFF's containers for `type_spec`, holding marks."""
  return _builder(walk([_Mark(i) for i in range(len(type_leaves(type_spec)))], type_spec))


def to_python(leaves: Sequence, type_spec):
  """Flat leaves (in type order) -> the Python containers TFF's own contexts return."""
  build = _layout(type_spec)
  return walk(leaves, type_spec) if build is None else build(leaves)
