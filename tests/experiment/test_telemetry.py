"""Server optimizer telemetry: numpy statistics of a known state, FedAdamom's beta1_t."""

import collections
import types

import numpy as np
import pytest
import tensorflow as tf

from tff_fedadamom.optimizers import build_fedadamom
from tff_fedadamom.optimizers import fedadamom
from tff_fedadamom import methods as registry
from tff_fedadamom.optimizers import schedules
from tff_fedadamom.experiment import telemetry

EPS = 1e-3


def _fedadamom_state(v, m, lr=0.5, eps=EPS):
  return collections.OrderedDict(
      learning_rate=np.float32(lr), beta_2=np.float32(0.1),
      epsilon=np.float32(eps), accumulator=m, preconditioner=v)


def _random_leaves(seed, shapes=((3, 4), (4,), (2, 2, 3))):
  rng = np.random.default_rng(seed)
  return [rng.gamma(0.5, 1.0, size=s).astype(np.float32) for s in shapes]


# ---------------------------------------------------------------------------
# Against an independent numpy computation on a known state.


def test_stats_equal_numpy_on_a_known_state():
  v = _random_leaves(0)
  m = [x - 0.5 for x in _random_leaves(1)]
  w0, w1 = _random_leaves(2), _random_leaves(3)
  stats = telemetry.optimizer_state_stats(
      _fedadamom_state(v, m), previous_weights=w0, weights=w1)

  flat_v = np.concatenate([x.ravel() for x in v]).astype(np.float64)
  flat_m = np.concatenate([x.ravel() for x in m]).astype(np.float64)
  delta = np.concatenate([(a - b).ravel() for a, b in zip(w1, w0)])
  beta1 = np.clip(1 - flat_v / flat_v.mean(), 0, 1 - EPS)
  expected = {
      'opt/learning_rate': 0.5,
      'opt/v_mean': flat_v.mean(),
      'opt/v_median': np.median(flat_v),
      'opt/v_p01': np.quantile(flat_v, 0.01),
      'opt/v_p99': np.quantile(flat_v, 0.99),
      'opt/momentum_norm': np.linalg.norm(flat_m),
      'opt/update_norm': np.linalg.norm(delta.astype(np.float64)),
      'opt/beta1_mean': beta1.mean(),
      'opt/frac_beta1_at_0': np.mean(beta1 == 0),
      'opt/frac_beta1_at_max': np.mean(beta1 == 1 - EPS),
  }
  assert set(stats) == set(expected)
  for key, value in expected.items():
    assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert isinstance(stats[key], float), key
  assert 0 < stats['opt/frac_beta1_at_0'] < 1


