"""The Adam family: FedAdam/FedYogi with and without bias correction, FedAMSGrad, FADAS.

Hand-computed steps use beta_1 = 0.5, beta_2 = 0.75, epsilon = 1, lr = 1 and
w_0 = [1, 1], so that the moments stay readable fractions. With epsilon = 1 the
two bias-correction forms (TFF's, rescaling lr; the FedAMS/FADAS code's,
rescaling sqrt(v_hat) before epsilon is added) give different steps.
"""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import adaptive
from tff_fedadamom.optimizers import build_fadas
from tff_fedadamom.optimizers import build_fedadam
from tff_fedadamom.optimizers import build_fedamsgrad
from tff_fedadamom.optimizers import build_fedyogi
from tff_fedadamom import methods as registry
from tff_fedadamom.optimizers import state as keys

LR_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
HAND = dict(learning_rate=1.0, beta_1=0.5, beta_2=0.75, epsilon=1.0)


def _run(opt, weights, grads_per_step):
  state = opt.initialize(
      tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), weights))
  trace = []
  for grads in grads_per_step:
    state, weights = opt.next(state, weights, grads)
    trace.append(np.asarray(weights[0]))
  return state, trace


def _steps(*grads):
  return [[tf.constant(g, tf.float32)] for g in grads]


def _c(t, b1=0.5, b2=0.75):
  """The bias-correction factor sqrt(1 - b2**t) / (1 - b1**t)."""
  return math.sqrt(1 - b2**t) / (1 - b1**t)


# g_1 = [2, -4], g_2 = [0, 2], g_3 = [1, 0]:
#   m_1 = [1, -2]      v_1 = [1, 4]        step_1 = m / (sqrt(v) + 1) = [1/2, -2/3]
#   m_2 = [1/2, 0]     v_2 = [3/4, 4]      (v of the first coordinate DROPS)
#   m_3 = [3/4, 0]     v_3 = [13/16, 3]
ADAM_GRADS = ([2.0, -4.0], [0.0, 2.0], [1.0, 0.0])
ADAM_STEPS = [
    np.array([1 / 2, -2 / 3]),
    np.array([0.5 / (math.sqrt(0.75) + 1), 0.0]),
    np.array([0.75 / (math.sqrt(13 / 16) + 1), 0.0]),
]
# AMSGrad divides by v_hat = max(v_hat, v) = [1, 4] at every step:
AMSGRAD_STEPS = [np.array([1 / 2, -2 / 3]), np.array([0.5 / 2, 0.0]),
                 np.array([0.75 / 2, 0.0])]
# The same with the FedAMS/FADAS code's correction, step_t =
# (m / (1 - b1**t)) / (sqrt(v_hat) / sqrt(1 - b2**t) + 1):
#   t = 1: 1 - b1 = 1/2, sqrt(1 - b2) = 1/2:  [2, -4] / ([2, 4] + 1) = [2/3, -4/5]
#   t = 2: 1 - b1**2 = 3/4, sqrt(1 - b2**2) = sqrt(7)/4:  (2/3) / (4 / sqrt(7) + 1)
#   t = 3: 1 - b1**3 = 7/8, sqrt(1 - b2**3) = sqrt(37)/8:  (6/7) / (8 / sqrt(37) + 1)
AMSGRAD_CORRECTED_STEPS = [
    np.array([2 / 3, -4 / 5]),
    np.array([(2 / 3) / (4 / math.sqrt(7) + 1), 0.0]),
    np.array([(6 / 7) / (8 / math.sqrt(37) + 1), 0.0]),
]
# Yogi (v_0 = 0) with g_1 = [2, -4], g_2 = [1, 1], g_3 = [3, 0]:
#   v_1 = 0 + (1/4) g^2 = [1, 4]                  m_1 = [1, -2]
#   v_2 = v_1 - (1/4) sign(v_1 - g^2) g^2 = [1 - 0, 4 - 1/4] = [1, 15/4]
#                                                  m_2 = [1, -1/2]
#   v_3 = [1 + (1/4) 9, 15/4 - 0] = [13/4, 15/4]   m_3 = [2, -1/4]
YOGI_GRADS = ([2.0, -4.0], [1.0, 1.0], [3.0, 0.0])
YOGI_STEPS = [
    np.array([1 / 2, -2 / 3]),
    np.array([1 / 2, -0.5 / (math.sqrt(15 / 4) + 1)]),
    np.array([2 / (math.sqrt(13 / 4) + 1), -0.25 / (math.sqrt(15 / 4) + 1)]),
]


