"""The unrolled client work: the batches it is given, when the pipeline uses it,
and results bit-identical to TFF's client work over the client's dataset."""

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import tiny
from tff_fedadamom.algorithms.unrolled import is_stacked
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.config.schema import UNROLL_MIN_BATCHES
from tff_fedadamom.data.client_tensors import FULL, LAST, ClientTensors, batch_of
from tff_fedadamom.data.sampling import UniformSampler
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.experiment import process as process_lib


def stacked_batches(element):
  """Eagerly, every batch of a stacked element in order: the full ones, then
  the last if it has examples."""
  rows = [*element[FULL], *([element[LAST]] if element[LAST].shape[0] else [])]
  return [batch_of(element, positions) for positions in rows]


def _tensors(tmp_path, **client):
  config = load_config(tiny(tmp_path, client={"learning_rate": 0.1, **client}))
  data = process_lib.load_data(config)
  return config, data, process_lib.make_client_tensors(config, data)


@pytest.mark.parametrize("client", [
    {"batch_size": 16},
    {"batch_size": 7, "local_epochs": 2, "max_examples": 30},  # batches across epochs
    {"batch_size": 5, "max_examples": 20},  # no last, shorter batch
])
def test_stacked_batches_are_the_round_datasets_batches(tmp_path, client):
  """Eagerly and inside a graph: the full batches, then the last, are what
  `ClientTensors.dataset` yields for the same client and round."""
  _, data, tensors = _tensors(tmp_path, **client)
  stacked = tf.function(lambda *args: tensors.stacked(*args).get_single_element())
  for cid in data.train.client_ids[:3]:
    expected = list(tensors.datasets([cid], 5)[0].as_numpy_iterator())
    for element in (tensors.stacked(*tensors.args(cid, 5)).get_single_element(),
                    stacked(*tensors.args(cid, 5))):
      got = stacked_batches(element)
      assert len(got) == len(expected) == tensors.batch_count(cid)
      for e, g in zip(expected, got):
        for key in e:
          np.testing.assert_array_equal(e[key], g[key])


def test_augmented_data_has_no_stacked_batches(tmp_path):
  """Augmented batches are not a gather of the examples: asked for, refused."""
  config, data, _ = _tensors(tmp_path, batch_size=16)
  tensors = ClientTensors(data.train, seed=config.seed, batch_size=16, local_epochs=1,
                          augment="crop_flip")
  with pytest.raises(ValueError, match="stacked batches cannot augment"):
    tensors.stacked(*tensors.args(data.train.client_ids[0], 1))


def test_batch_counts_are_known_for_array_client_data_only(tmp_path):
  import tensorflow_federated as tff

  config, data, tensors = _tensors(tmp_path, batch_size=16, local_epochs=2)
  counts = [len(list(tensors.datasets([cid], 1)[0])) for cid in data.train.client_ids]
  assert tensors.batch_counts() == counts
  read = tff.simulation.datasets.TestClientData(
      {cid: dict(data.train.client_arrays(cid)) for cid in data.train.client_ids[:2]})
  assert ClientTensors(read, seed=0, batch_size=16, local_epochs=1).batch_counts() is None


class _Batches:
  def __init__(self, counts):
    self.counts = counts

  def batch_counts(self):
    return self.counts


