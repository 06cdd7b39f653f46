"""Reusing an experiment's parts: which configs may share them, and that a run
with shared parts is the run with its own."""

import csv
import os
import types

import numpy as np
import pytest
import tensorflow as tf

from tff_fedadamom.config import load_config
from tff_fedadamom.metric_names import TEST_ACCURACY
from tff_fedadamom.methods import OPTIMIZERS, default_hparams, is_learning_process
from tff_fedadamom.experiment import build_process, run_experiment
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.experiment import parts_cache
from tff_fedadamom.experiment.process import load_data


def tiny(output_dir="unused", **sections):
  raw = {
      "seed": 3, "rounds": 3, "clients_per_round": 3, "eval_every": 1,
      "checkpoint_every": 1, "output_dir": str(output_dir), "targets": [0.3, 0.99],
      "data": {"name": "digits", "num_clients": 8,
               "partition": {"kind": "dirichlet", "alpha": 0.5}},
      "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 16},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1},
  }
  for section, values in sections.items():
    if section == "server" and "optimizer" in values:
      raw[section] = values  # another optimizer: none of the base's hparams
    elif isinstance(values, dict):
      raw[section] = {**raw.get(section, {}), **values}
    else:
      raw[section] = values
  return load_config(raw)


def _other_values(optimizer):
  """The hparams a sweep tunes (the registry's `tunable`), moved to other valid
  values: rates and epsilons halved, beta_2 and momentum 1.5 times as far from
  1, FedAdamom's small beta_2 doubled."""
  out = {}
  for name in OPTIMIZERS[optimizer].tunable:
    value = default_hparams(optimizer)[name]
    if name == "momentum" or (name == "beta_2" and value > 0.5):
      out[name] = 1 - (1 - value) * 1.5
    elif name == "beta_2":
      out[name] = value * 2
    else:
      out[name] = value * 0.5
  return out


SERVER_OPTIMIZERS = sorted(n for n in OPTIMIZERS if not is_learning_process(n))


def _leaves(state):
  return [np.asarray(x) for x in tf.nest.flatten(state)]


@pytest.fixture(scope="module")
def data():
  return load_data(tiny())


@pytest.mark.parametrize("optimizer", SERVER_OPTIMIZERS)
@pytest.mark.parametrize("lr_decay", [1.0, 0.99])
def test_set_hparams_gives_the_initial_state_of_a_fresh_process(data, optimizer, lr_decay):
  """Parts built for config A, hparams of config B set in: B's own initial state,
  bitwise, for every leaf (the optimizer's hparams and moments, the model's
  weights, the client learning rate where the state holds it)."""
  a = tiny(server={"optimizer": optimizer, **default_hparams(optimizer)},
           client={"lr_decay": lr_decay})
  b_server = {"optimizer": optimizer, **_other_values(optimizer)}
  b = tiny(server=b_server, client={"lr_decay": lr_decay, "learning_rate": 0.37})
  if lr_decay != 1.0:  # the schedule variant closes over the client rate
    assert parts_lib.structure_key(a) != parts_lib.structure_key(b)
    b = tiny(server=b_server, client={"lr_decay": lr_decay})
  assert parts_lib.structure_key(a) == parts_lib.structure_key(b)
  shared = build_process(a, data)
  fresh = build_process(b, data)
  got = _leaves(parts_lib.initial_state(b, shared))
  want = _leaves(fresh.initialize())
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(g, w)
  # Not a vacuous check: A's own initial state differs from B's.
  assert any(not np.array_equal(x, w) for x, w in zip(_leaves(shared.initialize()), want))
  held = parts_lib.state_hparams(b)
  hparams = fresh.get_hparams(fresh.initialize())
  # Every state hparam named like a config value is set from it (FADAS also
  # holds `max_delay`, derived from `delay_threshold`: that one keys the structure).
  named = set(b.server.hparams)
  assert set(held.values()) == {("client_work", n) for n in hparams["client_work"]} | {
      ("finalizer", n) for n in hparams["finalizer"] if n in named}