def _expected(steps, factors=(1.0, 1.0, 1.0)):
  w, out = np.ones(2), []
  for step, factor in zip(steps, factors):
    w = w - factor * step
    out.append(w)
  return out


BIAS_FACTORS = (_c(1), _c(2), _c(3))  # _c(1) = sqrt(1/4) / (1/2) = 1.


def _fedamsgrad(**kw):
  return build_fedamsgrad(initial_max_preconditioner=0.0, **kw)


# (build, grads, steps without correction, steps with, factors with). FedAdam
# and FedYogi correct in TFF's form (lr times BIAS_FACTORS), FedAMSGrad and
# FADAS in their code's (AMSGRAD_CORRECTED_STEPS).
ONE = (1.0, 1.0, 1.0)
HAND_CASES = {
    'fedadam': (build_fedadam, ADAM_GRADS, ADAM_STEPS, ADAM_STEPS, BIAS_FACTORS),
    'fedyogi': (build_fedyogi, YOGI_GRADS, YOGI_STEPS, YOGI_STEPS, BIAS_FACTORS),
    'fedamsgrad': (_fedamsgrad, ADAM_GRADS, AMSGRAD_STEPS, AMSGRAD_CORRECTED_STEPS, ONE),
    'fadas': (build_fadas, ADAM_GRADS, AMSGRAD_STEPS, AMSGRAD_CORRECTED_STEPS, ONE),
}


@pytest.mark.parametrize('name', HAND_CASES)
@pytest.mark.parametrize('bias_correction', [False, True])
def test_three_steps_by_hand(name, bias_correction):
  build, grads, plain, corrected, factors = HAND_CASES[name]
  opt = build(bias_correction=bias_correction, **HAND)
  _, trace = _run(opt, [tf.ones(2)], _steps(*grads))
  want = (_expected(corrected, factors) if bias_correction
          else _expected(plain))
  for got, w in zip(trace, want):
    np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)


def test_fedamsgrad_max_stabilization_by_hand():
  # v_hat_0 = 4, epsilon = 0, no correction: v_1 = [1, 4], v_hat_1 = [4, 4],
  # step = m / sqrt(v_hat) = [1, -2] / 2.
  opt = build_fedamsgrad(**{**HAND, 'epsilon': 0.0}, initial_max_preconditioner=4.0,
                         bias_correction=False)
  state, trace = _run(opt, [tf.ones(2)], _steps(ADAM_GRADS[0]))
  np.testing.assert_allclose(trace[0], [0.5, 2.0], rtol=1e-6)
  np.testing.assert_allclose(state[keys.PRECONDITIONER_KEY][0], [1.0, 4.0])
  # Without a positive v_hat_0 a zero epsilon would allow 0 / 0.
  with pytest.raises(ValueError, match='`epsilon`'):
    build_fedamsgrad(epsilon=0.0, initial_max_preconditioner=0.0)


def test_the_two_conventions_differ_from_the_second_step():
  # c_1 = 1 for these betas, c_2 = sqrt(7/16) / (3/4) != 1.
  assert BIAS_FACTORS[0] == 1.0 and BIAS_FACTORS[1] == pytest.approx(
      math.sqrt(7 / 16) / 0.75)
  runs = [_run(build_fedadam(bias_correction=b, **HAND), [tf.ones(2)],
               _steps(*ADAM_GRADS))[1] for b in (False, True)]
  np.testing.assert_allclose(runs[0][0], runs[1][0])
  assert not np.allclose(runs[0][1], runs[1][1])


