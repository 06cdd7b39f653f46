"""The in-process backend: rounds equal TFF's C++ runtime's, with no child and no port.

Parity: from the same state and client datasets, three rounds on `inprocess`
equal three rounds on TFF's own runtime (`tff_cpp`) to float32 tolerance: a
relative error (Frobenius norm of the difference over the norm) of at most 1e-5
per state tensor. The two run the same TensorFlow graphs but not bit-identically
(different kernels' summation orders), and training amplifies such differences
with every local step, so the cases keep few local steps: on Fashion-MNIST's CNN
with 10 steps a client, one intra-op thread instead of two already moves the
weights by about 6e-5.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.experiment.device_calls import record_devices
from tests.helpers import ROOT, tiny
from tff_fedadamom import methods
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom import runtime as backends
from tff_fedadamom.runtime import graph_defs
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.runtime import inprocess, tff_cpp
from tff_fedadamom.experiment.plan import training_loop
from tff_fedadamom.experiment.process import build_process, client_datasets, load_data

_REDUCE = tff.learning.LoopImplementation.DATASET_REDUCE
_ITERATOR = tff.learning.LoopImplementation.DATASET_ITERATOR
_TOLERANCE = 1e-5  # per model weight tensor
# The optimizer state holds quotients of small numbers (FedAdamom's v is ~1e-6 on
# the char-LSTM), whose relative errors run larger than the weights'.
_STATE_TOLERANCE = 1e-4


def _relative_errors(a, b) -> list[float]:
  out = []
  for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = np.linalg.norm(x)
    out.append(float(np.linalg.norm(x - y) / scale) if scale else float(np.abs(y).max(initial=0)))
  return out


def _three_rounds(raw, loop=_REDUCE, state_tolerance=_STATE_TOLERANCE):
  """States after 3 rounds on TFF's runtime and in-process, from one initial state."""
  config = load_config(raw)
  data = load_data(config)
  return _three_rounds_of(config, data, build_process(config, data, loop), state_tolerance)


def _three_rounds_of(config, data, process, state_tolerance=_STATE_TOLERANCE, compiled=None):
  """`_three_rounds` of an already built process; in-process from `compiled`,
  its `compile_process`, if the caller has it."""
  local = inprocess.InProcessLearningProcess(process if compiled is None else compiled)
  ids = list(data.train.client_ids)
  reference = process.initialize()
  ours = local.initialize()
  assert max(_relative_errors(reference, ours)) == 0.0
  for round_num in range(1, 4):
    clients = ids[round_num:round_num + 3]
    reference_out = process.next(reference, client_datasets(config, data, clients, round_num))
    ours_out = local.next(ours, client_datasets(config, data, clients, round_num))
    reference, ours = reference_out.state, ours_out.state
  assert max(_relative_errors(reference, ours)) <= state_tolerance
  for key in ("loss", "num_examples"):
    np.testing.assert_allclose(ours_out.metrics["client_work"]["train"][key],
                               reference_out.metrics["client_work"]["train"][key], rtol=1e-5)
  local.close()
  return reference.global_model_weights, ours.global_model_weights


def _few_steps(raw, examples=32):
  raw["client"] = {**raw["client"], "max_examples": examples, "batch_size": 16}
  return raw


SERVER_OPTIMIZERS = [n for n in methods.list_optimizers()
                     if not methods.is_learning_process(n)]
PROCESSES = [n for n in methods.list_optimizers() if methods.is_learning_process(n)]


@pytest.mark.parametrize("name", SERVER_OPTIMIZERS + PROCESSES)
def test_every_optimizer_matches_tff_runtime(tmp_path, name):
  hparams = {k: v for k, v in methods.default_hparams(name).items()
             if k in ("learning_rate",)}
  raw = _few_steps(tiny(tmp_path, model={"name": "mlp", "options": {"hidden": [16]}},
                        server={"optimizer": name, **hparams}))
  reference, ours = _three_rounds(raw)
  assert max(_relative_errors(reference, ours)) <= _TOLERANCE


