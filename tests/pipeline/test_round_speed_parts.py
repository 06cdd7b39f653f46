"""The pieces that make a round cost its compute: flat computation calls, client
data built in-graph from tensors made once, and thread counts that change no number."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import concrete_function

from tests.pipeline.test_runner import ROOT, tiny
from tff_fedadamom.config import load_config
from tff_fedadamom.data.client_tensors import ClientTensors
from tff_fedadamom.data.preprocess import client_dataset, client_round_seed
from tff_fedadamom.pipeline.backends import inprocess
from tff_fedadamom.pipeline.process import build_process, load_data
from tff_fedadamom.session import SessionError, require_applied


def _batches(dataset):
  return [{k: np.asarray(v) for k, v in b.items()} for b in dataset.as_numpy_iterator()]


def _assert_same_batches(expected, actual):
  assert len(expected) == len(actual) and expected
  for e, a in zip(expected, actual):
    assert e.keys() == a.keys()
    for key in e:
      np.testing.assert_array_equal(e[key], a[key])


@pytest.mark.parametrize("client,data", [
    ({"batch_size": 16}, None),
    ({"batch_size": 7, "local_epochs": 2, "max_examples": 30}, None),
    # uint8 images, converted to float32 in one op rather than per example.
    ({"batch_size": 16, "max_examples": 40}, {"name": "fashion_mnist", "num_clients": 100}),
])
def test_client_tensors_give_the_batches_of_the_client_dataset(tmp_path, client, data):
  """Eagerly and inside a graph, a client's round batches are those of
  `client_dataset` over its `create_tf_dataset_for_client` dataset."""
  overrides = {"data": data} if data else {}
  config = load_config(tiny(tmp_path, client={"learning_rate": 0.1, **client}, **overrides))
  data = load_data(config)
  if overrides:
    assert data.train.client_arrays(data.train.client_ids[0])["x"].dtype == np.uint8
  tensors = ClientTensors(data.train, seed=config.seed, batch_size=config.client.batch_size,
                          local_epochs=config.client.local_epochs,
                          max_examples=config.client.max_examples)

  @tf.function
  def labels_in_graph(*args):
    return tensors.dataset(*args).reduce(
        tf.zeros([0], tf.int32), lambda acc, batch: tf.concat([acc, batch["y"]], 0))

  for cid in data.train.client_ids[:3]:
    source = data.train.create_tf_dataset_for_client(cid)
    if config.client.max_examples is not None:
      source = source.take(config.client.max_examples)
    expected = _batches(client_dataset(
        source, batch_size=config.client.batch_size, local_epochs=config.client.local_epochs,
        seed=client_round_seed(config.seed, 5, cid)))
    _assert_same_batches(expected, _batches(tensors.datasets([cid], 5)[0]))
    np.testing.assert_array_equal(labels_in_graph(*tensors.args(cid, 5)),
                                  np.concatenate([b["y"] for b in expected]))
    # Another round reshuffles.
    other = np.concatenate([b["y"] for b in _batches(tensors.datasets([cid], 6)[0])])
    assert len(other) == sum(len(b["y"]) for b in expected)


def test_computation_calls_skip_the_structured_signature(tmp_path, monkeypatch):
  """A computation call goes straight to the graph: TensorFlow 2.14's structured call
  path formats every argument tensor as text (milliseconds a call)."""
  config = load_config(tiny(tmp_path))
  data = load_data(config)
  from tff_fedadamom.pipeline import process as process_lib

  local = inprocess.InProcessLearningProcess(
      build_process(config, data), client_tensors=process_lib.make_client_tensors(config, data))
  state = local.initialize()
  reference = local.next_for_clients(state, data.train.client_ids[:3], 1).state

  def refuse(*args, **kwargs):
    raise AssertionError("a computation call went through the structured signature")

  monkeypatch.setattr(concrete_function.ConcreteFunction, "_call_with_structured_signature",
                      refuse)
  again = local.next_for_clients(state, data.train.client_ids[:3], 1).state
  for a, b in zip(tf.nest.flatten(reference), tf.nest.flatten(again)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(TypeError, match="next_for_clients"):
    local.next(state, [])
  local.close()


def test_library_runs_refuse_multithreaded_kernels():
  """The test session applied Session(): one intra-op thread. A run asking for
  another inter-op pool size than the process has is refused, not ignored."""
  require_applied()
  have = tf.config.threading.get_inter_op_parallelism_threads()
  with pytest.raises(SessionError, match=r"Session\(threads="):
    require_applied(have + 1)


def _describe_run(raw) -> dict:
  """Runs `raw` in this process: its final test accuracy and each weight's sum
  of squares."""
  from tff_fedadamom.pipeline import run_experiment

  summary = run_experiment(raw, progress=False).summary
  weights = tf.keras.models.load_model(raw["output_dir"] + "/model.keras").get_weights()
  return {"accuracy": summary["final_test_accuracy"],
          "weights": [float(np.sum(w.astype(np.float64) ** 2)) for w in weights]}


# `_describe_run` in a process of its own, sized to the run's threads first.
_RUN = """
import json, sys
from tff_fedadamom.session import Session
raw = json.loads(sys.argv[1])
Session(threads=raw["runtime"]["threads"]).apply()
from tests.pipeline.test_round_speed_parts import _describe_run
print(json.dumps(_describe_run(raw)))
"""


def test_cnn_numbers_do_not_depend_on_threads_or_concurrency(tmp_path):
  """The same CNN config (with seeded dropout) run in a process of 1 thread, one
  client at a time, and in this one, on the test session's threads (one per
  core), with 3 clients at once, gives identical weights."""
  session_threads = tf.config.threading.get_inter_op_parallelism_threads()
  if session_threads < 2:
    pytest.skip("one core: no second thread count to compare")
  out = []
  for threads, concurrent in ((1, 1), (session_threads, 3)):
    raw = tiny(tmp_path / f"t{threads}", rounds=2, eval_every=2, checkpoint_every=2,
               model={"name": "cnn"}, data={"name": "mnist5k", "num_clients": 20},
               client={"learning_rate": 0.05, "batch_size": 16, "max_examples": 32},
               runtime={"threads": threads, "max_concurrent_clients": concurrent})
    if threads > 1:
      out.append(_describe_run(raw))
      continue
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(raw)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    out.append(json.loads(done.stdout.strip().splitlines()[-1]))
  assert out[0] == out[1]


# The CNN has seeded dropout and conv layers. Optimized together with the rest
# of the round instead of alone, its weights differed after 2 rounds of 7 or
# more clients (not of 4 or 5).
_CNN = {"clients_per_round": 8, "model": {"name": "cnn"},
        "data": {"name": "mnist5k", "num_clients": 20},
        "client": {"learning_rate": 0.05, "batch_size": 16, "max_examples": 32}}


# `afters`: the processes' `fuse_after_rounds`, compared with call by call
# (None): 0, one call from the first round; 1, each client count's first round
# call by call and its second as one call (the switch a run's default makes).
@pytest.mark.parametrize("concurrent,overrides,afters", [
    (1, {}, (0, 1)), (None, {}, (0, 1)), (2, _CNN, (0,))],
                         ids=["logistic-1", "logistic-default", "cnn-2"])
def test_a_fused_round_is_the_call_by_call_round(tmp_path, concurrent, overrides, afters):
  """One TensorFlow call per round (`fused_round`) gives bit for bit the state of
  the same rounds run call by call, whatever the model and the concurrent
  clients (by default, all of them; and on two devices:
  tests/pipeline/test_inprocess.py's child runs fused rounds on one and on two
  logical CPUs and compares them); so does a run whose rounds switch from one
  to the other (`fuse_after_rounds`, the default's behaviour)."""
  from tff_fedadamom.pipeline import parts as parts_lib
  from tff_fedadamom.pipeline.process import make_client_tensors

  config = load_config(tiny(tmp_path, **{"clients_per_round": 4, **overrides}))
  k = config.clients_per_round
  data = load_data(config)
  compiled = parts_lib.learning_process(config, data, [])
  states = {}
  for after in (*afters, None):
    process = inprocess.InProcessLearningProcess(
        compiled, max_concurrent_clients=concurrent,
        client_tensors=make_client_tensors(config, data), fuse_after_rounds=after)
    assert process.fused_rounds is (after is not None)
    # Default on the lone CPU: all of a fused round's clients at once.
    assert process._clients.fused_concurrency(k) == (concurrent or k)  # noqa: SLF001
    state = process.initialize()
    sizes = (k, k, k - 1, k - 1)  # a fused round per client count
    for r, size in enumerate(sizes, 1):
      state = process.next_for_clients(state, data.train.client_ids[r:r + size], r).state
    assert sorted(process._fusion._built) == ([] if after is None else [k - 1, k])  # noqa: SLF001
    states[after] = [np.asarray(x) for x in tf.nest.flatten(state)]
    process.close()
  assert len(states[0]) == len(states[None]) > 2
  for after in afters:
    for fused_leaf, call_leaf in zip(states[after], states[None], strict=True):
      np.testing.assert_array_equal(fused_leaf, call_leaf)
  assert not np.array_equal(states[0][0], np.asarray(
      tf.nest.flatten(process.initialize())[0]))  # the rounds did train


def test_a_fused_round_starts_from_the_state_as_its_caller_left_it(tmp_path):
  """A fused round gives the next one its state's tensors as they are (no
  conversion); the state's arrays are those tensors' memory, so a caller that
  writes into them, replaces one in the state's lists, or passes another
  state, gets the round of the state it passed, as the calls one by one give
  it."""
  import copy

  from tff_fedadamom.pipeline import parts as parts_lib
  from tff_fedadamom.pipeline.process import make_client_tensors

  config = load_config(tiny(tmp_path, clients_per_round=3))
  data = load_data(config)
  compiled = parts_lib.learning_process(config, data, [])
  clients = data.train.client_ids[:3]
  fused, calls = (inprocess.InProcessLearningProcess(
      compiled, client_tensors=make_client_tensors(config, data), fuse_after_rounds=after)
      for after in (0, None))
  state = fused.next_for_clients(fused.initialize(), clients, 1).state
  trainable = state.global_model_weights.trainable
  carried = fused._carried[0]  # noqa: SLF001  (the next round takes their tensors)
  assert any(a is trainable[0] for a in carried) and any(a is trainable[-1] for a in carried)
  kernel = trainable[0]
  assert kernel.any()
  kernel[...] = 0.0  # a caller's own change, made in place
  trainable[-1] = trainable[-1] + 1.0  # and an array replaced in the state's list
  for given in (state, copy.deepcopy(state)):
    expected = calls.next_for_clients(copy.deepcopy(given), clients, 2).state
    actual = fused.next_for_clients(given, clients, 2).state
    for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(actual), strict=True):
      np.testing.assert_array_equal(e, a)
  fused.close()
  calls.close()


