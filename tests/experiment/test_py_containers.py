"""`py_containers.to_python` (TFF's containers laid out once per type, then copied
with the leaves) returns exactly what TFF's own `type_to_py_container` returns:
the same container classes, key orders and leaves, on hand-made types and on
every result type of a real learning process."""

import collections

import attrs
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedadamom.runtime import py_containers

Point = collections.namedtuple("Point", ["y", "x"])


@attrs.define
class Weights:
  trainable: list
  frozen: list


class NotANest:
  """A named container TFF accepts (it has `_fields` and `_asdict`) that
  `py_containers` does not know (not a tuple): its types keep TFF's walk."""

  _fields = ("a", "b")

  def __init__(self, a, b):
    self.a, self.b = a, b

  def _asdict(self):
    return {"a": self.a, "b": self.b}

  def __eq__(self, other):
    return type(other) is NotANest and _same(self.a, other.a) and _same(self.b, other.b)


def _t(shape=(2,), dtype=np.float32):
  return tff.TensorType(dtype, shape)


TYPES = {
    "tensor": _t(),
    "namedtuple, fields out of sorted order": tff.StructWithPythonType(
        [("y", _t()), ("x", _t((3,)))], Point),
    "attrs": tff.StructWithPythonType(
        [("trainable", tff.StructWithPythonType([_t(), _t((1,))], list)),
         ("frozen", tff.StructWithPythonType([], list))], Weights),
    "dict, keys out of sorted order": tff.StructWithPythonType(
        [("zeta", _t()), ("alpha", _t((), np.int64)), ("mid", _t())], dict),
    "nested ordered dicts, tuples, no container": tff.FederatedType(tff.StructWithPythonType(
        [("state", tff.StructType([("b", _t()), ("a", tff.StructType([_t(), _t()]))])),
         ("metrics", tff.StructWithPythonType([("loss", _t(()))], collections.OrderedDict)),
         ("empty", tff.StructWithPythonType([], collections.OrderedDict))],
        collections.OrderedDict), tff.SERVER),
    "unknown container": tff.StructWithPythonType([("a", _t()), ("b", _t((1,)))], NotANest),
}


def _same(a, b) -> bool:
  """Equal values in containers of the same classes, keys in the same order."""
  if type(a) is not type(b):
    return False
  if isinstance(a, np.ndarray):
    return a.dtype == b.dtype and np.array_equal(a, b)
  if isinstance(a, dict):
    return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  if attrs.has(type(a)):
    return _same(attrs.astuple(a, recurse=False), attrs.astuple(b, recurse=False))
  return a == b


def _leaves(type_spec, rng):
  return [rng.normal(size=t.shape).astype(t.dtype.type) if t.shape else
          np.asarray(rng.integers(0, 100), t.dtype.type)
          for t in py_containers.type_leaves(type_spec)]


@pytest.mark.parametrize("name", list(TYPES))
def test_same_containers_and_leaves_as_tff(name):
  type_spec = TYPES[name]
  rng = np.random.default_rng(0)
  for _ in range(2):  # the second call reuses the type's layout
    leaves = _leaves(type_spec, rng)
    assert _same(py_containers.to_python(leaves, type_spec),
                 py_containers.walk(leaves, type_spec))


def test_only_types_with_unknown_containers_keep_tffs_walk():
  assert py_containers._layout(TYPES["unknown container"]) is None  # noqa: SLF001
  for name, type_spec in TYPES.items():
    if name != "unknown container":
      assert py_containers._layout(type_spec) is not None, name  # noqa: SLF001


def test_every_result_of_a_learning_process(tmp_path):
  """FedAdamom's process (state with its optimizer's hparams, ModelWeights,
  metrics), FedCAda's (a whole learning process of its own)."""
  from tff_fedadamom.config import load_config
  from tff_fedadamom.experiment import parts as parts_lib
  from tff_fedadamom.experiment import process as process_lib

  rng = np.random.default_rng(1)
  for optimizer in ("fedadamom", "fedcada"):
    config = load_config({
        "seed": 0, "rounds": 1, "clients_per_round": 2, "output_dir": str(tmp_path),
        "data": {"name": "digits", "num_clients": 4}, "model": {"name": "logistic"},
        "server": {"optimizer": optimizer}})
    compiled = parts_lib.learning_process(config, process_lib.load_data(config))
    assert {"initialize", "next", "get_model_weights"} <= set(compiled.result_types)
    for name, type_spec in compiled.result_types.items():
      assert py_containers._layout(type_spec) is not None, (optimizer, name)  # noqa: SLF001
      leaves = _leaves(type_spec, rng)
      assert _same(py_containers.to_python(leaves, type_spec),
                   py_containers.walk(leaves, type_spec)), \
          (optimizer, name)
