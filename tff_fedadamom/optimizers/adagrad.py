"""FedAdagrad's server step: Adagrad with epsilon outside the root.

Reddi et al. ("Adaptive Federated Optimization", ICLR 2021) define FedAdagrad as

```
v = v + g**2
w = w - lr * g / (sqrt(v) + epsilon)          (their tau is epsilon)
```

and their code runs Keras' Adagrad, which divides the same way
(google-research/federated, `optimization/shared/optimizer_utils.py`); so does
the FedAdamom authors' code. TFF's `build_adagrad` divides by
`sqrt(v + epsilon)` instead: with v_0 = 0 its first step is g / sqrt(g**2 +
epsilon), and for small v it differs from the papers' by far more than rounding
(at v = epsilon = 1e-3 by a factor of about 1.4). This module follows the
sources and keeps TFF's state layout (`learning_rate`, `epsilon`,
`preconditioner`), so code that reads TFF's Adagrad state reads this one.
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import state as keys
from tff_fedadamom.optimizers.ranges import check_adagrad

NAME = 'FedAdagrad'  # In messages, tables and plots.


class AdagradOptimizer(tff.learning.optimizers.Optimizer):
  """The update of the module docstring; `initial_preconditioner` is v_0 (>= 0).
  An out-of-range argument raises ValueError (`ranges.check_adagrad`)."""

  def __init__(self, learning_rate, epsilon, initial_preconditioner: float = 0.0):
    check_adagrad(learning_rate, epsilon, initial_preconditioner)
    self._hparams = collections.OrderedDict([(keys.LEARNING_RATE_KEY, learning_rate),
                                             (keys.EPSILON_KEY, epsilon)])
    self._initial_v = initial_preconditioner

  @tf.autograph.experimental.do_not_convert
  def initialize(self, specs: Any) -> collections.OrderedDict:
    state = collections.OrderedDict(self._hparams)
    state[keys.PRECONDITIONER_KEY] = tf.nest.map_structure(
        lambda s: tf.fill(s.shape, tf.cast(self._initial_v, s.dtype)), specs)
    return state

  @tf.autograph.experimental.do_not_convert
  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    lr, epsilon = state[keys.LEARNING_RATE_KEY], state[keys.EPSILON_KEY]
    flat_w, flat_g = tf.nest.flatten(weights), tf.nest.flatten(gradients)
    flat_v = tf.nest.flatten(state[keys.PRECONDITIONER_KEY])
    new_w, new_v = list(flat_w), list(flat_v)
    for i, g in enumerate(flat_g):
      if g is None:  # no gradient: weights and slot unchanged
        continue
      new_v[i] = flat_v[i] + tf.math.square(g)
      new_w[i] = flat_w[i] - tf.cast(lr, g.dtype) * g / (
          tf.math.sqrt(new_v[i]) + tf.cast(epsilon, g.dtype))
    new_state = collections.OrderedDict((k, state[k]) for k in self._hparams)
    new_state[keys.PRECONDITIONER_KEY] = tf.nest.pack_sequence_as(
        state[keys.PRECONDITIONER_KEY], new_v)
    return new_state, tf.nest.pack_sequence_as(weights, new_w)

  def get_hparams(self, state) -> collections.OrderedDict:
    return keys.get_hparams(state, self._hparams)

  def set_hparams(self, state, hparams) -> collections.OrderedDict:
    return keys.set_hparams(NAME, state, hparams, self._hparams)


def build_fedadagrad(learning_rate, epsilon, initial_preconditioner: float = 0.0):
  """FedAdagrad's server optimizer (the module docstring's rule)."""
  return AdagradOptimizer(learning_rate, epsilon, initial_preconditioner)
