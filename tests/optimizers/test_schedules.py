"""Server learning-rate schedules: formulas, registry, errors, and inside TFF."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.optimizers import tiny_task
from tff_fedadamom.optimizers import build_fedadamom
from tff_fedadamom.optimizers import schedules

LR_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


def _rates(fn, rounds):
  return [float(fn(tf.constant(t, tf.int32))) for t in rounds]


def test_registry_lists_the_four_schedules_with_warmup():
  assert schedules.list_schedules() == [
      'constant', 'exponential', 'cosine', 'inverse_time']
  for spec in schedules.SCHEDULES.values():
    assert spec.defaults['warmup_rounds'] == 0
    assert spec.defaults['warmup_init'] == 0.0
    assert set(spec.tunable) <= set(spec.defaults)


@pytest.mark.parametrize('kind, params, expected', [
    ('constant', {}, lambda t: 0.5),
    ('exponential', {'decay_rate': 0.9, 'decay_steps': 2},
     lambda t: 0.5 * 0.9 ** (t / 2)),
    ('exponential', {'decay_rate': 0.9, 'decay_steps': 2, 'staircase': True},
     lambda t: 0.5 * 0.9 ** (t // 2)),
    ('cosine', {'decay_rounds': 10, 'alpha': 0.1},
     lambda t: 0.5 * (0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 10) / 10))
                      + 0.1)),
    ('inverse_time', {'decay_rate': 0.5, 'decay_steps': 3},
     lambda t: 0.5 / (1 + 0.5 * t / 3)),
])
def test_schedule_formulas(kind, params, expected):
  rounds = [0, 1, 2, 3, 5, 10, 25]
  fn = schedules.build_schedule(kind, 0.5, **params)
  np.testing.assert_allclose(
      _rates(fn, rounds), [expected(t) for t in rounds], rtol=1e-6)
  assert fn.kind == kind and fn.base_lr == 0.5


def test_cosine_end_points():
  fn = schedules.build_schedule('cosine', 2.0, decay_rounds=4, alpha=0.25)
  np.testing.assert_allclose(_rates(fn, [0, 2, 4, 100]), [2.0, 1.25, 0.5, 0.5],
                             rtol=1e-6)


def test_warmup_is_linear_then_decay_starts_at_its_end():
  fn = schedules.build_schedule(
      'exponential', 1.0, decay_rate=0.5, warmup_rounds=4)
  np.testing.assert_allclose(
      _rates(fn, [0, 1, 2, 3, 4, 5, 6]),
      [0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.25], rtol=1e-6)
  fn = schedules.build_schedule(
      'constant', 1.0, warmup_rounds=2, warmup_init=0.5)
  np.testing.assert_allclose(_rates(fn, [0, 1, 2, 9]), [0.5, 0.75, 1.0, 1.0],
                             rtol=1e-6)
  assert not fn.is_constant


def test_schedule_accepts_python_ints_and_integral_floats():
  fn = schedules.build_schedule(
      'inverse_time', 1.0, decay_rate=1.0, decay_steps=2.0)
  assert fn.params['decay_steps'] == 2
  assert float(fn(4)) == pytest.approx(1 / 3)
  assert fn(tf.constant(1, tf.int64)).dtype == tf.float32


def test_with_schedule_constant_returns_the_optimizer_unchanged():
  opt = build_fedadamom(0.5)
  assert schedules.with_schedule(opt, schedules.build_schedule('constant', 0.5)) is opt
  assert schedules.with_schedule(opt, None) is opt
  scheduled = schedules.with_schedule(
      opt, schedules.build_schedule('exponential', 0.5))
  state = scheduled.initialize([tf.TensorSpec([2], tf.float32)])
  assert set(state) == {'round_num', 'optimizer'}


@pytest.mark.parametrize('kind, params, name', [
    ('exponential', {'decay_rate': 0.0}, 'decay_rate'),
    ('exponential', {'decay_rate': 1.5}, 'decay_rate'),
    ('exponential', {'decay_steps': 0}, 'decay_steps'),
    ('exponential', {'staircase': 'yes'}, 'staircase'),
    ('cosine', {'decay_rounds': 0}, 'decay_rounds'),
    ('cosine', {'decay_rounds': 2.5}, 'decay_rounds'),
    ('cosine', {'alpha': 1.5}, 'alpha'),
    ('inverse_time', {'decay_rate': -1.0}, 'decay_rate'),
    ('inverse_time', {'decay_steps': True}, 'decay_steps'),
    ('constant', {'warmup_rounds': -1}, 'warmup_rounds'),
    ('constant', {'warmup_init': 2.0}, 'warmup_init'),
    ('cosine', {'warmup_init': float('nan')}, 'warmup_init'),
])
def test_bad_parameter_values_are_named(kind, params, name):
  (value,) = params.values()
  with pytest.raises(ValueError, match=name) as err:
    schedules.build_schedule(kind, 1.0, **params)
  assert repr(value) in str(err.value) or str(value) in str(err.value)


def test_bad_base_lr_unknown_parameter_and_kind():
  with pytest.raises(ValueError, match=r'base_lr.*-0\.1'):
    schedules.build_schedule('constant', -0.1)
  with pytest.raises(ValueError, match="no parameter 'decay_rounds'"):
    schedules.build_schedule('exponential', 1.0, decay_rounds=5)
  with pytest.raises(ValueError, match="Did you mean 'alpha'"):
    schedules.resolve_schedule_params('cosine', alph=0.1)
  with pytest.raises(ValueError, match="Did you mean 'cosine'"):
    schedules.build_schedule('cosin', 1.0)


def test_resolve_fills_defaults():
  assert schedules.resolve_schedule_params('cosine', decay_rounds=7) == {
      'decay_rounds': 7, 'alpha': 0.0, 'warmup_rounds': 0, 'warmup_init': 0.0}


# ---------------------------------------------------------------------------
# Inside a real TFF learning process.


_W = [1.0, 0.0, 0.0]  # Labels: the sign of the first feature.
_model_fn = tiny_task.model_fn(_W)


def _client_data(seed):
  return tiny_task.client_data(seed, _W, n=8, batch=4)


def test_exponential_schedule_inside_fed_avg():
  fn = schedules.build_schedule(
      'exponential', 0.8, decay_rate=0.5, warmup_rounds=2)
  process = tff.learning.algorithms.build_weighted_fed_avg(
      _model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=schedules.with_schedule(
          build_fedadamom(0.8, beta_2=0.1), fn),
  )
  clients = [_client_data(1), _client_data(2)]
  expected = [0.0, 0.4, 0.8, 0.4]  # Rounds 0..3: warm-up, then 0.8 * 0.5**k.
  state = process.initialize()
  seen = [float(state.finalizer['optimizer'][LR_KEY])]
  moved = []
  for t in range(3):
    before = state.global_model_weights.trainable
    state = process.next(state, clients).state
    after = state.global_model_weights.trainable
    moved.append(any(np.any(a != b) for a, b in zip(after, before)))
    assert int(state.finalizer['round_num']) == t + 1
    seen.append(float(state.finalizer['optimizer'][LR_KEY]))
  np.testing.assert_allclose(seen, expected, rtol=1e-6)
  # The scheduled rate is the one applied: round 0 (rate 0) moves nothing.
  assert moved == [False, True, True]
  assert np.any(state.finalizer['optimizer']['preconditioner'][0] > 0)