def test_a_state_leaf_a_round_passes_through_is_seen():
  """`passes_through` finds an output array that is its input's memory (what
  TensorFlow's Identity returns), and only that: a state holding one is not
  carried to the next round, whose arrays would be the caller's."""
  spec = tf.TensorSpec([3], tf.float32)
  identity = tf.function(lambda x, s: (tf.identity(x), s + 1.0)).get_concrete_function(
      spec, tf.TensorSpec([], tf.float32))
  changed = tf.function(lambda x, s: (x * 2.0, tf.identity(s))).get_concrete_function(
      spec, tf.TensorSpec([], tf.float32))
  given = [tf.constant([1.0, 2.0, 3.0]), tf.constant(1.0)]

  def views(function):  # the result arrays a fused round's state would hold
    return [t._numpy() for t in function._call_flat(given, [])]  # noqa: SLF001

  assert inprocess.passes_through(given, views(identity))
  # A scalar comes back as a numpy scalar (a copy): passing it through is harmless.
  assert not inprocess.passes_through(given, views(changed))


def test_fusion_waits_its_rounds_then_builds_once():
  """`Fusion` runs `after` groups of a client count one by one, then builds that
  count's one call once; None never builds; what TensorFlow cannot build, it
  stops asking for."""
  from tff_fedadamom.pipeline.backends.fused_round import Fusion

  built = []

  def build(k):
    built.append(k)
    return f"one call of {k}"

  fusion = Fusion(2)
  got = [fusion.get(k, lambda k=k: build(k), "x") for k in (5, 5, 4, 5, 5, 4, 4)]
  assert got == [None, None, None, "one call of 5", "one call of 5", None, "one call of 4"]
  assert built == [5, 4] and fusion.enabled
  never = Fusion(None)
  assert [never.get(5, lambda: build(5), "x") for _ in range(3)] == [None] * 3
  assert built == [5, 4] and not never.enabled
  with pytest.raises(ValueError, match="fuse_after_rounds must be an integer >= 0"):
    Fusion(-1)

  def refuse():
    raise tf.errors.InternalError(None, None, "Missing src context")

  failing = Fusion(0)
  assert failing.get(3, refuse, "x") is None and not failing.enabled
  assert failing.get(3, lambda: build(3), "x") is None and built == [5, 4]


