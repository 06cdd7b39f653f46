"""FedCAda: Adam on the clients, with the Adam state averaged by the server.

Zhou et al., "FedCAda: Adaptive Client-Side Optimization for Accelerated and
Stable Federated Learning", arXiv:2405.11811 (2024). What the paper states
(abstract and summary): clients run Adam; FedCAda "adjusts the correction
process" of Adam's first moment m and second moment v on the clients, imposing
stronger constraints in early rounds (when a client's model holds little
information from other clients) and diminishing them as training progresses;
adding a term to the correction's denominator is what stabilises the updates;
the server aggregates the model AND the adaptive parameters (m, v).

The paper's algorithm box and equation numbers could not be consulted for this
implementation (only the abstract was readable; no code by its authors is
known), so the correction schedule below is this project's reading of that
description, not a transcription; it is marked as such wherever it appears.

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

Server: `x <- x - eta * mean(x_start - x_i)` (eta = 1: the clients' models
averaged), `m, v, t <- mean of the clients' m, v, t` (weighted like the model).

Choices the description leaves open (ours):
- Adam's step count t is part of the averaged Adam state, like m and v (a
  client's Adam state is (m, v, t); PyTorch's Adam keeps `step` beside the
  moments), so the bias correction `1 - beta**t` uses the global step count
  and stops amplifying after the first rounds instead of restarting each round
  with moments that are no longer zero.
- The adjustment enters each correction denominator as the factor (1 + a_r),
  with a_r = 1 / (r + 1); equivalently the term a_r * (1 - beta**t) is added
  to it. Then m^ / sqrt(v^) is plain Adam's corrected ratio times
  (1 + a_r)^(-1/2), at every step t of the round, whatever beta_1, beta_2 and
  the moments are: the step is damped by 1/sqrt(2) in round 0, and the damping
  vanishes as rounds pass, recovering plain Adam with averaged state. (With
  epsilon > 0 the factor lies between (1 + a_r)^(-1) and (1 + a_r)^(-1/2).)
  Why this form: the description asks for stronger constraints early that
  diminish later. Adding a_r itself to `1 - beta**t` does not do that: with
  beta_2 = 0.999 and a_r = 1, `(1 - beta_2**t) + 1` is about 1 while
  `1 - beta_2**t` is 0.001 at t = 1, so against plain Adam v^ shrinks about
  1000-fold but m^ (beta_1 = 0.9) only 11-fold, and the step is about 2.9
  times plain Adam's at t = 1 (4.0 times at t = 10), an amplification. The paper compares several adjustment functions; which one it
  recommends could not be checked, so 1 / (r + 1) is an assumption.
- Clipping and weight decay act on g before Adam (the reference setup's client
  transform, `tff_fedadamom.optimizers.client.clip_and_decay`).
- Partial participation: the average is over the sampled clients only; a client
  keeps no state between rounds (it starts from the broadcast m, v, t).

Communication per round and client: model + m + v (+ one scalar) in each
direction, 3x FedAvg.
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


def adjustment(round_num):
  """a_r = 1 / (r + 1), the adjustment of round r (an assumption, see module doc)."""
  return 1.0 / (tf.cast(round_num, tf.float32) + 1.0)


def corrected_moments(m, v, t, beta_1, beta_2, a_r):
  """(m^, v^): Adam's bias correction with each denominator times (1 + a_r).

  m^ / sqrt(v^) is then Adam's corrected ratio times (1 + a_r)^(-1/2) (module
  docstring). Works on tensors and on numbers.
  """
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
  return collections.OrderedDict([
      (_common.ACCUMULATOR_KEY, [tf.zeros_like(w) for w in trainable]),
      (_common.PRECONDITIONER_KEY, [tf.zeros_like(w) for w in trainable]),
      (STEP_KEY, tf.constant(0.0, tf.float32)),
  ])


def _local_rule(model, trainable, state, global_state, dataset, reduce_fn, transform):
  """Adam from the broadcast (m, v, t) with the adjusted correction (module docstring)."""
  beta_1, beta_2, epsilon = state['beta_1'], state['beta_2'], state['epsilon']
  round_num = state[_common.ROUND_KEY]
  lr = state['learning_rate'] * state['lr_decay'] ** tf.cast(round_num, tf.float32)
  a_r = adjustment(round_num)

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


def build_fedcada(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_learning_rate: float,
    *,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    beta_1: float = DEFAULT_BETA_1,
    beta_2: float = DEFAULT_BETA_2,
    epsilon: float = DEFAULT_EPSILON,
    **client_options,
) -> tff.learning.templates.LearningProcess:
  """Builds the FedCAda learning process (see the module docstring for the rule).

  Args:
    model_fn: No-arg callable returning a new `tff.learning.models.VariableModel`.
    client_learning_rate: eta_l, Adam's step size on the clients.
    learning_rate: eta, the server's step on the mean model update (1 = averaging).
    beta_1: Adam's first-moment decay on the clients.
    beta_2: Adam's second-moment decay on the clients.
    epsilon: Adam's denominator constant.
    **client_options: `client_weighting` (UNIFORM, the default, or NUM_EXAMPLES;
      for the model and the Adam state alike), `client_lr_decay`, `weight_decay`
      and `clip_norm` (applied to the gradient before Adam), `model_aggregator`,
      `loop_implementation`: see `tff_fedadamom.algorithms._common.build`.

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