@pytest.mark.parametrize("weighting,lr_decay", [("num_examples", 1.0), ("uniform", 0.9),
                                                ("num_examples", 0.9)])
def test_weighting_and_client_lr_decay_match(tmp_path, weighting, lr_decay):
  raw = _few_steps(tiny(tmp_path, server__client_weighting=weighting,
                        client__lr_decay=lr_decay))
  reference, ours = _three_rounds(raw)
  assert max(_relative_errors(reference, ours)) <= _TOLERANCE


# TFF's worker_binary is its own TensorFlow build: its convolution kernels round
# differently from this process's single-threaded ones, and three rounds of
# FedAdamom amplify that. Measured on this config: 3.8e-3 per weight tensor,
# 8.4e-3 on the optimizer state (the MLP and char-LSTM stay within 1e-5).
_CNN_TFF_CPP_TOLERANCE = 2e-2


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
  """The CNN (dropout) on MNIST digits, few local steps: config, data, its
  process built for each loop implementation, and each process compiled
  (`compile_process`, what every in-process backend of it runs), shared by the
  module's tests."""
  from tff_fedadamom.runtime.compiled import compile_process

  config = load_config(_few_steps(tiny(tmp_path_factory.mktemp("cnn"), model={"name": "cnn"},
                                       data={"name": "mnist5k", "num_clients": 20})))
  data = load_data(config)
  processes = {loop: build_process(config, data, loop) for loop in (_REDUCE, _ITERATOR)}
  compiled = {loop: compile_process(process) for loop, process in processes.items()}
  return config, data, processes, compiled


def test_cnn_with_dropout_matches(cnn):
  config, data, processes, compiled = cnn
  reference, ours = _three_rounds_of(config, data, processes[_REDUCE],
                                     state_tolerance=_CNN_TFF_CPP_TOLERANCE,
                                     compiled=compiled[_REDUCE])
  assert max(_relative_errors(reference, ours)) <= _CNN_TFF_CPP_TOLERANCE


def test_char_lstm_matches(tmp_path):
  raw = _few_steps(tiny(tmp_path, model={"name": "char_lstm",
                                         "options": {"embedding_dim": 8, "lstm_units": 16}},
                        data={"name": "shakespeare", "options": {"seq_length": 20}},
                        client__clip_norm=10.0), examples=16)
  reference, ours = _three_rounds(raw)
  assert max(_relative_errors(reference, ours)) <= _TOLERANCE


def test_seeded_dropout_needs_no_fresh_kernels_and_restarts_per_client(cnn):
  """The CNN's seeded dropout keeps its step in a model variable, so TFF's
  iterator loop (compiled once, called for client after client) gives exactly
  the rounds of `dataset.reduce` (which instantiates its body per client), and
  they do not depend on how many clients run at once."""
  config, data, _, compiled = cnn
  states = {}
  for loop, concurrency in ((_ITERATOR, 1), (_ITERATOR, 3), (_REDUCE, 1)):
    local = inprocess.InProcessLearningProcess(compiled[loop],
                                               max_concurrent_clients=concurrency)
    assert not local._work.fresh_kernels  # noqa: SLF001
    state = local.initialize()
    for round_num in (1, 2):
      clients = list(data.train.client_ids)[:3]
      state = local.next(state, client_datasets(config, data, clients, round_num)).state
    states[loop, concurrency] = tf.nest.flatten(state)
    local.close()
  for other in ((_ITERATOR, 3), (_REDUCE, 1)):
    for a, b in zip(states[_ITERATOR, 1], states[other], strict=True):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("model,loop", [
    ("logistic", _ITERATOR),  # no random op
    ("cnn", _REDUCE),         # dropout inside dataset.reduce: restarts by itself
    ("cnn", _ITERATOR),       # SeededDropout: its step is a model variable
])
def test_no_fresh_kernels_for_the_zoo_models(tmp_path, cnn, model, loop):
  if model == "cnn":
    process = cnn[3][loop]
  else:
    config = load_config(tiny(tmp_path, model={"name": model},
                              data={"name": "mnist5k", "num_clients": 20}))
    process = build_process(config, load_data(config), loop)
  local = inprocess.InProcessLearningProcess(process)
  assert local._work.fresh_kernels is False  # noqa: SLF001
  local.close()