def test_amsgrad_slots_by_hand():
  state, _ = _run(_fedamsgrad(**HAND), [tf.ones(2)], _steps(*ADAM_GRADS))
  np.testing.assert_allclose(state[keys.ACCUMULATOR_KEY][0], [0.75, 0.0])
  np.testing.assert_allclose(state[keys.PRECONDITIONER_KEY][0], [13 / 16, 3.0])
  np.testing.assert_allclose(state[keys.MAX_PRECONDITIONER_KEY][0], [1.0, 4.0])


def numpy_adaptive(weights, grads_per_step, lr, beta_1, beta_2, eps, *,
                   rule='adam', amsgrad=False, bias_correction=None, v0=0.0,
                   vhat0=None, lr_per_step=None):
  """Reference implementation over a list of numpy leaves (float64).

  `bias_correction`: None, 'lr' (TFF/Keras: lr * sqrt(1 - b2**t) / (1 - b1**t))
  or 'root' (FedAMS/FADAS code: lr / (1 - b1**t), sqrt(d / (1 - b2**t)) + eps).
  """
  w = [np.asarray(x, np.float64) for x in weights]
  m = [np.zeros_like(x) for x in w]
  v = [np.full_like(x, v0) for x in w]
  vhat = [np.full_like(x, v0 if vhat0 is None else vhat0) for x in w]
  for t, grads in enumerate(grads_per_step, start=1):
    rate = lr if lr_per_step is None else lr_per_step[t - 1]
    root_scale = 1.0
    if bias_correction == 'lr':
      rate = rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    elif bias_correction == 'root':
      rate, root_scale = rate / (1 - beta_1**t), 1 / np.sqrt(1 - beta_2**t)
    for i, g in enumerate(grads):
      m[i] = beta_1 * m[i] + (1 - beta_1) * g
      if rule == 'adam':
        v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
      else:
        v[i] = v[i] - (1 - beta_2) * np.sign(v[i] - g * g) * g * g
      vhat[i] = np.maximum(vhat[i], v[i])
      d = vhat[i] if amsgrad else v[i]
      w[i] = w[i] - rate * m[i] / (root_scale * np.sqrt(d) + eps)
  return w


# (rule, AMSGrad, correction form, v_0, v_hat_0) of each registry default.
NUMPY_CASES = {
    'fedadam': ('adam', False, 'lr', 0.0, None),
    'fedyogi': ('yogi', False, 'lr', 0.0, None),
    'fedamsgrad': ('adam', True, 'root', 0.0, 1e-3),
    'fadas': ('adam', True, 'root', 0.0, 0.0),
}


@pytest.mark.parametrize('name', NUMPY_CASES)
@pytest.mark.parametrize('bias_correction', [False, True])
def test_several_steps_match_numpy(name, bias_correction):
  rule, amsgrad, form, v0, vhat0 = NUMPY_CASES[name]
  rng = np.random.default_rng(11)
  shapes = [(3, 2), (4,), ()]
  weights = [rng.normal(size=s).astype(np.float32) for s in shapes]
  # Shrinking updates, so that AMSGrad's maximum and v part ways.
  steps = [[(rng.normal(size=s) * 2.0**-k).astype(np.float32) for s in shapes]
           for k in range(8)]
  hparams = dict(learning_rate=0.3, beta_1=0.8, beta_2=0.9, epsilon=1e-2,
                 bias_correction=bias_correction)
  opt = registry.build_server_optimizer(name, **hparams)
  state = opt.initialize([tf.TensorSpec(x.shape, tf.float32) for x in weights])
  new = [tf.constant(x) for x in weights]
  for gs in steps:
    state, new = opt.next(state, new, [tf.constant(g) for g in gs])
  want = numpy_adaptive(weights, steps, 0.3, 0.8, 0.9, 1e-2, rule=rule,
                        amsgrad=amsgrad, bias_correction=form if bias_correction else None,
                        v0=v0, vhat0=vhat0)
  for a, b in zip(new, want):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