# `tiny` samples 3 clients a round; with clients of 5 and 15 batches (a mean
# of 10), a run trains 30 batches a round: ENOUGH rounds reach
# UNROLL_MIN_BATCHES, one fewer does not.
ENOUGH = -(-UNROLL_MIN_BATCHES // 30)
LONG = {"rounds": 10 * ENOUGH}


@pytest.mark.parametrize("overrides,counts,expected", [
    ({"rounds": ENOUGH}, [5, 15], 15),
    ({"rounds": ENOUGH - 1}, [5, 15], None),  # too few batches to pay for the dearer build
    ({"rounds": -(-ENOUGH // 70)}, [700, 700], 700),  # few rounds of large clients
    ({"runtime": {"unroll_max_batches": 40}}, [17, 2], 17),  # any run, when asked for
    ({**LONG, "runtime": {"unroll_max_batches": 16}}, [17, 3], None),  # more than asked for
    (LONG, None, None),  # client data whose sizes are not known without reading it all
    ({**LONG, "runtime": {"unroll_max_batches": 0}}, [10], None),
    ({**LONG, "runtime": {"backend": "tff_cpp"}}, [10], None),  # TFF's runtime takes datasets
    ({**LONG, "server": {"optimizer": "fedcada"}}, [10], None),  # a learning process of its own
    ({**LONG, "client": {"learning_rate": 0.1, "batch_size": 16, "lr_decay": 0.9}}, [10], None),
])
def test_which_runs_unroll(tmp_path, overrides, counts, expected):
  config = load_config({**tiny(tmp_path), **overrides})
  plan = parts_lib.make_plan(config)
  assert process_lib.unrolled_steps(config, plan.backend, _Batches(counts)) == expected


@pytest.mark.parametrize("overrides", [
    {"server": {"optimizer": "fafed"}},
    {"client": {"learning_rate": 0.1, "batch_size": 16, "lr_decay": 0.9}}])
def test_only_fedavg_processes_with_the_rate_in_their_state_unroll(tmp_path, overrides):
  config = load_config({**tiny(tmp_path), **overrides})
  with pytest.raises(ValueError, match="unroll_steps is for processes"):
    process_lib.build_process(config, unroll_steps=3)


def test_unroll_max_batches_is_checked(tmp_path):
  with pytest.raises(ConfigError, match="unroll_max_batches.*0 \\(never\\) or an integer >= 1"):
    load_config({**tiny(tmp_path), "runtime": {"unroll_max_batches": -1}})


def _rounds(tmp_path, name, unroll, rounds=2, **overrides):
  """The global weights and last metrics after `rounds` in-process rounds."""
  from tff_fedadamom.runtime.inprocess import InProcessLearningProcess

  raw = tiny(tmp_path / name, **overrides)
  raw["runtime"] = {**raw.get("runtime", {}), "unroll_max_batches": unroll, "cache": False}
  config = load_config(raw)
  data = process_lib.load_data(config)
  tensors = process_lib.make_client_tensors(config, data)
  process = InProcessLearningProcess(
      parts_lib.learning_process(config, data, client_tensors=tensors), client_tensors=tensors)
  assert is_stacked(process.compiled.computation("work").type_signature.parameter[0]) == bool(
      unroll)
  state = parts_lib.initial_state(config, process)
  sampler = UniformSampler(data.train.client_ids, config.clients_per_round, config.seed)
  for r in range(1, rounds + 1):
    output = process.next_for_clients(state, sampler(r), r)
    state = output.state
  process.close()
  return [np.asarray(w) for w in state.global_model_weights.trainable], output.metrics


# 2 epochs of at most 38 examples: 4 full batches and a short one; of 40: 5 full ones.
@pytest.mark.parametrize("examples,model", [(38, "logistic"), (40, "logistic"), (38, "cnn")],
                         ids=["short-last-batch", "no-short-batch", "cnn-dropout"])
def test_unrolled_rounds_equal_tffs_client_loop_bit_for_bit(tmp_path, examples, model):
  """The stacked client work gives the weights and
  training metrics of TFF's client work over the same batches: with client
  momentum and clipping, two local epochs (batches that span both) and
  clients weighted by their examples; on the logistic model and on the CNN,
  whose conv layers and seeded dropout run in the loop's body. (The ray
  backend's parity test compares the MLP's stacked rounds, on actors and
  in-process, with its loop.)"""
  overrides = {
      "model": {"name": model},
      "client": {"learning_rate": 0.1, "batch_size": 16, "momentum": 0.9, "clip_norm": 1.0,
                 "local_epochs": 2, "max_examples": examples},
      "server": {"optimizer": "fedadam", "learning_rate": 0.1,
                 "client_weighting": "num_examples"}}
  expected, metrics = _rounds(tmp_path, "loop", 0, **overrides)
  weights, got = _rounds(tmp_path, "stacked", 100, **overrides)
  assert got["client_work"] == metrics["client_work"]
  for e, w in zip(expected, weights):
    np.testing.assert_array_equal(e, w)


def test_a_non_finite_client_is_dropped_as_tff_drops_it(tmp_path):
  """A client learning rate that overflows: TFF's update is zeroed with weight
  0 and its metrics reset; the unrolled work does the same."""
  overrides = {"client": {"learning_rate": 1e38, "batch_size": 16, "max_examples": 40}}
  expected, metrics = _rounds(tmp_path, "loop", 0, rounds=1, **overrides)
  weights, got = _rounds(tmp_path, "unrolled", 100, rounds=1, **overrides)
  assert got["client_work"] == metrics["client_work"]
  assert got["client_work"]["train"]["num_examples"] == 0  # every client's metrics reset
  for e, w in zip(expected, weights):
    np.testing.assert_array_equal(e, w)
