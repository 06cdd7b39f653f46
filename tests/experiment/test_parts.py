"""Reusing an experiment's parts: which configs may share them, and that a run
with shared parts is the run with its own."""

import types

import numpy as np
import pytest

from tests.helpers import metrics_rows, saved_weights, state_leaves, tiny_config
from tff_fedadamom.metric_names import TEST_ACCURACY
from tff_fedadamom.methods import OPTIMIZERS, default_hparams, is_learning_process
from tff_fedadamom.experiment import build_process, run_experiment
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.experiment import parts_cache
from tff_fedadamom.experiment.process import load_data


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


@pytest.fixture(scope="module")
def data():
  return load_data(tiny_config())


# A decaying client rate builds TFF's optimizer-schedule variant, whose server
# half is the same TFF finalizer (`build_apply_optimizer_finalizer`) as the
# plain process's: every server optimizer is checked on the plain process, the
# variant on FedAdamom and on FADAS (whose state also holds a derived hparam).
SET_HPARAMS_CASES = ([(name, 1.0) for name in SERVER_OPTIMIZERS]
                     + [("fedadamom", 0.99), ("fadas", 0.99)])


@pytest.mark.parametrize("optimizer, lr_decay", SET_HPARAMS_CASES)
def test_set_hparams_gives_the_initial_state_of_a_fresh_process(data, optimizer, lr_decay):
  """Parts built for config A, hparams of config B set in: B's own initial state,
  bitwise, for every leaf (the optimizer's hparams and moments, the model's
  weights, the client learning rate where the state holds it)."""
  a = tiny_config(server={"optimizer": optimizer, **default_hparams(optimizer)},
                  client={"lr_decay": lr_decay})
  b_server = {"optimizer": optimizer, **_other_values(optimizer)}
  b = tiny_config(server=b_server, client={"lr_decay": lr_decay, "learning_rate": 0.37})
  if lr_decay != 1.0:  # the schedule variant closes over the client rate
    assert parts_lib.structure_key(a) != parts_lib.structure_key(b)
    b = tiny_config(server=b_server, client={"lr_decay": lr_decay})
  assert parts_lib.structure_key(a) == parts_lib.structure_key(b)
  shared = build_process(a, data)
  fresh = build_process(b, data)
  got = state_leaves(parts_lib.initial_state(b, shared))
  want = state_leaves(fresh.initialize())
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(g, w)
  # Not a vacuous check: A's own initial state differs from B's.
  assert any(not np.array_equal(x, w) for x, w in zip(state_leaves(shared.initialize()), want))
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
  base = tiny_config()
  assert (parts_lib.structure_key(tiny_config(**change)) == parts_lib.structure_key(base)) == same


def test_schedules_and_decay_key_the_rates_they_bake_in():
  cosine = {"schedule": {"kind": "cosine", "decay_rounds": 10}}
  assert parts_lib.structure_key(tiny_config(server={**cosine, "learning_rate": 0.5})) != \
      parts_lib.structure_key(tiny_config(server={**cosine, "learning_rate": 1.0}))
  assert parts_lib.structure_key(tiny_config(client={"lr_decay": 0.9, "learning_rate": 0.2})) != \
      parts_lib.structure_key(tiny_config(client={"lr_decay": 0.9, "learning_rate": 0.1}))
  yogi = {"optimizer": "fedyogi"}
  assert parts_lib.structure_key(tiny_config(server={**yogi, "initial_preconditioner": 0.1})) != \
      parts_lib.structure_key(tiny_config(server=yogi))