class TestDelayAdaptive:

  # yujiaw98/FADAS, g_delay_adaptive.py: eta times 1 / tau_max above tau_c.
  @pytest.mark.parametrize('lr,tau,tau_c,want', [
      (0.5, 0, 1, 0.5),      # synchronous: the base rate
      (0.5, 1, 1, 0.5),      # at the threshold: the base rate
      (0.5, 2, 1, 0.25),     # 0.5 / 2 (min(0.5, 1/2) would keep 0.5)
      (0.5, 4, 1, 0.125),    # 0.5 / 4
      (0.1, 4, 1, 0.025),    # 0.1 / 4 (min(0.1, 1/4) would keep 0.1)
      (2.0, 3, 5, 2.0),      # below a higher threshold
      (2.0, 8, 5, 0.25),     # 2 / 8
  ])
  def test_rule(self, lr, tau, tau_c, want):
    assert adaptive.delay_adaptive_learning_rate(lr, tau, tau_c) == pytest.approx(want)
    got = adaptive.delay_adaptive_learning_rate(
        tf.constant(lr), tf.constant(float(tau)), tf.constant(float(tau_c)))
    assert float(got) == pytest.approx(want)

  def test_delay_enters_through_the_state(self):
    # tau = 4 > tau_c = 1: eta_t = eta / 4, the first (corrected) step times 1/4.
    opt = build_fadas(delay_threshold=1.0, **HAND)
    state = opt.initialize([tf.TensorSpec([2], tf.float32)])
    assert state[keys.MAX_DELAY_KEY] == 0.0
    state = opt.set_hparams(state, {keys.MAX_DELAY_KEY: 4.0})
    _, w = opt.next(state, [tf.ones(2)], [tf.constant([2.0, -4.0])])
    np.testing.assert_allclose(w[0], 1 - 0.25 * AMSGRAD_CORRECTED_STEPS[0], rtol=1e-6)

  def test_synchronous_fadas_is_fedamsgrad(self):
    grads = _steps(*ADAM_GRADS)
    _, a = _run(build_fadas(**HAND), [tf.ones(2)], grads)
    _, b = _run(_fedamsgrad(**HAND), [tf.ones(2)], grads)
    np.testing.assert_array_equal(a, b)


def test_state_layouts():
  specs = [tf.TensorSpec([2], tf.float32)]
  assert list(build_fedadam(0.1, bias_correction=False).initialize(specs)) == [
      LR_KEY, 'beta_1', 'beta_2', 'epsilon', 'accumulator', 'preconditioner']
  assert list(build_fedamsgrad(bias_correction=True).initialize(specs)) == [
      LR_KEY, 'beta_1', 'beta_2', 'epsilon', 'step', 'accumulator',
      'preconditioner', 'max_preconditioner']
  fadas_state = build_fadas().initialize(specs)
  assert list(fadas_state) == [
      LR_KEY, 'beta_1', 'beta_2', 'epsilon', 'delay_threshold', 'max_delay',
      'step', 'accumulator', 'preconditioner', 'max_preconditioner']
  assert build_fadas().get_hparams(fadas_state) == collections.OrderedDict([
      (LR_KEY, 1e-3), ('beta_1', 0.9), ('beta_2', 0.99), ('epsilon', 1e-8),
      ('delay_threshold', 1.0), ('max_delay', 0.0)])
  # The default FedAdam/FedYogi are TFF's own: the state the project always had.
  tff_adam = tff.learning.optimizers.build_adam(0.1).initialize(specs)
  assert list(build_fedadam(0.1).initialize(specs)) == list(tff_adam)