def test_beta1_fractions_on_a_hand_built_state():
  # v = [0, 0, 1, 3]: vbar = 1, so beta1 = [1 - eps, 1 - eps, 0, 0].
  v = [np.array([0.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32)]
  m = [np.array([3.0, 0.0], np.float32), np.array([0.0, 4.0], np.float32)]
  state = _fedadamom_state(v, m)
  stats = telemetry.optimizer_state_stats(state, layer_names=['a', 'b'])
  assert stats['opt/beta1_mean'] == pytest.approx((1 - EPS) / 2)
  assert stats['opt/frac_beta1_at_0'] == 0.5
  assert stats['opt/frac_beta1_at_max'] == 0.5
  assert stats['opt/momentum_norm'] == pytest.approx(5.0)
  assert stats['opt/layer/a/beta1_mean'] == pytest.approx(1 - EPS)
  assert stats['opt/layer/a/frac_at_0'] == 0.0
  assert stats['opt/layer/a/frac_at_max'] == 1.0
  assert stats['opt/layer/a/v_mean'] == 0.0
  assert stats['opt/layer/b/beta1_mean'] == 0.0
  assert stats['opt/layer/b/frac_at_0'] == 1.0
  assert stats['opt/layer/b/frac_at_max'] == 0.0
  assert stats['opt/layer/b/v_mean'] == 2.0
  hist = telemetry.state_histograms(state)
  np.testing.assert_array_equal(hist['opt/v'], [0, 0, 1, 3])
  np.testing.assert_allclose(hist['opt/beta1'], [1 - EPS, 1 - EPS, 0, 0])


def test_layers_with_one_name_are_pooled():
  v = [np.array([0.0, 0.0, 2.0], np.float32), np.array([2.0], np.float32),
       np.array([], np.float32)]
  m = [np.zeros_like(x) for x in v]
  stats = telemetry.optimizer_state_stats(
      _fedadamom_state(v, m), layer_names=['dense', 'dense', 'empty'])
  # vbar = 1: beta1 = [1 - eps, 1 - eps, 0, 0] over the pooled 'dense' leaves.
  assert stats['opt/layer/dense/frac_at_0'] == 0.5
  assert stats['opt/layer/dense/frac_at_max'] == 0.5
  assert stats['opt/layer/dense/v_mean'] == 1.0
  assert np.isnan(stats['opt/layer/empty/v_mean'])
  with pytest.raises(ValueError, match='layer_names'):
    telemetry.optimizer_state_stats(_fedadamom_state(v, m), layer_names=['x'])


def test_all_zero_second_moment_is_plain_sgd():
  v = [np.zeros([3], np.float32)]
  stats = telemetry.optimizer_state_stats(_fedadamom_state(v, v))
  assert stats['opt/frac_beta1_at_0'] == 1.0
  assert stats['opt/beta1_mean'] == 0.0
  assert stats['opt/frac_beta1_at_max'] == 0.0


def test_epsilon_argument_overrides_the_state():
  v = [np.array([0.0, 1.0], np.float32)]
  stats = telemetry.optimizer_state_stats(_fedadamom_state(v, v), epsilon=0.25)
  assert stats['opt/beta1_mean'] == pytest.approx(0.75 / 2)


# ---------------------------------------------------------------------------
# Tied to the optimizer.


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
def test_numpy_beta1_matches_momentum_coefficient(dtype):
  rng = np.random.default_rng(4)
  v = (rng.gamma(0.3, size=5000) * rng.choice([0, 1], 5000)).astype(dtype)
  tf_v = tf.constant(v)
  vbar = tf.reduce_mean(tf.cast(tf_v, tf.float64))
  vbar = tf.cast(vbar, tf.float64 if dtype == np.float64 else tf.float32)
  expected = fedadamom.momentum_coefficient(tf_v, vbar, EPS).numpy()
  got = fedadamom.momentum_coefficient_numpy(v, EPS)
  assert got.dtype == expected.dtype
  np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
  np.testing.assert_array_equal(got == 0, expected == 0)


def test_stats_from_a_real_fedadamom_state():
  rng = np.random.default_rng(5)
  weights = collections.OrderedDict(
      conv=[tf.constant(rng.normal(size=(3, 3, 2)), tf.float32),
            tf.constant(rng.normal(size=(2,)), tf.float32)],
      dense=tf.constant(rng.normal(size=(4, 5)), tf.float32))
  opt = build_fedadamom(0.7, beta_2=0.2, epsilon=0.01)
  state = opt.initialize(
      tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), weights))
  for _ in range(3):
    # Coordinates of very different scale, so that both clip bounds are hit.
    grads = tf.nest.map_structure(
        lambda t: tf.constant(rng.normal(size=t.shape) * rng.choice(
            [0.01, 1.0, 5.0], size=t.shape), tf.float32), weights)
    previous = weights
    state, weights = opt.next(state, weights, grads)

  as_numpy = tf.nest.map_structure(np.asarray, state)
  names = ['conv', 'conv', 'dense']  # tf.nest order: conv kernel, bias, dense.
  stats = telemetry.optimizer_state_stats(
      as_numpy, previous_weights=tf.nest.map_structure(np.asarray, previous),
      weights=tf.nest.map_structure(np.asarray, weights), layer_names=names)

  # The optimizer's own coefficient, from the optimizer's own vbar.
  flat_v = tf.nest.flatten(state['preconditioner'])
  vbar = fedadamom._mean_of_all(flat_v, tf.float32)
  beta1 = np.concatenate([
      fedadamom.momentum_coefficient(v, vbar, 0.01).numpy().ravel()
      for v in flat_v])
  assert stats['opt/beta1_mean'] == pytest.approx(beta1.mean(), rel=1e-5)
  assert stats['opt/frac_beta1_at_0'] == np.mean(beta1 == 0)
  assert stats['opt/frac_beta1_at_max'] == np.mean(beta1 == np.float32(0.99))
  assert 0 < stats['opt/frac_beta1_at_0'] < 1
  assert 0 < stats['opt/frac_beta1_at_max'] < 1
  # The applied update is lr * m: its norm is lr times the momentum norm.
  assert stats['opt/update_norm'] == pytest.approx(
      0.7 * stats['opt/momentum_norm'], rel=1e-5)
  assert stats['opt/learning_rate'] == pytest.approx(0.7)
  dense_beta1 = beta1[-20:]
  assert stats['opt/layer/dense/beta1_mean'] == pytest.approx(
      dense_beta1.mean(), rel=1e-5)
  assert stats['opt/layer/conv/v_mean'] == pytest.approx(
      np.concatenate([np.ravel(v) for v in flat_v[:2]]).mean(), rel=1e-5)


# ---------------------------------------------------------------------------
# The baselines, schedules and process states.