@pytest.mark.parametrize("optimizer", sorted(set(OPTIMIZERS) - set(SERVER_OPTIMIZERS)))
def test_whole_learning_processes_key_every_value(optimizer):
  """Registry entries that build the whole process (FedCAda, FAFED) are not
  looked into: another value of any hparam or the client rate rebuilds."""
  base = tiny_config(server={"optimizer": optimizer})
  assert parts_lib.state_hparams(base) == {}
  for name, value in _other_values(optimizer).items():
    moved = tiny_config(server={"optimizer": optimizer, name: value})
    assert parts_lib.structure_key(moved) != parts_lib.structure_key(base), name
  assert parts_lib.structure_key(tiny_config(server={"optimizer": optimizer},
                                             client={"learning_rate": 0.37})) != \
      parts_lib.structure_key(base)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_default_written_out_keys_like_one_left_out(optimizer):
  """The key reads the hparams validation resolved (every one, defaults filled in)."""
  written = tiny_config(server={"optimizer": optimizer, **default_hparams(optimizer)})
  assert written.server.hparams == tiny_config(server={"optimizer": optimizer}).server.hparams
  assert parts_lib.structure_key(written) == \
      parts_lib.structure_key(tiny_config(server={"optimizer": optimizer}))


@pytest.mark.parametrize("optimizer", sorted(set(OPTIMIZERS) - set(SERVER_OPTIMIZERS)))
def test_the_structure_key_resolves_no_hparam_again(optimizer, monkeypatch):
  """Defaults are filled in once, by validation through the registry; the key
  takes them from the config. (A server optimizer's key builds that optimizer
  to see which hparams its state holds, and building resolves in the registry.)"""
  from tff_fedadamom import methods

  config = tiny_config(server={"optimizer": optimizer})

  def refuse(*args, **kwargs):
    raise AssertionError("hparams resolved again")

  monkeypatch.setattr(methods, "resolve_hparams", refuse)
  with pytest.raises(AssertionError, match="resolved again"):  # the patch catches one
    methods.resolve_hparams(optimizer)
  key = parts_lib.structure_key(config)
  for name, value in config.server.hparams.items():
    assert f'"{name}": {value!r}' in key, name


def test_a_run_with_reused_parts_equals_a_run_with_its_own(tmp_path):
  """The same trial first, and after two other trials, in one cache: the same
  metrics, row for row, and the same as a run that builds its own parts."""
  trial = {"server": {"learning_rate": 0.7, "beta_2": 0.2}, "client": {"learning_rate": 0.05}}
  others = [{"server": {"learning_rate": 2.0, "beta_2": 0.01}},
            {"client": {"learning_rate": 0.3}}]
  cache = parts_cache.PartsCache(max_size=1)
  first = run_experiment(tiny_config(tmp_path / "first", **trial), progress=False,
                         parts=cache.get(tiny_config(**trial)))
  for i, other in enumerate(others):
    run_experiment(tiny_config(tmp_path / f"other{i}", **other), progress=False,
                   parts=cache.get(tiny_config(**other)))
  again = run_experiment(tiny_config(tmp_path / "again", **trial), progress=False,
                         parts=cache.get(tiny_config(**trial)))
  own = run_experiment(tiny_config(tmp_path / "own", **trial), progress=False)
  assert (cache.misses, cache.hits) == (1, 3)
  rows = metrics_rows(first.output_dir)
  assert len(rows) == 3 and rows != metrics_rows(tmp_path / "other0")
  assert rows == metrics_rows(again.output_dir) == metrics_rows(own.output_dir)


