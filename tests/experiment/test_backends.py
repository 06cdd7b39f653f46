"""The execution backends behind one protocol, and the plan's choice among them.

Every backend has the calls of `backends.Backend` (the only calls a run makes),
with one round method of the same signature; `build_backend` builds the
backend the plan names, with the plan's settings, and nothing else reads the
backend's name to pick one.
"""

import inspect

import pytest

from tests.helpers import tiny
from tff_fedadamom import runtime as backends
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.runtime import inprocess, ray, tff_cpp
from tff_fedadamom.experiment.process import build_process

CLASSES = {"inprocess": inprocess.InProcessLearningProcess, "tff_cpp": tff_cpp.TffCppProcess,
           "ray": ray.RayLearningProcess}
CALLS = ("initialize", "next_for_clients", "get_model_weights", "get_hparams", "set_hparams",
         "close")


def test_the_protocol_lists_the_calls_a_run_makes():
  assert sorted(n for n in vars(backends.Backend) if not n.startswith("_")) == sorted(CALLS)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_backend_class_has_every_call_and_the_same_round_signature(name):
  cls = CLASSES[name]
  assert [c for c in CALLS if not hasattr(cls, c)] == []
  round_parameters = list(inspect.signature(cls.next_for_clients).parameters)
  assert round_parameters == ["self", "state", "client_ids", "round_num"]


def test_the_backends_no_longer_inherit_from_one_another():
  assert not issubclass(ray.RayLearningProcess, inprocess.InProcessLearningProcess)
  assert not hasattr(inprocess.InProcessLearningProcess, "takes_client_ids")


class _NoRound:
  """Has every call of a backend but its round."""

  def initialize(self):
    return 0

  def get_model_weights(self, state):
    return state

  get_hparams = get_model_weights

  def set_hparams(self, state, hparams):
    return state

  def close(self):
    pass


def test_an_object_without_the_round_method_is_not_a_backend():
  assert not isinstance(_NoRound(), backends.Backend)


def test_built_inprocess_and_tff_cpp_backends_are_backends(tmp_path):
  """Real objects, as a run gets them (the tff_cpp one starts its worker_binary
  only on a first call, which this test does not make)."""
  plan = parts_lib.make_plan(tiny(tmp_path))
  parts = parts_lib.build_parts(plan)
  try:
    assert isinstance(parts.process, inprocess.InProcessLearningProcess)
    assert isinstance(parts.process, backends.Backend)
  finally:
    parts.process.close()
  cpp_plan = parts_lib.make_plan(tiny(tmp_path, runtime={"backend": "tff_cpp"}))
  wrapper = backends.build_backend(cpp_plan, build_process(cpp_plan.config, parts.data))
  try:
    assert isinstance(wrapper, backends.Backend)
    assert wrapper.runtime.worker_binary is None
  finally:
    wrapper.close()


class _Built:
  """Records how a backend class was called."""

  def __init__(self, *args, **kwargs):
    self.args, self.kwargs = args, kwargs


@pytest.mark.parametrize("section,expected", [
    ({}, "inprocess"),  # auto
    ({"backend": "inprocess", "max_concurrent_clients": 3}, "inprocess"),
    ({"backend": "tff_cpp", "max_concurrent_clients": 2}, "tff_cpp"),
    ({"backend": "ray", "workers": 3, "cpus_per_worker": 0.5}, "ray"),
])
def test_the_plan_chooses_the_backend_and_its_settings(tmp_path, monkeypatch, section, expected):
  for name, module in (("inprocess", inprocess), ("tff_cpp", tff_cpp), ("ray", ray)):
    monkeypatch.setattr(module, CLASSES[name].__name__,
                        type(name, (_Built,), {"kind": name}))
  plan = parts_lib.make_plan(tiny(tmp_path, runtime=section))
  assert plan.backend == expected
  process, client_tensors = object(), object()
  built = backends.build_backend(plan, process, client_tensors)
  assert built.kind == expected and built.args[0] is process
  concurrent = section.get("max_concurrent_clients")
  if expected == "inprocess":
    assert built.kwargs == dict(devices=list(plan.devices), max_concurrent_clients=concurrent,
                                client_tensors=client_tensors)
  elif expected == "tff_cpp":
    assert built.args[1] is client_tensors
    assert built.kwargs == dict(max_concurrent_clients=concurrent)
  else:
    assert built.args[1] is plan.config  # the actors load the validated config's data
    assert built.kwargs["actors"] == 3 and built.kwargs["cpus_per_actor"] == 0.5
    assert plan.devices == ("ray actor 0 (CPU)", "ray actor 1 (CPU)", "ray actor 2 (CPU)")


def test_round_devices_name_each_backends_devices(tmp_path):
  config = parts_lib.make_plan(tiny(tmp_path)).config
  assert backends.round_devices("tff_cpp", config.runtime) == [tff_cpp.TFF_CPP_DEVICE]
  assert backends.round_devices("inprocess", config.runtime) == inprocess.visible_devices()