def test_state_keys_are_tffs():
  specs = [tf.TensorSpec([2], tf.float32)]
  tff_keys = set(tff.learning.optimizers.build_adam(0.1).initialize(specs))
  assert {keys.LEARNING_RATE_KEY, keys.BETA_1_KEY, keys.BETA_2_KEY,
          keys.EPSILON_KEY, keys.STEP_KEY, keys.ACCUMULATOR_KEY,
          keys.PRECONDITIONER_KEY} == tff_keys


def test_hparams_round_trip_and_unknown():
  opt = build_fedadam(0.1, bias_correction=False)
  state = opt.initialize([tf.TensorSpec([2], tf.float32)])
  new = opt.set_hparams(state, {'beta_2': 0.5})
  assert opt.get_hparams(new)['beta_2'] == 0.5 and list(new) == list(state)
  with pytest.raises(ValueError, match='max_delay'):
    opt.set_hparams(state, {'max_delay': 3.0})


@pytest.mark.parametrize('build', [
    lambda **kw: build_fedadam(bias_correction=False, **kw),
    lambda **kw: build_fedyogi(bias_correction=False, **kw),
    _fedamsgrad, build_fadas,
])
@pytest.mark.parametrize('kwargs,name', [
    (dict(learning_rate=-0.1), 'learning_rate'),
    (dict(beta_1=1.5), 'beta_1'),
    (dict(beta_2=-0.01), 'beta_2'),
    (dict(epsilon=0.0), 'epsilon'),
    (dict(learning_rate=float('nan')), 'learning_rate'),
    (dict(beta_1=tf.constant(2.0)), 'beta_1'),
])
def test_invalid_args(build, kwargs, name):
  with pytest.raises(ValueError, match=rf'`{name}`.*found'):
    build(**{'learning_rate': 0.1, **kwargs})


@pytest.mark.parametrize('build', [build_fedadam, build_fedyogi, build_fedamsgrad,
                                   build_fadas])
@pytest.mark.parametrize('value', ['no', 1, 0.0, None])
def test_bias_correction_must_be_a_bool(build, value):
  with pytest.raises(ValueError, match=r'`bias_correction`.*found'):
    build(learning_rate=0.1, bias_correction=value)


def test_invalid_fadas_delay_threshold():
  with pytest.raises(ValueError, match=r'`delay_threshold`.*found'):
    build_fadas(delay_threshold=-1.0)


def test_yogi_invalid_initial_preconditioner():
  with pytest.raises(ValueError, match=r'`initial_preconditioner`.*found'):
    build_fedyogi(0.1, initial_preconditioner=-1.0, bias_correction=False)


# Each registry default as its source has it (the README's optimizer table):
# google-research/federated optimization/docs/hyperparameters.md (FedAdam,
# FedYogi: Keras' betas, tau 1e-3, Yogi's initial accumulator 0.0, Keras'
# corrected Adam/Yogi); jinghuichen/FedCAMS options.py and its README's FedAMS
# command (lr 1.0, eps 0, max_init 1e-3; update.py always corrects);
# yujiaw98/FADAS options.py and its README's delay-adaptive command.
SOURCE_DEFAULTS = {
    'fedadam': dict(beta_1=0.9, beta_2=0.999, epsilon=1e-3, bias_correction=True),
    'fedyogi': dict(beta_1=0.9, beta_2=0.999, epsilon=1e-3, initial_preconditioner=0.0,
                    bias_correction=True),
    'fedamsgrad': dict(learning_rate=1.0, beta_1=0.9, beta_2=0.99, epsilon=0.0,
                       initial_max_preconditioner=1e-3, bias_correction=True),
    'fadas': dict(learning_rate=1e-3, beta_1=0.9, beta_2=0.99, epsilon=1e-8,
                  delay_threshold=1.0, bias_correction=True),
}


@pytest.mark.parametrize('name', SOURCE_DEFAULTS)
def test_defaults_follow_the_official_code(name):
  defaults = registry.default_hparams(name)
  for hparam, value in SOURCE_DEFAULTS[name].items():
    assert defaults[hparam] == value, (name, hparam)