def test_structures_of_one_model_and_data_share_an_evaluator_and_run_as_with_their_own(
    tmp_path):
  """Another optimizer or seed is another structure with the same model and test
  data: its parts reuse the first parts' evaluator and Keras model, which the
  first run's weights were assigned to, and its run's metrics (test loss and
  accuracy included) and saved model are those of a run with parts of its own.
  Another model or evaluation batch size has an evaluator of its own."""
  cache = parts_cache.PartsCache(max_size=2)
  other = {"seed": 5, "server": {"optimizer": "fedadam"}}
  first = cache.get(tiny_config())
  run_experiment(tiny_config(tmp_path / "first"), progress=False, parts=first)
  second = cache.get(tiny_config(**other))
  shared = run_experiment(tiny_config(tmp_path / "shared", **other), progress=False, parts=second)
  own = run_experiment(tiny_config(tmp_path / "own", **other), progress=False)
  assert cache.misses == 2 and second.process is not first.process
  assert second.evaluator is first.evaluator and second.keras_model is first.keras_model
  assert second.layer_names == first.layer_names
  rows = metrics_rows(shared.output_dir)
  assert len(rows) == 3 and rows[-1][TEST_ACCURACY] and rows != metrics_rows(tmp_path / "first")
  assert rows == metrics_rows(own.output_dir)
  for a, b in zip(saved_weights(shared.output_dir), saved_weights(own.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  for config in (tiny_config(model={"name": "mlp", "options": {"hidden": [4]}}),
                 tiny_config(data={"eval_batch_size": 7})):
    assert parts_cache.evaluator_key(config) != parts_cache.evaluator_key(tiny_config())
    assert cache.get(config).evaluator is not first.evaluator


def test_other_server_optimizers_share_the_clients_computations_and_run_as_alone(tmp_path):
  """Structures that differ only in their server optimizer share their clients'
  tensors and the slots of their byte-identical client computations, and the
  second one's run (metrics, saved model) is that of a run with parts of its
  own. Another seed makes other client tensors: nothing is shared."""
  cache = parts_cache.PartsCache(max_size=3)
  first = cache.get(tiny_config())
  run_experiment(tiny_config(tmp_path / "first"), progress=False, parts=first)
  other = {"server": {"optimizer": "fedyogi"}}
  second = cache.get(tiny_config(**other))
  shared = run_experiment(tiny_config(tmp_path / "shared", **other), progress=False, parts=second)
  own = run_experiment(tiny_config(tmp_path / "own", **other), progress=False)
  slots = lambda parts: parts.process._work._slots  # noqa: E731 - the clients' `work`
  assert second.process is not first.process and slots(second) is slots(first)
  assert second.process.server.update._slots is not first.process.server.update._slots
  assert (metrics_rows(shared.output_dir) == metrics_rows(own.output_dir)
          != metrics_rows(tmp_path / "first"))
  for a, b in zip(saved_weights(shared.output_dir), saved_weights(own.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  assert slots(cache.get(tiny_config(seed=4))) is not slots(first)


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
  cache.get(tiny_config())
  cache.get(tiny_config(client={"batch_size": 8}))
  parts = cache.get(tiny_config())
  assert len(cache) == 1 and cache.misses == 3
  with pytest.raises(ValueError, match="another structure"):
    run_experiment(tiny_config(tmp_path / "r", client={"batch_size": 8}), progress=False,
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
  a = tiny_config(server={"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1})
  b = tiny_config(server={"optimizer": "fedadamom", "learning_rate": 0.5, "beta_2": 0.1})
  process = _CountingSets(build_process(a, data))
  own = parts_lib.initial_state(a, process)
  assert process.sets == 0
  np.testing.assert_equal(state_leaves(own), state_leaves(process.initialize()))
  other = parts_lib.initial_state(b, process)
  assert process.sets == 1
  assert process.get_hparams(other)["finalizer"]["learning_rate"] == np.float32(0.5)


def test_the_evaluator_compiles_and_batches_at_its_first_use(tmp_path):
  """Building parts leaves the model uncompiled and the test set unbatched
  (neither is needed before round 1); the first evaluation does both."""
  parts = parts_lib.build_parts(tiny_config(tmp_path / "r"))
  assert not parts.keras_model._is_compiled  # noqa: SLF001
  assert parts.evaluator._batches is None  # noqa: SLF001
  state = parts_lib.initial_state(tiny_config(tmp_path / "r"), parts.process)
  metrics = parts.evaluator(parts.process, state)
  assert parts.keras_model._is_compiled and 0.0 <= metrics["test/accuracy"] <= 1.0  # noqa: SLF001
  parts.process.close()
