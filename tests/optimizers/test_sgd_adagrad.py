"""FedAvg, FedAvgM and FedAdagrad step by step, by hand: the server rules the
registry builds (its `fedavg`, `fedavgm` and `fedadagrad`), on two steps of the
same pseudo-gradients g_1 = [2, -4], g_2 = [1, 1] from w_0 = [1, 1]; and
FedAdagrad against a numpy reference of Reddi et al.'s rule."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_fedadamom import methods

GRADS = ([2.0, -4.0], [1.0, 1.0])


def _trace(name, **hparams):
  opt = methods.build_server_optimizer(name, **hparams)
  weights = [tf.ones(2)]
  state = opt.initialize([tf.TensorSpec([2], tf.float32)])
  trace = []
  for g in GRADS:
    state, weights = opt.next(state, weights, [tf.constant(g)])
    trace.append(weights[0].numpy())
  return state, trace


@pytest.mark.parametrize("name,hparams,want", [
    # w = w - eta g, eta = 0.5: [1, 1] - [1, -2] = [0, 3]; - [0.5, 0.5].
    ("fedavg", dict(learning_rate=0.5), ([0.0, 3.0], [-0.5, 2.5])),
    # m = mu m + g, w = w - eta m (mu = 0.5, eta = 1): m_1 = [2, -4], w_1 = [-1, 5];
    # m_2 = [1, -2] + [1, 1] = [2, -1], w_2 = [-3, 6].
    ("fedavgm", dict(learning_rate=1.0, momentum=0.5), ([-1.0, 5.0], [-3.0, 6.0])),
    # v = v + g^2, w = w - eta g / (sqrt(v) + eps) (eta = eps = 1, v_0 = 0):
    # v_1 = [4, 16], step [2/3, -4/5]; v_2 = [5, 17], step [1/(sqrt 5 + 1), 1/(sqrt 17 + 1)].
    ("fedadagrad", dict(learning_rate=1.0, epsilon=1.0),
     ([1 - 2 / 3, 1 + 4 / 5],
      [1 - 2 / 3 - 1 / (math.sqrt(5) + 1), 1 + 4 / 5 - 1 / (math.sqrt(17) + 1)])),
])
def test_two_steps_by_hand(name, hparams, want):
  _, trace = _trace(name, **hparams)
  for got, expected in zip(trace, want):
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)  # float32


def test_fedadagrad_keeps_epsilon_outside_the_root():
  # TFF's build_adagrad would step 2 / sqrt(4 + 1) = 0.894 on the first coordinate.
  state, trace = _trace("fedadagrad", learning_rate=1.0, epsilon=1.0)
  assert trace[0][0] == pytest.approx(1 / 3) and abs(trace[0][0] - (1 - 2 / math.sqrt(5))) > 0.2
  np.testing.assert_allclose(state["preconditioner"][0], [5.0, 17.0])
  assert list(state) == ["learning_rate", "epsilon", "preconditioner"]  # TFF's layout


def test_fedadagrad_matches_a_numpy_reference():
  # Hparams that float32 holds exactly (a state keeps its hparams in float32).
  lr, eps, v0 = 0.125, 2.0 ** -10, 2.0 ** -7
  rng = np.random.default_rng(0)
  opt = methods.build_server_optimizer("fedadagrad", learning_rate=lr, epsilon=eps,
                                       initial_preconditioner=v0)
  w = rng.normal(size=(3, 4))
  v = np.full_like(w, v0)
  state = opt.initialize([tf.TensorSpec(w.shape, tf.float64)])
  weights = [tf.constant(w)]
  for _ in range(5):
    g = rng.normal(size=w.shape) * 10 ** rng.uniform(-3, 1)
    v = v + g ** 2
    w = w - lr * g / (np.sqrt(v) + eps)
    state, weights = opt.next(state, weights, [tf.constant(g)])
  np.testing.assert_allclose(weights[0].numpy(), w, rtol=1e-12)


def test_fedadagrad_needs_a_positive_epsilon_when_v_starts_at_zero():
  with pytest.raises(ValueError, match="epsilon"):
    methods.build_server_optimizer("fedadagrad", epsilon=0.0)
  methods.build_server_optimizer("fedadagrad", epsilon=0.0, initial_preconditioner=0.1)