def _stepped_state(name):
  opt = registry.build_server_optimizer(name)
  weights = [tf.constant([[1.0, -2.0], [0.5, 3.0]]), tf.constant([0.1, -0.1])]
  state = opt.initialize([tf.TensorSpec(t.shape, t.dtype) for t in weights])
  grads = [tf.constant([[0.3, -1.0], [2.0, 0.0]]), tf.constant([0.5, -0.2])]
  state, _ = opt.next(state, weights, grads)
  return tf.nest.map_structure(np.asarray, state)


@pytest.mark.parametrize('name, has_v, has_m', [
    ('fedavg', False, False),
    ('fedavgm', False, True),
    ('fedadam', True, True),
    ('fedyogi', True, True),
    ('fedadagrad', True, False),
])
def test_baseline_states(name, has_v, has_m):
  state = _stepped_state(name)
  stats = telemetry.optimizer_state_stats(state, layer_names=['k', 'b'])
  assert 'fedadamom' not in registry.optimizers_of_state(state)
  assert not any('beta1' in k or 'frac' in k for k in stats)
  assert ('opt/v_mean' in stats) == has_v
  assert ('opt/layer/k/v_mean' in stats) == has_v
  assert ('opt/momentum_norm' in stats) == has_m
  assert stats['opt/learning_rate'] == pytest.approx(
      registry.default_hparams(name)['learning_rate'])
  if has_v:
    flat = np.concatenate([np.ravel(x) for x in state['preconditioner']])
    assert stats['opt/v_p99'] == pytest.approx(np.percentile(flat, 99))
    assert 'opt/beta1' not in telemetry.state_histograms(state)
  if has_m:
    flat = np.concatenate([np.ravel(x) for x in state['accumulator']])
    assert stats['opt/momentum_norm'] == pytest.approx(np.linalg.norm(flat))


def test_scheduled_and_process_states_are_unwrapped():
  opt = schedules.with_schedule(
      build_fedadamom(1.0), schedules.build_schedule('cosine', 2.0, decay_rounds=2))
  weights = [tf.constant([1.0, 2.0])]
  state = opt.initialize([tf.TensorSpec([2], tf.float32)])
  state, _ = opt.next(state, weights, [tf.constant([0.5, 0.1])])
  assert set(state) == {'round_num', 'optimizer'}
  stats = telemetry.optimizer_state_stats(state)
  assert stats['opt/learning_rate'] == pytest.approx(1.0)  # schedule(1).
  assert 'opt/beta1_mean' in stats
  process_state = types.SimpleNamespace(finalizer=state)
  assert telemetry.optimizer_state_stats(process_state) == stats
  assert set(telemetry.state_histograms(process_state)) == {'opt/v', 'opt/beta1'}
  with pytest.raises(TypeError):
    telemetry.optimizer_state_stats([1.0])


def test_mismatched_weights_raise():
  with pytest.raises(ValueError, match='previous_weights'):
    telemetry.optimizer_state_stats(
        _stepped_state('fedavg'), previous_weights=[np.zeros(2)],
        weights=[np.zeros(3)])


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
@pytest.mark.parametrize('sign', [1.0, -1.0])
@pytest.mark.parametrize('n', [1, 2, 7, 1001])
def test_percentiles_equal_numpy(dtype, sign, n):
  rng = np.random.default_rng(n)
  x = (sign * rng.gamma(0.5, size=n) * rng.choice([0, 1], n)).astype(dtype)
  np.testing.assert_allclose(
      telemetry._percentiles(x, (1, 50, 99)), np.percentile(x, [1, 50, 99]),
      rtol=1e-6)


def test_nan_second_moment_gives_nan_statistics():
  v = [np.array([1.0, np.nan, 2.0], np.float32)]
  stats = telemetry.optimizer_state_stats(_stepped_state('fedadam') | {
      'preconditioner': v, 'accumulator': v})
  assert all(np.isnan(stats[k]) for k in (
      'opt/v_mean', 'opt/v_median', 'opt/v_p01', 'opt/v_p99',
      'opt/momentum_norm'))


@pytest.mark.parametrize('name', ['fedcada', 'fafed'])
def test_client_adaptive_process_states_fit_their_vocabulary(name):
  from tests.algorithms import linear
  from tff_fedadamom import algorithms

  process = getattr(algorithms, f'build_{name}')(linear.model_fn, 0.1, learning_rate=0.5)
  state = process.initialize()
  inner = telemetry.unwrap_optimizer_state(state)
  assert name in registry.optimizers_of_state(inner)
  assert registry.momentum_coefficient_of_state(inner) is None
  stats = telemetry.optimizer_state_stats(state)
  v = np.concatenate([np.ravel(x) for x in state.global_model_weights['preconditioner']])
  assert stats['opt/learning_rate'] == pytest.approx(0.5)
  assert stats['opt/v_mean'] == pytest.approx(v.mean())
  assert 'opt/momentum_norm' in stats and 'opt/beta1_mean' not in stats