@pytest.mark.parametrize("change, same", [
    ({"server": {"learning_rate": 0.3, "beta_2": 0.2, "epsilon": 1e-4}}, True),
    ({"client": {"learning_rate": 0.02}}, True),
    ({"rounds": 9, "output_dir": "elsewhere", "name": "x",
      "runtime": {"threads": 1}}, True),
    ({"runtime": {"backend": "tff_cpp"}}, False),
    ({"runtime": {"max_concurrent_clients": 1}}, False),
    ({"client": {"batch_size": 8}}, False),
    ({"client": {"local_epochs": 2}}, False),
    ({"client": {"lr_decay": 0.99}}, False),
    ({"seed": 4}, False),
    ({"data": {"num_clients": 9}}, False),
    ({"model": {"name": "mlp"}}, False),
    ({"server": {"optimizer": "fedadam"}}, False),
    ({"server": {"schedule": {"kind": "cosine", "decay_rounds": 10}}}, False),
])
def test_structure_key(change, same):
  base = tiny()
  assert (parts_lib.structure_key(tiny(**change)) == parts_lib.structure_key(base)) == same


def test_schedules_and_decay_key_the_rates_they_bake_in():
  cosine = {"schedule": {"kind": "cosine", "decay_rounds": 10}}
  assert parts_lib.structure_key(tiny(server={**cosine, "learning_rate": 0.5})) != \
      parts_lib.structure_key(tiny(server={**cosine, "learning_rate": 1.0}))
  assert parts_lib.structure_key(tiny(client={"lr_decay": 0.9, "learning_rate": 0.2})) != \
      parts_lib.structure_key(tiny(client={"lr_decay": 0.9, "learning_rate": 0.1}))
  yogi = {"optimizer": "fedyogi"}
  assert parts_lib.structure_key(tiny(server={**yogi, "initial_preconditioner": 0.1})) != \
      parts_lib.structure_key(tiny(server=yogi))


@pytest.mark.parametrize("optimizer", sorted(set(OPTIMIZERS) - set(SERVER_OPTIMIZERS)))
def test_whole_learning_processes_key_every_value(optimizer):
  """Registry entries that build the whole process (FedCAda, FAFED) are not
  looked into: another value of any hparam or the client rate rebuilds."""
  base = tiny(server={"optimizer": optimizer})
  assert parts_lib.state_hparams(base) == {}
  for name, value in _other_values(optimizer).items():
    moved = tiny(server={"optimizer": optimizer, name: value})
    assert parts_lib.structure_key(moved) != parts_lib.structure_key(base), name
  assert parts_lib.structure_key(tiny(server={"optimizer": optimizer},
                                      client={"learning_rate": 0.37})) != \
      parts_lib.structure_key(base)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_default_written_out_keys_like_one_left_out(optimizer):
  """The key reads the hparams validation resolved (every one, defaults filled in)."""
  written = tiny(server={"optimizer": optimizer, **default_hparams(optimizer)})
  assert written.server.hparams == tiny(server={"optimizer": optimizer}).server.hparams
  assert parts_lib.structure_key(written) == \
      parts_lib.structure_key(tiny(server={"optimizer": optimizer}))


@pytest.mark.parametrize("optimizer", sorted(set(OPTIMIZERS) - set(SERVER_OPTIMIZERS)))
def test_the_structure_key_resolves_no_hparam_again(optimizer, monkeypatch):
  """Defaults are filled in once, by validation through the registry; the key
  takes them from the config. (A server optimizer's key builds that optimizer
  to see which hparams its state holds, and building resolves in the registry.)"""
  from tff_fedadamom import methods

  config = tiny(server={"optimizer": optimizer})

  def refuse(*args, **kwargs):
    raise AssertionError("hparams resolved again")

  monkeypatch.setattr(methods, "resolve_hparams", refuse)
  with pytest.raises(AssertionError, match="resolved again"):  # the patch catches one
    methods.resolve_hparams(optimizer)
  key = parts_lib.structure_key(config)
  for name, value in config.server.hparams.items():
    assert f'"{name}": {value!r}' in key, name


def _rows(output_dir):
  with open(os.path.join(output_dir, "metrics.csv")) as f:
    return [{k: v for k, v in row.items() if not k.startswith("time/")}
            for row in csv.DictReader(f)]


