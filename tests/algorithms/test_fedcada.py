"""FedCAda against a numpy reference of its rule (see tff_fedadamom/algorithms/fedcada.py)."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tests.algorithms import linear
from tff_fedadamom.algorithms import build_fedcada, fedcada


def _reference(rounds, clients, *, lr, eta, b1, b2, eps, weighting, decay=1.0):
  """Global (w, m, v, t) after each round, by the rule of the module docstring."""
  w, m, v, t = linear.W0, 0.0, 0.0, 0.0
  out = []
  for r in range(rounds):
    ends, counts = [], []
    a = 1.0 / (r + 1)
    step_lr = lr * decay ** r
    for i in clients:
      wi, mi, vi, ti = w, m, v, t
      for x, y in linear.CLIENTS[i]:
        g = linear.grad(wi, x, y)
        ti += 1
        mi = b1 * mi + (1 - b1) * g
        vi = b2 * vi + (1 - b2) * g * g
        m_hat = mi / ((1 - b1 ** ti) * (1 + a))
        v_hat = vi / ((1 - b2 ** ti) * (1 + a))
        wi -= step_lr * m_hat / (np.sqrt(v_hat) + eps)
      ends.append((w - wi, mi, vi, ti))
      counts.append(len(linear.CLIENTS[i]) if weighting == 'num_examples' else 1)
    delta, m, v, t = (linear.weighted_mean([e[k] for e in ends], counts) for k in range(4))
    w = w - eta * delta
    out.append((w, m, v, t))
  return out


@pytest.mark.parametrize('weighting, eta, clients', [
    ('uniform', 1.0, (0, 1, 2)),
    ('num_examples', 0.5, (0, 1)),
])
def test_matches_reference_for_three_rounds(weighting, eta, clients):
  hp = dict(lr=0.05, b1=0.8, b2=0.95, eps=1e-3, decay=0.9)
  process = build_fedcada(
      linear.model_fn, hp['lr'], learning_rate=eta, beta_1=hp['b1'], beta_2=hp['b2'],
      epsilon=hp['eps'], client_lr_decay=hp['decay'],
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if weighting == 'uniform'
                        else tff.learning.ClientWeighting.NUM_EXAMPLES))
  state = process.initialize()
  expected = _reference(3, clients, eta=eta, weighting=weighting, **hp)
  for w, m, v, t in expected:
    state = process.next(state, linear.datasets(clients)).state
    g = state.global_model_weights
    np.testing.assert_allclose(linear.scalar(g['model'].trainable), w, rtol=2e-5)
    np.testing.assert_allclose(linear.scalar(g['accumulator']), m, rtol=2e-5)
    np.testing.assert_allclose(linear.scalar(g['preconditioner']), v, rtol=2e-5)
    np.testing.assert_allclose(float(g['step']), t, rtol=1e-6)
  assert linear.scalar(process.get_model_weights(state).trainable) == linear.scalar(
      state.global_model_weights['model'].trainable)


@pytest.mark.parametrize('t', [1, 10])
def test_round_zero_damps_adams_step_by_one_over_sqrt2(t):
  # A constant gradient g for t steps from m = v = 0: m = (1 - b1**t) g and
  # v = (1 - b2**t) g**2, so plain Adam's corrected ratio m^ / sqrt(v^) is
  # sign(g) = 1. Round 0 (a = 1) must divide it by sqrt(2), for b2 = 0.999 too.
  b1, b2, g = 0.9, 0.999, 3.0
  m, v = (1 - b1 ** t) * g, (1 - b2 ** t) * g * g
  m_hat, v_hat = fedcada.corrected_moments(m, v, float(t), b1, b2, 1.0)
  assert m_hat / np.sqrt(v_hat) == pytest.approx(1 / np.sqrt(2), rel=1e-12)
  # Round 3 (a = 1/4): 1 / sqrt(5/4).
  m_hat, v_hat = fedcada.corrected_moments(m, v, float(t), b1, b2, 0.25)
  assert m_hat / np.sqrt(v_hat) == pytest.approx(np.sqrt(0.8), rel=1e-12)


def test_first_step_by_hand():
  # Client 2's one batch (x, y) = (2, -1) at w = 0.5: g = 2 x (w x - y) = 8.
  # Step 1 of round 0: m = (1 - b1) 8, v = (1 - b2) 64, m^ = 8 / 2 = 4,
  # v^ = 64 / 2 = 32, w = 0.5 - lr * 4 / (sqrt(32) + eps) = 0.5 - lr / sqrt(2)
  # (plain Adam would step lr * 8 / (8 + eps), about lr).
  lr, eps = 0.05, 1e-8
  process = build_fedcada(linear.model_fn, lr, beta_1=0.9, beta_2=0.999, epsilon=eps)
  state = process.next(process.initialize(), linear.datasets([2])).state
  g = state.global_model_weights
  np.testing.assert_allclose(linear.scalar(g['model'].trainable),
                             0.5 - lr * 4 / (np.sqrt(32) + eps), rtol=1e-6)
  np.testing.assert_allclose(linear.scalar(g['accumulator']), 0.1 * 8, rtol=1e-6)
  # 1 - 0.999 in float32 is 0.00099999 (relative error 1.3e-5).
  np.testing.assert_allclose(linear.scalar(g['preconditioner']), 0.001 * 64, rtol=1e-4)
  assert float(g['step']) == 1.0


def test_hparams_hold_both_learning_rates():
  process = build_fedcada(linear.model_fn, 0.03, learning_rate=0.7)
  state = process.initialize()
  hparams = process.get_hparams(state)
  assert hparams['client_work']['learning_rate'] == pytest.approx(0.03)
  assert hparams['finalizer']['learning_rate'] == pytest.approx(0.7)
  hparams['client_work']['learning_rate'] = 0.5
  hparams['finalizer']['learning_rate'] = 0.25
  state = process.set_hparams(state, hparams)
  assert process.get_hparams(state)['client_work']['learning_rate'] == pytest.approx(0.5)
  assert state.finalizer['learning_rate'] == pytest.approx(0.25)


@pytest.mark.parametrize('kwargs, name', [
    (dict(beta_1=1.0), 'beta_1'), (dict(beta_2=-0.1), 'beta_2'),
    (dict(epsilon=0.0), 'epsilon'), (dict(learning_rate=0.0), 'learning_rate'),
    (dict(clip_norm=0.0), 'clip_norm'), (dict(client_lr_decay=1.5), 'client_lr_decay'),
])
def test_rejects_out_of_range_hparams(kwargs, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    build_fedcada(linear.model_fn, 0.1, **kwargs)
  assert fedcada.check_hparams() is None
