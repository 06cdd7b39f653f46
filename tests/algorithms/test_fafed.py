"""FAFED against a numpy reference of its rule (see tff_fedadamom/algorithms/fafed.py)."""

import numpy as np
import pytest

from tests.algorithms import linear
from tff_fedadamom.algorithms import build_fafed, fafed


def _reference(rounds, participants, *, gamma, alpha, beta, rho, eta):
  """Global (w, u, v) after each round; `participants[r]` are round r's clients."""
  w, u, v = linear.W0, 0.0, 0.0
  out = []
  for r in range(rounds):
    ends = []
    a = np.sqrt(v) + rho
    for i in participants[r]:
      wi, ui, vi = w, u, v
      if r == 0:  # Initialisation: one batch, u = g, v = g**2, no step.
        x, y = linear.CLIENTS[i][0]
        ui = linear.grad(w, x, y)
        vi = ui * ui
      else:
        for x, y in linear.CLIENTS[i]:
          w_new = wi - gamma * ui / a
          g_new, g_old = linear.grad(w_new, x, y), linear.grad(wi, x, y)
          ui = g_new + (1 - alpha) * (ui - g_old)
          vi = beta * vi + (1 - beta) * g_new * g_new
          wi = w_new
      ends.append((w - wi, ui, vi))
    delta, u, v = (linear.weighted_mean([e[k] for e in ends], [1] * len(ends))
                   for k in range(3))
    w = w - eta * delta
    out.append((w, u, v))
  return out


def _check(process, participants, expected):
  state = process.initialize()
  for clients, (w, u, v) in zip(participants, expected):
    state = process.next(state, linear.datasets(clients)).state
    g = state.global_model_weights
    np.testing.assert_allclose(linear.scalar(g['model'].trainable), w, rtol=2e-5)
    np.testing.assert_allclose(linear.scalar(g['accumulator']), u, rtol=2e-5)
    np.testing.assert_allclose(linear.scalar(g['preconditioner']), v, rtol=2e-5)
  return state


HP = dict(gamma=0.05, alpha=0.3, beta=0.9, rho=0.1)


def _build(eta=1.0):
  return build_fafed(linear.model_fn, HP['gamma'], learning_rate=eta, alpha=HP['alpha'],
                     beta_2=HP['beta'], epsilon=HP['rho'])


def test_full_participation_matches_reference():
  participants = [(0, 1, 2)] * 4
  _check(_build(0.5), participants, _reference(4, participants, eta=0.5, **HP))


def test_partial_participation_averages_over_the_sampled_clients():
  # Round 0 initialises from clients 0 and 2 only; client 1 joins later and
  # starts from the averages, as after a full-participation sync.
  participants = [(0, 2), (1,), (0, 1), (2, 0)]
  state = _check(_build(), participants, _reference(4, participants, eta=1.0, **HP))
  # Had every client taken part, the model would differ: the sampling matters.
  full = _reference(4, [(0, 1, 2)] * 4, eta=1.0, **HP)[-1][0]
  assert abs(linear.scalar(state.global_model_weights['model'].trainable) - full) > 1e-3


def test_initialisation_round_does_not_move_the_model():
  process = _build()
  state = process.initialize()
  output = process.next(state, linear.datasets())
  np.testing.assert_array_equal(output.state.global_model_weights['model'].trainable,
                                state.global_model_weights['model'].trainable)
  # One batch per client, counted once despite the two gradient evaluations.
  assert output.metrics['client_work']['train']['num_examples'] == 3


def test_first_training_step_by_hand_with_the_default_hparams():
  # Defaults alpha = beta = rho = 0.1 (naya0000/FaFed, code/*/main.py).
  assert (fafed.DEFAULT_ALPHA, fafed.DEFAULT_BETA_2, fafed.DEFAULT_EPSILON) == (0.1, 0.1, 0.1)
  gamma = 0.05
  process = build_fafed(linear.model_fn, gamma)
  state = process.initialize()
  # Client 2's one batch (x, y) = (2, -1); g(w) = 2 x (w x - y) = 4 (2 w + 1).
  # Round 0 initialises at w = 0.5: u = g = 8, v = 64.
  state = process.next(state, linear.datasets([2])).state
  # Round 1: A = sqrt(64) + 0.1; w_1 = 0.5 - gamma 8 / 8.1; the STORM update on
  # the same batch, u = g(w_1) + 0.9 (8 - g(0.5)) = g(w_1) (with the image
  # script's ext = 0.95 it would be g(w_1) + 0.36); v = 0.1 * 64 + 0.9 g(w_1)**2.
  state = process.next(state, linear.datasets([2])).state
  w1 = 0.5 - gamma * 8 / 8.1
  g1 = 4 * (2 * w1 + 1)
  g = state.global_model_weights
  np.testing.assert_allclose(linear.scalar(g['model'].trainable), w1, rtol=1e-6)
  np.testing.assert_allclose(linear.scalar(g['accumulator']), g1, rtol=1e-6)
  np.testing.assert_allclose(linear.scalar(g['preconditioner']), 6.4 + 0.9 * g1 * g1,
                             rtol=1e-6)


@pytest.mark.parametrize('kwargs, name', [
    (dict(alpha=0.0), 'alpha'), (dict(beta_2=1.0), 'beta_2'), (dict(epsilon=-1.0), 'epsilon'),
    (dict(weight_decay=-1.0), 'weight_decay'),
])
def test_rejects_out_of_range_hparams(kwargs, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    build_fafed(linear.model_fn, 0.1, **kwargs)