def test_a_run_with_reused_parts_equals_a_run_with_its_own(tmp_path):
  """The same trial first, and after two other trials, in one cache: the same
  metrics, row for row, and the same as a run that builds its own parts."""
  trial = {"server": {"learning_rate": 0.7, "beta_2": 0.2}, "client": {"learning_rate": 0.05}}
  others = [{"server": {"learning_rate": 2.0, "beta_2": 0.01}},
            {"client": {"learning_rate": 0.3}}]
  cache = parts_cache.PartsCache(max_size=1)
  first = run_experiment(tiny(tmp_path / "first", **trial), progress=False,
                         parts=cache.get(tiny(**trial)))
  for i, other in enumerate(others):
    run_experiment(tiny(tmp_path / f"other{i}", **other), progress=False,
                   parts=cache.get(tiny(**other)))
  again = run_experiment(tiny(tmp_path / "again", **trial), progress=False,
                         parts=cache.get(tiny(**trial)))
  own = run_experiment(tiny(tmp_path / "own", **trial), progress=False)
  assert (cache.misses, cache.hits) == (1, 3)
  rows = _rows(first.output_dir)
  assert len(rows) == 3 and rows != _rows(tmp_path / "other0")
  assert rows == _rows(again.output_dir) == _rows(own.output_dir)


def _model_weights(output_dir):
  model = tf.keras.models.load_model(os.path.join(output_dir, "model.keras"))
  return [w.numpy() for w in model.weights]