@pytest.mark.parametrize("part", ["FusedRound", "FusedWork"])
def test_a_round_tensorflow_cannot_fuse_runs_call_by_call(tmp_path, monkeypatch, caplog, part):
  """When TensorFlow fails to build the one graph (as it once did for a ResNet-18
  `work`), the calls run one by one, with a one-line warning and the same bits."""
  from tff_fedadamom.pipeline import parts as parts_lib
  from tff_fedadamom.pipeline.backends import fused_round
  from tff_fedadamom.pipeline.process import make_client_tensors

  config = load_config(tiny(tmp_path, clients_per_round=3))
  data = load_data(config)
  compiled = parts_lib.learning_process(config, data, [])
  clients = data.train.client_ids[:3]

  def rounds(process, fold=None):
    state = process.initialize()
    for r in (1, 2):
      if fold is None:
        state = process.next_for_clients(state, clients, r).state
      else:  # the ray actors' part: the clients' work, then the fold
        state = process.server.round(state, lambda broadcast, r=r: fold.fold(fold.work_outputs(
            [process._client_tensors.args(c, r) for c in clients], broadcast)))[0]  # noqa: SLF001
    return [np.asarray(x) for x in tf.nest.flatten(state)]

  def process(**kwargs):
    return inprocess.InProcessLearningProcess(
        compiled, client_tensors=make_client_tensors(config, data), **kwargs)

  expected = rounds(process(fuse_after_rounds=None))

  def refuse(*args, **kwargs):
    raise tf.errors.InternalError(None, None, "Missing src context")

  monkeypatch.setattr(getattr(fused_round, part), "__init__", refuse)
  fallback = process(fuse_after_rounds=0)
  fold = None
  if part == "FusedWork":
    fold = inprocess.ClientFold(*(compiled.computation(n) for n in inprocess.CLIENT_COMPUTATIONS),
                                fallback.devices, feed=inprocess.client_feed(
                                    fallback._client_tensors,  # noqa: SLF001
                                    compiled.computation("work")), fuse_after=0)
  with caplog.at_level("WARNING", logger=fused_round.__name__):
    actual = rounds(fallback, fold)
  assert [r.getMessage() for r in caplog.records if "could not build" in r.getMessage()]
  assert all("Missing src context" in r.getMessage() for r in caplog.records)
  assert len(caplog.records) == 1  # warned once; later rounds go straight to the calls
  if part == "FusedRound":
    assert not fallback.fused_rounds
  for e, a in zip(expected, actual, strict=True):
    np.testing.assert_array_equal(e, a)
