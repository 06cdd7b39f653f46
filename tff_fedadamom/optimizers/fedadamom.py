"""FedAdamom: adaptive momentum as a `tff.learning.optimizers.Optimizer`.

FedAdamom keeps Adam's second moment `v` but, instead of dividing the step by
`sqrt(v)`, uses `v` to choose a per-coordinate momentum coefficient. Coordinates
whose squared update is small relative to the model-wide average keep a long
momentum memory; coordinates with large, noisy updates forget quickly. The step
itself is never rescaled, which is what lets the optimizer keep SGD's preference
for flat minima (see the paper's diffusion analysis).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import state as state_keys

NAME = 'FedAdamom'  # In messages, tables and plots.
LEARNING_RATE_KEY = state_keys.LEARNING_RATE_KEY
BETA_2_KEY = state_keys.BETA_2_KEY
EPSILON_KEY = state_keys.EPSILON_KEY
ACCUMULATOR_KEY = state_keys.ACCUMULATOR_KEY  # m, the momentum.
PRECONDITIONER_KEY = state_keys.PRECONDITIONER_KEY  # v, the second moment.
HPARAMS_KEYS = (LEARNING_RATE_KEY, BETA_2_KEY, EPSILON_KEY)
# Every key of the state, in its order (TFF checks the order between rounds).
STATE_KEYS = HPARAMS_KEYS + (ACCUMULATOR_KEY, PRECONDITIONER_KEY)

DEFAULT_LEARNING_RATE = 1.0
# The paper's beta_2 ablation (Dir(0.3) CIFAR-10) peaks at 0.05.
DEFAULT_BETA_2 = 0.05
# The clip margin of the reference code.
DEFAULT_EPSILON = 1e-3


def check_hparams(learning_rate, beta_2, epsilon) -> None:
  """Raises ValueError naming the first out-of-range argument (concrete values only)."""
  check = state_keys.check_range
  check(NAME, 'learning_rate', learning_rate, lambda x: x >= 0.0, 'nonnegative')
  check(NAME, 'beta_2', beta_2, lambda x: 0.0 <= x <= 1.0, 'in [0.0, 1.0]')
  check(NAME, 'epsilon', epsilon, lambda x: 0.0 < x <= 1.0, 'in (0.0, 1.0]')


def _mean_of_all(tensors, dtype: tf.DType) -> tf.Tensor:
  """The mean over every element of every tensor in `tensors`, as one scalar."""
  if not tensors:
    return tf.zeros([], dtype)
  total = tf.add_n([tf.reduce_sum(tf.cast(t, dtype)) for t in tensors])
  count = tf.add_n([tf.cast(tf.size(t), dtype) for t in tensors])
  return tf.math.divide_no_nan(total, count)


def momentum_coefficient(v: tf.Tensor, vbar: tf.Tensor, epsilon) -> tf.Tensor:
  """beta1_t = clip(1 - v / vbar, 0, 1 - epsilon), computed in vbar's dtype.

  When vbar is 0 every v is 0, i.e. all coordinates are equal; v / vbar is then
  taken as 1, the value it has whenever all v are equal, so beta1_t = 0 and the
  update reduces to SGD instead of producing 0 / 0. The case is decided on the
  scalar: `1 - v / vbar = offset - v * inv_vbar` with (offset, inv_vbar) equal to
  (1, 1 / vbar), or (0, 0) when vbar is 0.
  """
  dtype = vbar.dtype
  positive = vbar > 0
  inv_vbar = tf.where(positive, 1.0 / tf.where(positive, vbar, 1.0), 0.0)
  offset = tf.cast(positive, dtype)
  upper = 1.0 - tf.cast(epsilon, dtype)
  return tf.clip_by_value(offset - tf.cast(v, dtype) * inv_vbar, 0.0, upper)


def momentum_coefficient_numpy(v_flat: np.ndarray, epsilon) -> np.ndarray:
  """`momentum_coefficient` in numpy over `v_flat`, every trainable leaf of the
  second moment concatenated, for telemetry (no TensorFlow op per round).

  `vbar` is held in float32 (float64 for float64 `v_flat`), summed in float64,
  so it is within a rounding of the optimizer's. FedAdamom stores the `v` of its
  last step, so on a state read after a round this is that round's beta1_t.
  """
  dtype = np.float64 if v_flat.dtype == np.float64 else np.float32
  v = v_flat.astype(dtype, copy=False)
  vbar = dtype(np.sum(v, dtype=np.float64) / v.size) if v.size else dtype(0)
  if vbar > 0:
    offset, inv_vbar = dtype(1), dtype(1) / vbar
  else:
    offset, inv_vbar = dtype(0), dtype(0)
  upper = dtype(1) - dtype(epsilon)
  out = v * inv_vbar
  np.subtract(offset, out, out=out)
  return np.clip(out, dtype(0), upper, out=out)


@tf.function(jit_compile=True)
def _fedadamom_steps(momenta, moments, grads, lr, beta_2, epsilon):
  """Returns (lr * m, m, v) for aligned lists of leaves (no None gradients).

  Compiled with XLA so that each pass over a tensor is one fused loop: the
  second-moment update and its partial sum, then the momentum coefficient, the
  momentum and the step. Unfused, the same math makes about twice as many trips
  through memory, and the update is memory-bound.

  The subtraction `w - step` is left to the caller, outside XLA: XLA contracts
  `w - lr * m` into a fused multiply-add, which rounds once where TensorFlow's
  ops round twice, and FedAdamom with epsilon = 1 must equal TFF's SGD exactly.
  """
  new_v = []
  for v, g in zip(moments, grads):
    b2 = tf.cast(beta_2, v.dtype)
    new_v.append(b2 * v + (1.0 - b2) * tf.math.square(g))
  # vbar: ONE scalar, the mean over every element of every leaf, in float64 when
  # any leaf is float64, else float32 (never reduced in bf16/fp16).
  dtype = tf.float64 if any(v.dtype == tf.float64 for v in new_v) else tf.float32
  vbar = _mean_of_all(new_v, dtype)
  new_m, steps = [], []
  for m, v, g in zip(momenta, new_v, grads):
    beta_1 = tf.cast(momentum_coefficient(v, vbar, epsilon), m.dtype)
    # beta_1 * m + (1 - beta_1) * g, written so that beta_1 = 0 gives g exactly.
    m = g + beta_1 * (m - g)
    new_m.append(m)
    steps.append(tf.cast(lr, m.dtype) * m)
  return steps, new_m, new_v


class _FedAdamom(tff.learning.optimizers.Optimizer):
  """FedAdamom server optimizer, see `build_fedadamom` for details."""

  def __init__(self, learning_rate=DEFAULT_LEARNING_RATE, beta_2=DEFAULT_BETA_2,
               epsilon=DEFAULT_EPSILON):
    check_hparams(learning_rate, beta_2, epsilon)
    self._lr = learning_rate
    self._beta_2 = beta_2
    self._epsilon = epsilon

  # Not converted by autograph: no tensor-dependent control flow, and
  # converting it is a large part of a learning process's build.
  @tf.autograph.experimental.do_not_convert
  def initialize(self, specs: Any) -> collections.OrderedDict:
    zeros = lambda s: tf.zeros(s.shape, s.dtype)
    return collections.OrderedDict([
        (LEARNING_RATE_KEY, self._lr),
        (BETA_2_KEY, self._beta_2),
        (EPSILON_KEY, self._epsilon),
        (ACCUMULATOR_KEY, tf.nest.map_structure(zeros, specs)),
        (PRECONDITIONER_KEY, tf.nest.map_structure(zeros, specs)),
    ])

  @tf.autograph.experimental.do_not_convert
  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    lr, beta_2, epsilon = state[LEARNING_RATE_KEY], state[BETA_2_KEY], state[EPSILON_KEY]
    flat_w = tf.nest.flatten(weights)
    flat_m = tf.nest.flatten(state[ACCUMULATOR_KEY])
    flat_v = tf.nest.flatten(state[PRECONDITIONER_KEY])
    # `flatten` keeps None leaves, so the four lists stay aligned.
    flat_g = tf.nest.flatten(gradients)
    if not len(flat_w) == len(flat_m) == len(flat_v) == len(flat_g):
      raise ValueError(
          f'{NAME} state does not match the weights: {len(flat_w)} weights, {len(flat_g)} '
          f'gradients, {len(flat_m)} momentum and {len(flat_v)} second-moment tensors.')
    active = [i for i, g in enumerate(flat_g) if g is not None]
    new_w, new_m, new_v = list(flat_w), list(flat_m), list(flat_v)
    if active:
      steps, momenta, moments = _fedadamom_steps(
          [flat_m[i] for i in active], [flat_v[i] for i in active],
          [flat_g[i] for i in active], lr, beta_2, epsilon)
      for i, step, m, v in zip(active, steps, momenta, moments):
        new_w[i], new_m[i], new_v[i] = flat_w[i] - step, m, v
    updated_state = collections.OrderedDict([
        (LEARNING_RATE_KEY, lr), (BETA_2_KEY, beta_2), (EPSILON_KEY, epsilon),
        (ACCUMULATOR_KEY, tf.nest.pack_sequence_as(state[ACCUMULATOR_KEY], new_m)),
        (PRECONDITIONER_KEY, tf.nest.pack_sequence_as(state[PRECONDITIONER_KEY], new_v))])
    return updated_state, tf.nest.pack_sequence_as(weights, new_w)

  def get_hparams(self, state) -> collections.OrderedDict:
    return state_keys.get_hparams(state, HPARAMS_KEYS)

  def set_hparams(self, state, hparams) -> collections.OrderedDict:
    return state_keys.set_hparams(NAME, state, hparams, HPARAMS_KEYS)


def build_fedadamom(learning_rate=DEFAULT_LEARNING_RATE, beta_2=DEFAULT_BETA_2,
                    epsilon=DEFAULT_EPSILON) -> tff.learning.optimizers.Optimizer:
  """Returns a `tff.learning.optimizers.Optimizer` for FedAdamom.

  FedAdamom is the server optimizer of "FedAdamom: Adaptive Momentum for
  Improved Generalization in Federated Optimization" (CVPR 2026).

  With TFF's sign convention the optimizer receives the pseudo-gradient
  `g = initial - trained = -Delta`. Given learning rate `lr`, second-moment decay
  `beta_2`, clip margin `eps`, momentum `m` and second moment `v` (both starting
  at zero, no bias correction):

  ```
  v      = beta_2 * v + (1 - beta_2) * g**2              # elementwise
  vbar   = mean(v) over all elements of all tensors       # ONE scalar
  beta_1 = clip(1 - v / vbar, 0, 1 - eps)                 # elementwise
  m      = beta_1 * m + (1 - beta_1) * g
  w      = w - lr * m                                     # no division by sqrt(v)
  ```

  Weights whose gradient is `None` keep their weights and slots and do not
  enter `vbar`. `vbar` is reduced in float32 (float64 if any leaf is float64).
  When every `v` is zero (`vbar == 0`) we take `v / vbar = 1` (its value whenever
  all `v` are equal), so `beta_1 = 0` and the step is plain SGD rather than NaN.
  With `eps = 1` the clip forces `beta_1 = 0` and FedAdamom is exactly SGD with
  learning rate `lr`.

  Args:
    learning_rate: Nonnegative server learning rate (eta). The paper uses 1.0.
    beta_2: Decay of the second moment, in [0, 1]. Defaults to 0.05, the best
      value of the paper's beta_2 ablation (0.01-0.3); its run commands use 0.1.
    epsilon: Clip margin in (0, 1]: beta_1 never exceeds 1 - epsilon. It is not
      a denominator term. Defaults to the reference code's 1e-3.

  Raises:
    ValueError: If an argument is out of range (named in the message).
  """
  return _FedAdamom(learning_rate, beta_2, epsilon)