@pytest.mark.parametrize("seeded_op,fresh", [(True, True), (False, False)])
def test_fresh_kernels_only_where_a_seeded_random_op_would_go_on(seeded_op, fresh):
  """A user's model with Keras' stateful seeded dropout, compiled once in an
  iterator loop, would continue its masks from call to call: such graphs are
  imported afresh per call."""

  @tf.function
  def body(x):
    noise = tf.random.uniform([3], seed=1) if seeded_op else tf.zeros([3])
    return x + noise

  graph_def = body.get_concrete_function(tf.TensorSpec([3])).graph.as_graph_def()
  assert graph_defs.needs_fresh_kernels(graph_def) is fresh


def test_hparams_round_trip(tmp_path):
  config = load_config(tiny(tmp_path))
  process = build_process(config, load_data(config))
  local = inprocess.InProcessLearningProcess(process)
  state = local.initialize()
  hparams = local.get_hparams(state)
  assert hparams == process.get_hparams(process.initialize())
  hparams["finalizer"]["learning_rate"] = 0.25
  changed = local.set_hparams(state, hparams)
  assert local.get_hparams(changed)["finalizer"]["learning_rate"] == pytest.approx(0.25)
  assert type(changed) is type(state)
  local.close()


# In a fresh interpreter whose CPU TensorFlow splits into two logical devices:
# (1) a whole experiment, recording every process it starts; then its children
# and listening sockets. The recording starts after the imports: importing
# TensorFlow runs two short probes of other libraries (`uname -p` from Python's
# `platform`, `lscpu` from numpy.testing). (2) Two rounds of the same config's
# process on one device and on both, call by call and as one TensorFlow call
# each: the states, and where the clients ran.
_CHILD = textwrap.dedent("""
    import json, os, subprocess, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tensorflow_federated
    from tff_fedadamom.session import Session
    Session().apply()
    from tests import process_table as processes
    from tests.experiment.device_calls import record_devices
    from tff_fedadamom.config import load_config
    from tff_fedadamom.experiment import run_experiment
    from tff_fedadamom.runtime import inprocess
    from tff_fedadamom.experiment.process import client_datasets, load_data
    started = []
    _Popen = subprocess.Popen
    class Recording(_Popen):
      def __init__(self, args, *rest, **kwargs):
        started.append(str(args))
        super().__init__(args, *rest, **kwargs)
    subprocess.Popen = Recording
    result = run_experiment(json.loads(sys.argv[1]), progress=False)
    isolation = {"started": started, "children": processes.descendants(os.getpid()),
                 "listening": processes.listening([os.getpid()]),
                 "backend": result.summary["backend"], "devices": result.summary["devices"]}

    config = load_config(json.loads(sys.argv[1]))
    data = load_data(config)
    # The run above stored its compiled process in the session's cache.
    from tff_fedadamom.experiment.parts import learning_process
    process = learning_process(config, data)
    states, used = {}, {}
    for devices in (["CPU:0"], ["CPU:0", "CPU:1"]):
      local = inprocess.InProcessLearningProcess(process, devices=devices)
      used[len(devices)] = record_devices(local._work)
      state = local.initialize()
      for round_num in (1, 2):
        clients = list(data.train.client_ids)[:4]
        state = local.next(state, client_datasets(config, data, clients, round_num)).state
      states[len(devices)] = [np.asarray(x) for x in tf.nest.flatten(state)]
      local.close()
    equal = {name: len(states[1]) == len(leaves) and all(
        np.array_equal(a, b) for a, b in zip(states[1], leaves)) for name, leaves in states.items()}
    print(json.dumps({"isolation": isolation, "equal": equal, "used": used}))
""")


