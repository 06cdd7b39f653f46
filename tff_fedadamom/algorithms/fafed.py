"""FAFED: momentum-based variance-reduced client steps with a shared adaptive matrix.

Wu, Huang, Hu and Huang, "Faster Adaptive Federated Learning", AAAI 2023
(arXiv:2212.00974), Algorithm 1. Only the abstract could be read and no code by
its authors is known; the rule follows the abstract (momentum-based variance
reduction, an adaptive matrix shared by the workers) and an unofficial PyTorch
implementation (naya0000/FaFed, `code/Image/FAFED.py`, `code/NLP/FAFED.py`,
their `main.py`), which averages the parameters, u and v at every
communication and sets H = sqrt(v) + rho from the averaged v. Each worker keeps
a STORM momentum estimator u (Cutkosky & Orabona, 2019) and an average v of
squared gradients.

One round r (0-based), client i, from the broadcast (x, u, v):

```
A = sqrt(v) + rho                                     (fixed for the round)
for each batch B:
  x_new = x - gamma_r * u / A
  u     = g(x_new; B) + (1 - alpha) * (u - g(x; B))  (both gradients on the SAME batch)
  v     = beta_2 * v + (1 - beta_2) * g(x_new; B)**2
  x     = x_new
send (x_start - x, u, v)
```

Server: `x <- x - eta * mean(x_start - x_i)` (eta = 1: the models averaged),
`u, v <- their means`. Round 0 is Algorithm 1's initialisation (u_1 = g,
v_1 = g**2, averaged): each client evaluates one batch at x and sends u = g,
v = g**2 and a zero model update (the same step with gamma = 0, alpha = 1,
beta_2 = 0). Defaults alpha = beta = rho = 0.1 are that implementation's
argparse defaults (beta is `beta_2` here, rho `epsilon`).

Deviations from that implementation (ours):
- u is updated after each step from g(x) and g(x_new) on the same batch, x the
  point the step started from (the averaged model at a round's start), so the
  correction is the gradient change along the step taken, which STORM's
  variance argument bounds; the implementation differences against the
  client's own pre-averaging iterate, and moves the model while initialising.
- The old gradient's weight `ext` is 1 (STORM); the image script's 0.95 leaves
  u a bias of (1 - alpha) (1 - ext) g_old.
- gamma and alpha are constants (gamma_r = gamma * client_lr_decay**r); the
  NLP script's (1 + epoch)^(-1/3) decay is not offered.
- Clipping and weight decay apply to both gradients (with a clip norm the
  correction is not exactly a difference of gradients of one function); dropout
  draws different masks for the two evaluations; train metrics are those at x
  (the second evaluation's metric updates are undone).

Partial participation: FAFED is cross-silo (every worker, every round). With
`clients_per_round < num_clients` the averages are over the sampled clients and
a client sampled later starts from the current averages, as after a full sync;
the averaged u then also carries client-sampling noise, which the STORM
correction does not remove (the analysis assumes full participation).

Communication per round and client: model + u + v each way, 3x FedAvg.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.algorithms import _common

DEFAULT_LEARNING_RATE = 1.0
DEFAULT_ALPHA = 0.1
DEFAULT_BETA_2 = 0.1  # beta; naya0000/FaFed, code/Image/main.py and code/NLP/main.py
DEFAULT_EPSILON = 0.1  # rho; the same
_NAME = 'FAFED'


def check_hparams(learning_rate=DEFAULT_LEARNING_RATE, alpha=DEFAULT_ALPHA,
                  beta_2=DEFAULT_BETA_2, epsilon=DEFAULT_EPSILON) -> None:
  """ValueError naming the first out-of-range hparam."""
  _common.check_positive('learning_rate', learning_rate, algorithm=_NAME)
  if not 0 < alpha <= 1:
    raise ValueError(f'{_NAME} `alpha` must be in (0, 1], found {alpha}.')
  _common.check_unit('beta_2', beta_2, algorithm=_NAME)
  _common.check_positive('epsilon', epsilon, algorithm=_NAME)


def _local_rule(model, trainable, state, global_state, dataset, reduce_fn, transform):
  """STORM steps scaled by the round's fixed A (module docstring); round 0 initialises."""
  round_num = state[_common.ROUND_KEY]
  init_round = tf.equal(round_num, 0)
  gamma = tf.where(init_round, 0.0, state['learning_rate']
                   * state['lr_decay'] ** tf.cast(round_num, tf.float32))
  alpha = tf.where(init_round, 1.0, state['alpha'])
  beta_2 = tf.where(init_round, 0.0, state['beta_2'])
  adaptive = [tf.sqrt(v) + state['epsilon']
              for v in global_state[_common.PRECONDITIONER_KEY]]
  # The initialisation round looks at one batch; the others at every batch.
  dataset = dataset.take(tf.where(init_round, tf.constant(1, tf.int64),
                                  tf.constant(-1, tf.int64)))

  def gradient(batch):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    return transform(trainable, tape.gradient(output.loss, trainable)), output

  def step(carry, batch):
    num_examples, u, v = carry
    g_old, output = gradient(batch)
    for w, ui, ai in zip(trainable, u, adaptive):
      w.assign_sub(gamma * ui / ai)
    # The second evaluation must not count in the train metrics: undo its updates.
    saved = [tf.identity(x) for x in model.local_variables]
    with tf.control_dependencies(saved):
      g_new, _ = gradient(batch)
    with tf.control_dependencies(tf.nest.flatten(g_new)):
      for x, value in zip(model.local_variables, saved):
        x.assign(value)
    u = tuple(gn + (1.0 - alpha) * (ui - go) for gn, ui, go in zip(g_new, u, g_old))
    v = tuple(beta_2 * vi + (1.0 - beta_2) * tf.square(gn) for vi, gn in zip(v, g_new))
    return num_examples + _common.num_examples_of(output), u, v

  def initial_carry():
    return (tf.constant(0, tf.int64), tuple(global_state[_common.ACCUMULATOR_KEY]),
            tuple(global_state[_common.PRECONDITIONER_KEY]))

  num_examples, u, v = reduce_fn(step, dataset, initial_carry)
  return collections.OrderedDict([
      (_common.ACCUMULATOR_KEY, list(u)), (_common.PRECONDITIONER_KEY, list(v))]), num_examples


def build_fafed(model_fn: Callable[[], tff.learning.models.VariableModel],
                client_learning_rate: float, *, learning_rate: float = DEFAULT_LEARNING_RATE,
                alpha: float = DEFAULT_ALPHA, beta_2: float = DEFAULT_BETA_2,
                epsilon: float = DEFAULT_EPSILON,
                **client_options) -> tff.learning.templates.LearningProcess:
  """Builds the FAFED learning process (see the module docstring for the rule).

  `client_learning_rate` is gamma, `epsilon` rho. `client_options`: see
  `_common.build` (`weight_decay` and `clip_norm` apply to both gradients).

  Returns:
    A `tff.learning.templates.LearningProcess`; its state's
    `global_model_weights` is `OrderedDict(model, accumulator=u,
    preconditioner=v)`, `get_hparams` gives `client_work=<learning_rate (gamma),
    lr_decay, alpha, beta_2, epsilon>` and `finalizer=<learning_rate (eta)>`.
  """
  check_hparams(learning_rate, alpha, beta_2, epsilon)
  return _common.build(
      _NAME, model_fn, client_learning_rate, learning_rate=learning_rate,
      client_hparams=collections.OrderedDict(alpha=alpha, beta_2=beta_2, epsilon=epsilon),
      initial_statistics=_common.zero_moments, local_rule=_local_rule, **client_options)
