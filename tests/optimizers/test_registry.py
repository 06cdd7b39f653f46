"""The contract every registered server optimizer passes, and the registry's errors."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom import methods as registry
from tff_fedadamom.optimizers import state as state_keys

LR_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
# The server optimizers; FedCAda and FAFED are learning processes (tests/algorithms).
NAMES = [n for n in registry.list_optimizers() if not registry.is_learning_process(n)]

# Learning rates that make each optimizer converge on the quadratic below.
_QUADRATIC_LR = {
    'fedavg': 0.015, 'fedavgm': 0.005, 'fedadam': 0.05, 'fedyogi': 0.05,
    'fedadagrad': 0.3, 'fedadamom': 0.015, 'fedamsgrad': 0.05, 'fadas': 0.05,
}


# Every registered optimizer with its defaults, and each bool switch flipped:
# the other bias-correction convention is a different update rule (and for
# FedAdam/FedYogi a different implementation), so it passes the contract too.
VARIANTS = [(name, {}) for name in NAMES] + [
    (name, {hparam: not default})
    for name in NAMES
    for hparam, default in registry.default_hparams(name).items()
    if isinstance(default, bool)
]


def _variant_id(variant):
  name, switches = variant
  return name + ''.join(f'-{k}={v}' for k, v in switches.items())


def _weights():
  return collections.OrderedDict(
      dense=[tf.constant([[1.0, -2.0], [0.5, 3.0]]), tf.constant([0.1, -0.1])],
      scalar=tf.constant(2.0),
  )


def _specs(weights):
  return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), weights)


def _grads(weights, scale=1.0):
  return tf.nest.map_structure(lambda t: scale * (t + 0.5), weights)


def test_registry_names():
  assert set(NAMES) == {
      'fedavg', 'fedavgm', 'fedadam', 'fedyogi', 'fedadagrad', 'fedadamom',
      'fedamsgrad', 'fadas'}
  assert set(registry.list_optimizers()) - set(NAMES) == {'fedcada', 'fafed'}
  assert set(_QUADRATIC_LR) == set(NAMES)


@pytest.mark.parametrize('name,switches', VARIANTS, ids=map(_variant_id, VARIANTS))
class TestContract:

  def test_is_tff_optimizer(self, name, switches):
    assert isinstance(registry.build_server_optimizer(name, **switches),
                      tff.learning.optimizers.Optimizer)

  def test_tunable_hparams_are_hparams(self, name, switches):
    spec = registry.get_spec(name)
    assert 'learning_rate' in spec.tunable
    assert set(spec.tunable) <= set(spec.defaults)

  def test_state_structure_and_dtypes_preserved(self, name, switches):
    opt = registry.build_server_optimizer(name, **switches)
    weights = _weights()

    @tf.function
    def step(state, w, g):
      return opt.next(state, w, g)

    state = opt.initialize(_specs(weights))
    state = tf.nest.map_structure(tf.convert_to_tensor, state)
    new_state, new_w = step(state, weights, _grads(weights))
    tf.nest.assert_same_structure(new_state, state)
    tf.nest.assert_same_structure(new_w, weights)
    for a, b in zip(tf.nest.flatten(new_state), tf.nest.flatten(state)):
      assert a.dtype == b.dtype and a.shape == b.shape
    assert LR_KEY in state

  def test_finite_for_zero_and_large_updates(self, name, switches):
    opt = registry.build_server_optimizer(name, **switches)
    weights = _weights()
    state = opt.initialize(_specs(weights))
    for scale in (0.0, 0.0, 1e6, 1e-6):
      state, weights = opt.next(state, weights, _grads(weights, scale))
      for leaf in tf.nest.flatten(weights):
        assert np.all(np.isfinite(leaf)), (name, scale)

  def test_none_gradient_leaves_weight_unchanged(self, name, switches):
    opt = registry.build_server_optimizer(name, **switches)
    weights = [tf.constant([1.0, 2.0]), tf.constant([3.0])]
    state = opt.initialize(_specs(weights))
    _, new = opt.next(state, weights, [tf.constant([0.5, 0.5]), None])
    np.testing.assert_array_equal(new[1], [3.0])
    assert not np.array_equal(new[0], weights[0])

  def test_hparams_round_trip(self, name, switches):
    opt = registry.build_server_optimizer(name, **switches)
    state = opt.initialize(_specs(_weights()))
    hparams = opt.get_hparams(state)
    assert LR_KEY in hparams
    changed = collections.OrderedDict(
        (k, v * 0.5 if k == LR_KEY else v) for k, v in hparams.items())
    new_state = opt.set_hparams(state, changed)
    assert opt.get_hparams(new_state)[LR_KEY] == pytest.approx(
        hparams[LR_KEY] * 0.5)
    back = opt.get_hparams(opt.set_hparams(new_state, hparams))
    assert back == hparams

  def test_schedule_learning_rate(self, name, switches):
    opt = tff.learning.optimizers.schedule_learning_rate(
        registry.build_server_optimizer(name, **switches), lambda r: 0.1 / (1.0 + tf.cast(r, tf.float32)))
    weights = _weights()
    state = opt.initialize(_specs(weights))
    for r in range(3):
      state, weights = opt.next(state, weights, _grads(weights))
      # The scheduled wrapper keeps the wrapped state under 'optimizer'.
      assert float(state['optimizer'][LR_KEY]) == pytest.approx(0.1 / (r + 2))

  def test_runs_as_tff_computation(self, name, switches):
    opt = registry.build_server_optimizer(name, **switches)
    weights = _weights()
    specs = _specs(weights)

    @tff.tensorflow.computation
    def init_fn():
      return opt.initialize(specs)

    weights_type = tff.types.tensorflow_to_type(specs)

    @tff.tensorflow.computation(init_fn.type_signature.result, weights_type,
                                weights_type)
    def next_fn(state, w, g):
      return opt.next(state, w, g)

    eager_state, eager_w = opt.initialize(specs), weights
    state, w = init_fn(), tf.nest.map_structure(lambda t: t.numpy(), weights)
    for _ in range(2):
      g = _grads(eager_w)
      eager_state, eager_w = opt.next(eager_state, eager_w, g)
      state, w = next_fn(state, w, tf.nest.map_structure(lambda t: t.numpy(), g))
    for a, b in zip(tf.nest.flatten(eager_w), tf.nest.flatten(w)):
      np.testing.assert_allclose(a, b, rtol=1e-5)

  def test_converges_on_ill_conditioned_quadratic(self, name, switches):
    h = tf.constant([100.0, 10.0, 1.0])
    w = tf.constant([1.0, 1.0, 1.0])
    opt = registry.build_server_optimizer(
        name, learning_rate=_QUADRATIC_LR[name], **switches)
    state = opt.initialize(tf.TensorSpec([3], tf.float32))
    loss0 = float(0.5 * tf.reduce_sum(h * w * w))
    for _ in range(500):
      state, w = opt.next(state, w, h * w)
    assert float(0.5 * tf.reduce_sum(h * w * w)) < 1e-2 * loss0

  def test_invalid_learning_rate(self, name, switches):
    with pytest.raises(ValueError, match='learning_rate'):
      registry.build_server_optimizer(name, learning_rate=-1.0, **switches)


def test_unknown_optimizer_lists_valid_names():
  with pytest.raises(ValueError, match=r"Unknown server optimizer 'fedadamm'.*"
                     r"fedadamom.*Did you mean"):
    registry.build_server_optimizer('fedadamm')


def test_unknown_hparam_lists_valid_ones():
  with pytest.raises(ValueError, match=r"'fedavg' has no hparam 'beta_2'.*"
                     r"learning_rate"):
    registry.build_server_optimizer('fedavg', beta_2=0.9)


def test_hparams_reach_the_optimizer():
  opt = registry.build_server_optimizer('fedadam', learning_rate=0.3, beta_2=0.5)
  hp = opt.get_hparams(opt.initialize(tf.TensorSpec([1], tf.float32)))
  assert hp[LR_KEY] == 0.3 and hp['beta_2'] == 0.5
  assert hp['epsilon'] == 1e-3  # Reddi et al.'s default


def test_default_and_tunable_hparams():
  assert registry.default_hparams('fedadamom') == {
      'learning_rate': 1.0, 'beta_2': 0.05, 'epsilon': 1e-3}
  assert registry.get_spec('fedavg').tunable == ('learning_rate',)
  assert 'beta_2' not in registry.get_spec('fedavgm').tunable


@pytest.mark.parametrize('name', NAMES)
def test_search_ranges_cover_tunable_hparams_and_build(name):
  ranges = registry.search_ranges(name)
  assert set(ranges) == set(registry.get_spec(name).tunable)
  for hparam, (dist, low, high) in ranges.items():
    assert dist in ('loguniform', 'uniform') and 0 <= low < high
    for value in (low, high):
      registry.build_server_optimizer(name, **{hparam: value})


def test_fedadamom_beta_2_range_is_the_papers():
  assert registry.search_ranges('fedadamom')['beta_2'] == ('uniform', 0.01, 0.3)
  assert registry.search_ranges('fedadam')['beta_2'] == ('uniform', 0.9, 0.999)


def test_switches_are_sweepable_but_not_tunable():
  for name in ('fedadam', 'fedyogi', 'fedamsgrad', 'fadas'):
    assert registry.default_hparams(name)['bias_correction'] in (True, False)
    assert 'bias_correction' not in registry.get_spec(name).tunable
    assert registry.sweepable_hparams(name) == (
        registry.get_spec(name).tunable + ('bias_correction',))
  assert registry.sweepable_hparams('fedavg') == registry.get_spec('fedavg').tunable
  # Every member's official code corrects (tests/optimizers/test_adaptive.py
  # pins each default against its source).
  assert all(registry.default_hparams(name)['bias_correction'] is True
             for name in ('fedadam', 'fedyogi', 'fedamsgrad', 'fadas'))


def test_fadas_defaults_and_ranges_hold_its_authors_settings():
  defaults = registry.default_hparams('fadas')
  ranges = registry.search_ranges('fadas')
  assert (defaults['learning_rate'], defaults['epsilon']) == (1e-3, 1e-8)
  for hparam, value in (('learning_rate', 1e-4), ('learning_rate', 1e-3),
                        ('epsilon', 1e-8)):
    _, low, high = ranges[hparam]
    assert low <= value <= high


PROCESSES = [n for n in registry.list_optimizers() if registry.is_learning_process(n)]


@pytest.mark.parametrize('name', PROCESSES)
def test_learning_process_entries(name):
  spec = registry.get_spec(name)
  assert spec.kind == registry.LEARNING_PROCESS
  assert spec.communication == 3.0 and spec.communication_note
  with pytest.raises(ValueError, match='is a learning process.*build_process'):
    registry.build_server_optimizer(name)
  # Ranges are valid hparam values; out-of-range ones are refused by name.
  assert set(registry.search_ranges(name)) == set(spec.tunable) <= set(spec.defaults)
  for hparam, (dist, low, high) in registry.search_ranges(name).items():
    assert dist in ('loguniform', 'uniform') and 0 < low < high
    for value in (low, high):
      assert registry.check_hparams(name, **{hparam: value})[hparam] == value
  with pytest.raises(ValueError, match='`epsilon`'):
    registry.check_hparams(name, epsilon=-1.0)
  with pytest.raises(ValueError, match='no hparam'):
    registry.check_hparams(name, momentum=0.9)


def test_server_optimizers_cost_what_fedavg_costs():
  assert {registry.get_spec(n).communication for n in NAMES} == {1.0}


# ---------------------------------------------------------------------------
# The state vocabulary, display names and diagnostics the registry owns.


@pytest.mark.parametrize('variant', VARIANTS, ids=_variant_id)
def test_declared_state_keys_are_the_states(variant):
  name, switches = variant
  opt = registry.build_server_optimizer(name, **switches)
  state = opt.initialize(_specs(_weights()))
  assert registry.get_spec(name).state.fits(state.keys()), sorted(state)
  assert name in registry.optimizers_of_state(state)
  # A key more or one fewer is another optimizer's state, not this one's.
  assert name not in registry.optimizers_of_state([*state, 'unknown'])
  assert name not in registry.optimizers_of_state(list(state)[1:])


def test_a_fedadamom_state_is_fedadamoms_alone():
  opt = registry.build_server_optimizer('fedadamom')
  state = opt.initialize([tf.TensorSpec([2], tf.float32)])
  assert registry.optimizers_of_state(state) == ['fedadamom']
  coefficient = registry.momentum_coefficient_of_state(state)
  # v = [0, 2]: vbar = 1, beta1 = clip(1 - v, 0, 1 - eps) = [1 - eps, 0].
  np.testing.assert_allclose(
      coefficient(np.array([0.0, 2.0], np.float32), 0.25), [0.75, 0.0])


@pytest.mark.parametrize('variant', VARIANTS, ids=_variant_id)
def test_only_fedadamom_has_a_momentum_coefficient(variant):
  name, switches = variant
  opt = registry.build_server_optimizer(name, **switches)
  state = opt.initialize([tf.TensorSpec([2], tf.float32)])
  has_one = registry.momentum_coefficient_of_state(state) is not None
  assert has_one == (name == 'fedadamom')


def test_display_names():
  names = {n: registry.display_name(n) for n in registry.list_optimizers()}
  assert names['fedadamom'] == 'FedAdamom' and names['fedavgm'] == 'FedAvgM'
  assert names['fadas'] == 'FADAS' and names['fedcada'] == 'FedCAda'
  assert len(set(names.values())) == len(names)
  for name, shown in names.items():
    assert shown.lower() == name, (name, shown)


@pytest.mark.parametrize('name', ['fedadamom', 'fedamsgrad', 'fadas'])
def test_errors_name_the_optimizer_as_the_registry_does(name):
  with pytest.raises(ValueError, match=f'^{registry.display_name(name)} `learning_rate`'):
    registry.build_server_optimizer(name, learning_rate=-1.0)


def test_process_moments_are_read_beside_the_model():
  moments = {'accumulator': [np.ones(2)], 'preconditioner': [np.zeros(2)]}
  assert state_keys.process_moments({'model': [np.ones(2)], **moments}) == moments
  assert state_keys.process_moments({'accumulator': [np.ones(2)]}) == {}
  assert state_keys.process_moments(None) == {}