@pytest.fixture(scope="module")
def child_report(tmp_path_factory):
  """The report of one `_CHILD` run (one interpreter start for two tests)."""
  raw = tiny(tmp_path_factory.mktemp("child") / "run", rounds=2)
  done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(raw)],
                        capture_output=True, text=True, timeout=600,
                        env={**os.environ, "PYTHONPATH": ROOT})
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_inprocess_run_starts_no_process_and_opens_no_port(child_report):
  report = child_report["isolation"]
  assert report["backend"] == "inprocess"
  assert report["devices"] and all("device:" in d for d in report["devices"])
  assert report["started"] == []
  assert report["children"] == []
  assert report["listening"] == []


def test_tff_cpp_backend_names_its_worker(tmp_path):
  result = run_experiment(tiny(tmp_path / "run", rounds=1, runtime={"backend": "tff_cpp"}),
                          progress=False)
  assert result.summary["backend"] == "tff_cpp"
  assert result.summary["devices"] == [tff_cpp.TFF_CPP_DEVICE]


@pytest.mark.parametrize("runtime_section,field,wording", [
    ({"backend": "gpu"}, "runtime.backend", "'tff_cpp' or 'ray'"),
    ({"devices": ["TPU:0"]}, "runtime.devices", "['GPU:0', 'GPU:1']"),
    ({"devices": []}, "runtime.devices", "non-empty list"),
    ({"backend": "tff_cpp", "devices": ["CPU:0"]}, "runtime.devices", "backend 'inprocess'"),
])
def test_bad_runtime_fields_are_config_errors(tmp_path, runtime_section, field, wording):
  with pytest.raises(ConfigError) as error:
    load_config(tiny(tmp_path, runtime=runtime_section))
  assert field in str(error.value) and wording in str(error.value)


def test_invisible_device_fails_before_any_round(tmp_path):
  with pytest.raises(ConfigError, match=r"runtime\.devices.*GPU:7.*CPU:0"):
    run_experiment(tiny(tmp_path / "run", runtime={"devices": ["GPU:7"]}), progress=False)
  assert not os.path.exists(tmp_path / "run" / "metrics.csv")


def test_clients_spread_over_two_logical_devices(child_report):
  # 4 clients a round, 2 rounds: round-robin puts 4 on each of two devices.
  assert {d.split("device:")[-1]: n for d, n in child_report["used"]["2"].items()} == {
      "CPU:0": 4, "CPU:1": 4}
  assert {d.split("device:")[-1]: n for d, n in child_report["used"]["1"].items()} == {"CPU:0": 8}
  # The same states on one device and two.
  assert child_report["equal"] == {"1": True, "2": True}


@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                    reason="TensorFlow sees no GPU here")
def test_client_training_runs_on_the_gpu(tmp_path):
  config = load_config(tiny(tmp_path, model={"name": "mlp"},
                            data={"name": "mnist5k", "num_clients": 20}))
  data = load_data(config)
  plan = parts_lib.make_plan(config)
  assert all("GPU" in d for d in plan.devices)
  local = backends.build_backend(plan, build_process(config, data, training_loop(plan.devices)))
  used = record_devices(local._work)  # noqa: SLF001
  tf.config.experimental.reset_memory_stats("GPU:0")
  state = local.next(local.initialize(), client_datasets(
      config, data, list(data.train.client_ids)[:2], 1)).state
  # The training loop's weights and activations were allocated on the GPU.
  assert tf.config.experimental.get_memory_info("GPU:0")["peak"] > 0
  assert used and all("GPU" in d for d in used)
  assert all(np.all(np.isfinite(x)) for x in tf.nest.flatten(state))
  local.close()