def test_structures_of_one_model_and_data_share_an_evaluator_and_run_as_with_their_own(
    tmp_path):
  """Another optimizer or seed is another structure with the same model and test
  data: its parts reuse the first parts' evaluator and Keras model, which the
  first run's weights were assigned to, and its run's metrics (test loss and
  accuracy included) and saved model are those of a run with parts of its own.
  Another model or evaluation batch size has an evaluator of its own."""
  cache = parts_cache.PartsCache(max_size=2)
  other = {"seed": 5, "server": {"optimizer": "fedadam"}}
  first = cache.get(tiny())
  run_experiment(tiny(tmp_path / "first"), progress=False, parts=first)
  second = cache.get(tiny(**other))
  shared = run_experiment(tiny(tmp_path / "shared", **other), progress=False, parts=second)
  own = run_experiment(tiny(tmp_path / "own", **other), progress=False)
  assert cache.misses == 2 and second.process is not first.process
  assert second.evaluator is first.evaluator and second.keras_model is first.keras_model
  assert second.layer_names == first.layer_names
  rows = _rows(shared.output_dir)
  assert len(rows) == 3 and rows[-1][TEST_ACCURACY] and rows != _rows(tmp_path / "first")
  assert rows == _rows(own.output_dir)
  for a, b in zip(_model_weights(shared.output_dir), _model_weights(own.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  for config in (tiny(model={"name": "mlp", "options": {"hidden": [4]}}),
                 tiny(data={"eval_batch_size": 7})):
    assert parts_cache.evaluator_key(config) != parts_cache.evaluator_key(tiny())
    assert cache.get(config).evaluator is not first.evaluator


def test_other_server_optimizers_share_the_clients_computations_and_run_as_alone(tmp_path):
  """Structures that differ only in their server optimizer share their clients'
  tensors and the slots of their byte-identical client computations, and the
  second one's run (metrics, saved model) is that of a run with parts of its
  own. Another seed makes other client tensors: nothing is shared."""
  cache = parts_cache.PartsCache(max_size=3)
  first = cache.get(tiny())
  run_experiment(tiny(tmp_path / "first"), progress=False, parts=first)
  other = {"server": {"optimizer": "fedyogi"}}
  second = cache.get(tiny(**other))
  shared = run_experiment(tiny(tmp_path / "shared", **other), progress=False, parts=second)
  own = run_experiment(tiny(tmp_path / "own", **other), progress=False)
  slots = lambda parts: parts.process._work._slots  # noqa: E731 - the clients' `work`
  assert second.process is not first.process and slots(second) is slots(first)
  assert second.process.server.update._slots is not first.process.server.update._slots
  assert _rows(shared.output_dir) == _rows(own.output_dir) != _rows(tmp_path / "first")
  for a, b in zip(_model_weights(shared.output_dir), _model_weights(own.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  assert slots(cache.get(tiny(seed=4))) is not slots(first)


def test_eviction_spares_the_parts_got_again_before_those_used_once(monkeypatch):
  """Structures that recur (a sweep's server optimizers, two trials each) stay
  while structures used once (its FedCAda and FAFED trials) come and go: here
  two recurring ones and two one-offs a round, in a cache of 3. Least recently
  used alone would evict each recurring structure before its next round."""
  from tff_fedadamom.experiment import process as process_lib

  built = []

  def build_parts(plan, data, evaluator, client_tensors):
    built.append(plan.key)
    return types.SimpleNamespace(key=plan.key, evaluator=evaluator or "evaluator")

  monkeypatch.setattr(parts_cache, "make_plan", lambda plan: plan)
  monkeypatch.setattr(parts_cache, "build_parts", build_parts)
  for name in ("evaluator_key", "data_key", "client_tensors_key"):
    monkeypatch.setattr(parts_cache, name, lambda config: "same")
  monkeypatch.setattr(process_lib, "load_data", lambda config: "data")
  monkeypatch.setattr(process_lib, "make_client_tensors", lambda config, data: "tensors")
  cache = parts_cache.PartsCache(max_size=3)
  get = lambda key: cache.get(types.SimpleNamespace(key=key, config=None)).key
  for round_ in "123":
    for key in ("r", "r", "s", "s", round_ + "a", round_ + "b"):
      assert get(key) == key
  assert built == ["r", "s", "1a", "1b", "2a", "2b", "3a", "3b"]
  assert (cache.hits, cache.misses, len(cache)) == (10, 8, 3)
  # Once every kept structure has been got again, least recently used decides.
  get("3b"), get("4a")
  assert "r" not in cache and {"s", "3b", "4a"} <= set(cache._parts)


def test_cache_keeps_at_most_max_size_and_parts_serve_their_structure_only(tmp_path):
  cache = parts_cache.PartsCache(max_size=1)
  cache.get(tiny())
  cache.get(tiny(client={"batch_size": 8}))
  parts = cache.get(tiny())
  assert len(cache) == 1 and cache.misses == 3
  with pytest.raises(ValueError, match="another structure"):
    run_experiment(tiny(tmp_path / "r", client={"batch_size": 8}), progress=False,
                   parts=parts)
  with pytest.raises(ValueError, match="max_size"):
    parts_cache.PartsCache(max_size=0)


class _CountingSets:
  """A process whose `set_hparams` calls are counted."""

  def __init__(self, process):
    self._process = process
    self.sets = 0

  def __getattr__(self, name):
    return getattr(self._process, name)

  def set_hparams(self, state, hparams):
    self.sets += 1
    return self._process.set_hparams(state, hparams)


def test_initial_state_sets_hparams_only_when_the_state_lacks_them(data):
  """A process built from the config itself holds its values: no `set_hparams`
  call (a TensorFlow call before round 1). Another config's values are set."""
  a = tiny(server={"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1})
  b = tiny(server={"optimizer": "fedadamom", "learning_rate": 0.5, "beta_2": 0.1})
  process = _CountingSets(build_process(a, data))
  own = parts_lib.initial_state(a, process)
  assert process.sets == 0
  np.testing.assert_equal(_leaves(own), _leaves(process.initialize()))
  other = parts_lib.initial_state(b, process)
  assert process.sets == 1
  assert process.get_hparams(other)["finalizer"]["learning_rate"] == np.float32(0.5)


def test_the_evaluator_compiles_and_batches_at_its_first_use(tmp_path):
  """Building parts leaves the model uncompiled and the test set unbatched
  (neither is needed before round 1); the first evaluation does both."""
  parts = parts_lib.build_parts(tiny(tmp_path / "r"))
  assert not parts.keras_model._is_compiled  # noqa: SLF001
  assert parts.evaluator._batches is None  # noqa: SLF001
  state = parts_lib.initial_state(tiny(tmp_path / "r"), parts.process)
  metrics = parts.evaluator(parts.process, state)
  assert parts.keras_model._is_compiled and 0.0 <= metrics["test/accuracy"] <= 1.0  # noqa: SLF001
  parts.process.close()
