"""FedCAda: Adam on the clients, with the Adam state averaged by the server.

Zhou et al., "FedCAda: Adaptive Client-Side Optimization for Accelerated and
Stable Federated Learning", arXiv:2405.11811 (2024). The paper states (abstract
and summary): clients run Adam; FedCAda "adjusts the correction process" of
Adam's m and v on the clients, with stronger constraints in early rounds,
diminishing as training progresses, by a term added to the correction's
denominator; the server aggregates the model AND (m, v). Its algorithm box
could not be consulted (no code by its authors is known), so the correction
schedule below is this project's reading of that description.

One round r (0-based), client i, from the broadcast (x, m, v, t):

```
for each batch (k = 1..K):
  g   = clip_and_decay(grad f_i(x))                  (clip norm, weight decay)
  t   = t + 1
  m   = beta_1 * m + (1 - beta_1) * g
  v   = beta_2 * v + (1 - beta_2) * g**2
  a_r = 1 / (r + 1)                                  (adjustment, see below)
  m^  = m / ((1 - beta_1**t) * (1 + a_r))
  v^  = v / ((1 - beta_2**t) * (1 + a_r))
  x   = x - eta_l * decay**r * m^ / (sqrt(v^) + epsilon)
send (x_start - x, m, v, t)
```

Server: `x <- x - eta * mean(x_start - x_i)` (eta = 1: the models averaged),
`m, v, t <- their means` (weighted like the model).

Choices the description leaves open (ours):
- t is part of the averaged Adam state, like m and v (PyTorch's Adam keeps
  `step` beside the moments), so the bias correction uses the global step
  count instead of restarting each round with moments that are not zero.
- The adjustment multiplies each correction denominator by (1 + a_r), with
  a_r = 1 / (r + 1). Then m^ / sqrt(v^) is plain Adam's ratio times
  (1 + a_r)^(-1/2) at every step, whatever the moments: damped by 1/sqrt(2) in
  round 0, and plain Adam as rounds pass (with epsilon > 0 the factor lies
  between (1 + a_r)^(-1) and (1 + a_r)^(-1/2)). Adding a_r itself to
  `1 - beta**t` would do the opposite: with beta_2 = 0.999 and a_r = 1, v^
  shrinks about 1000-fold against plain Adam at t = 1 but m^ only 11-fold, an
  amplified step. Which adjustment function the paper recommends could not be
  checked, so 1 / (r + 1) is an assumption.
- Partial participation: the average is over the sampled clients; a client
  keeps no state between rounds.

Communication per round and client: model + m + v (+ one scalar) each way,
3x FedAvg.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.algorithms import _common

DEFAULT_LEARNING_RATE = 1.0
DEFAULT_BETA_1 = 0.9
DEFAULT_BETA_2 = 0.999
DEFAULT_EPSILON = 1e-8
STEP_KEY = 'step'
_NAME = 'FedCAda'


def corrected_moments(m, v, t, beta_1, beta_2, a_r):
  """(m^, v^): Adam's bias correction with each denominator times (1 + a_r), on
  tensors or numbers (module docstring)."""
  return (m / ((1.0 - beta_1 ** t) * (1.0 + a_r)),
          v / ((1.0 - beta_2 ** t) * (1.0 + a_r)))


def check_hparams(learning_rate=DEFAULT_LEARNING_RATE, beta_1=DEFAULT_BETA_1,
                  beta_2=DEFAULT_BETA_2, epsilon=DEFAULT_EPSILON) -> None:
  """ValueError naming the first out-of-range hparam."""
  _common.check_positive('learning_rate', learning_rate, algorithm=_NAME)
  _common.check_unit('beta_1', beta_1, algorithm=_NAME)
  _common.check_unit('beta_2', beta_2, algorithm=_NAME)
  _common.check_positive('epsilon', epsilon, algorithm=_NAME)


def _initial_statistics(trainable):
  statistics = _common.zero_moments(trainable)
  statistics[STEP_KEY] = tf.constant(0.0, tf.float32)
  return statistics


def _local_rule(model, trainable, state, global_state, dataset, reduce_fn, transform):
  """Adam from the broadcast (m, v, t) with the adjusted correction (module docstring)."""
  beta_1, beta_2, epsilon = state['beta_1'], state['beta_2'], state['epsilon']
  round_num = state[_common.ROUND_KEY]
  lr = state['learning_rate'] * state['lr_decay'] ** tf.cast(round_num, tf.float32)
  a_r = 1.0 / (tf.cast(round_num, tf.float32) + 1.0)  # an assumption, see the module doc

  def step(carry, batch):
    num_examples, m, v, t = carry
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    g = transform(trainable, tape.gradient(output.loss, trainable))
    t = t + 1.0
    m = tuple(beta_1 * mi + (1.0 - beta_1) * gi for mi, gi in zip(m, g))
    v = tuple(beta_2 * vi + (1.0 - beta_2) * tf.square(gi) for vi, gi in zip(v, g))
    for w, mi, vi in zip(trainable, m, v):
      m_hat, v_hat = corrected_moments(mi, vi, t, beta_1, beta_2, a_r)
      w.assign_sub(lr * m_hat / (tf.sqrt(v_hat) + epsilon))
    return num_examples + _common.num_examples_of(output), m, v, t

  def initial_carry():
    return (tf.constant(0, tf.int64), tuple(global_state[_common.ACCUMULATOR_KEY]),
            tuple(global_state[_common.PRECONDITIONER_KEY]), global_state[STEP_KEY])

  num_examples, m, v, t = reduce_fn(step, dataset, initial_carry)
  return collections.OrderedDict([
      (_common.ACCUMULATOR_KEY, list(m)), (_common.PRECONDITIONER_KEY, list(v)),
      (STEP_KEY, t)]), num_examples


def build_fedcada(model_fn: Callable[[], tff.learning.models.VariableModel],
                  client_learning_rate: float, *, learning_rate: float = DEFAULT_LEARNING_RATE,
                  beta_1: float = DEFAULT_BETA_1, beta_2: float = DEFAULT_BETA_2,
                  epsilon: float = DEFAULT_EPSILON,
                  **client_options) -> tff.learning.templates.LearningProcess:
  """Builds the FedCAda learning process (see the module docstring for the rule).

  `client_learning_rate` is eta_l, Adam's step size on the clients; beta_1,
  beta_2 and epsilon are the clients' Adam's. `client_options`: see
  `_common.build` (`weight_decay` and `clip_norm` apply to the gradient before
  Adam).

  Returns:
    A `tff.learning.templates.LearningProcess`. Its state's
    `global_model_weights` is `OrderedDict(model, accumulator=m,
    preconditioner=v, step=t)`; `get_model_weights` returns the model;
    `get_hparams` gives `client_work=<learning_rate (eta_l), lr_decay, beta_1,
    beta_2, epsilon>` and `finalizer=<learning_rate (eta)>`.
  """
  check_hparams(learning_rate, beta_1, beta_2, epsilon)
  return _common.build(
      _NAME, model_fn, client_learning_rate, learning_rate=learning_rate,
      client_hparams=collections.OrderedDict(beta_1=beta_1, beta_2=beta_2, epsilon=epsilon),
      initial_statistics=_initial_statistics, local_rule=_local_rule, **client_options)
