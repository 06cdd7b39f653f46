"""The Adam family on the server: FedAdam, FedYogi, FedAMSGrad and FADAS.

One `tff.learning.optimizers.Optimizer` (`AdaptiveOptimizer`) holds the update
the members share; they differ in the second-moment rule (Adam's, or Yogi's
additive `v = v - (1 - beta_2) * sign(v - g**2) * g**2`), AMSGrad or not
(divide by the running maximum `v_hat` of `v`), and bias correction or not.
FADAS adds a delay-adaptive learning rate (`delay_adaptive_learning_rate`).

With TFF's sign convention the optimizer receives the pseudo-gradient
`g = initial - trained = -Delta` and applies `w - lr * ...` (the papers'
`x + eta * ...` with `Delta`). One round t:

```
m     = beta_1 * m + (1 - beta_1) * g
v     = (Adam or Yogi rule above)
v_hat = max(v_hat, v)                              (AMSGrad only)
d     = v_hat if AMSGrad else v
lr_t  = lr                                         (FADAS: delay-adaptive)
without bias correction:  w = w - lr_t * m / (sqrt(d) + epsilon)
with bias correction:     w = w - lr_t / (1 - beta_1**t) * m
                                  / (sqrt(d) / sqrt(1 - beta_2**t) + epsilon)
```

`bias_correction` is a build-time switch (it adds a `step` to the state), on
by default as in each member's official code, whose form each builder names
(FedAMSGrad and FADAS: the second block above, `v_hat` the maximum of the
uncorrected `v`). Off is the first block: the FedAdamom authors' FedAdam and
FedYogi (Tenshawn/FedAdamom, `models/distributed_training_utils.py`).

The state (layout: `state.py`) holds the hparams, `step`, then the slots
`accumulator` (m), `preconditioner` (v), `max_preconditioner` (v_hat).
Gradients that are None leave their weights and slots unchanged. Every builder
(and FADAS') raises ValueError naming an out-of-range argument or a non-bool
`bias_correction`.
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import state as keys
from tff_fedadamom.optimizers.ranges import check_adaptive, check_bias_correction

# The members' names, in messages, tables and plots.
FEDADAM_NAME = 'FedAdam'
FEDYOGI_NAME = 'FedYogi'
FEDAMSGRAD_NAME = 'FedAMSGrad'

# FedAdam and FedYogi defaults: Reddi et al.'s `optimization/docs/hyperparameters.md`
# (Keras' betas, fixed in their experiments; tau 1e-3; Yogi's accumulator 0).
REDDI_BETA_1 = 0.9
REDDI_BETA_2 = 0.999
REDDI_EPSILON = 1e-3
REDDI_YOGI_INITIAL_PRECONDITIONER = 0.0
# FedAMSGrad defaults: jinghuichen/FedCAMS (`options.py`, the README's FedAMS
# command; v_hat_0 is its `max_init`).
FEDAMS_LEARNING_RATE = 1.0
FEDAMS_BETA_1 = 0.9
FEDAMS_BETA_2 = 0.99
FEDAMS_EPSILON = 0.0
FEDAMS_INITIAL_MAX_PRECONDITIONER = 1e-3


def delay_adaptive_learning_rate(learning_rate, max_delay, delay_threshold):
  """FADAS' server learning rate for a round whose largest staleness is `max_delay`.

  ```
  eta_t = eta              if tau_max <= tau_c
  eta_t = eta / tau_max    if tau_max >  tau_c
  ```

  The rule of the authors' code (yujiaw98/FADAS, `g_delay_adaptive.py`, which
  multiplies the global rate by `1 / max(delay)` when `max(delay) > tauc`);
  the paper's statement could not be read. `min(eta, 1 / tau_max)` would agree
  only for eta = 1. Synchronous rounds have `max_delay` 0: `eta_t = eta`.
  Works on Python numbers and on tensors (then in `learning_rate`'s dtype).
  """
  if not any(tf.is_tensor(x) for x in (learning_rate, max_delay, delay_threshold)):
    if max_delay <= delay_threshold:
      return learning_rate
    return learning_rate / max_delay
  lr = tf.convert_to_tensor(learning_rate)
  tau = tf.cast(max_delay, lr.dtype)
  late = tau > tf.cast(delay_threshold, lr.dtype)
  # Divide only where tau > tau_c >= 0; elsewhere by a harmless 1.
  return lr / tf.where(late, tau, tf.ones_like(tau))


class AdaptiveOptimizer(tff.learning.optimizers.Optimizer):
  """The Adam-family server optimizer of the module docstring; `name` is its
  name in error messages.

  `yogi` selects Yogi's second-moment rule, `amsgrad` the division by v_hat,
  whose initial value `initial_max_preconditioner` (None: `initial_preconditioner`)
  bounds the denominator away from 0 when above 0, so epsilon may then be 0.
  A `delay_threshold` (FADAS' tau_c) adds it and `max_delay` (0) to the state
  and makes the rate `delay_adaptive_learning_rate(lr, max_delay, delay_threshold)`.
  """

  def __init__(self, name: str, learning_rate, beta_1, beta_2, epsilon, *, yogi: bool = False,
               amsgrad: bool = False, bias_correction: bool = False,
               initial_preconditioner: float = 0.0, initial_max_preconditioner=None,
               delay_threshold=None):
    check_adaptive(name, learning_rate, beta_1, beta_2, epsilon, amsgrad=amsgrad,
                   bias_correction=bias_correction,
                   initial_preconditioner=initial_preconditioner,
                   initial_max_preconditioner=initial_max_preconditioner,
                   delay_threshold=delay_threshold)
    if initial_max_preconditioner is None:
      initial_max_preconditioner = initial_preconditioner
    self._name = name
    self._yogi = yogi
    self._amsgrad = amsgrad
    self._bias_correction = bias_correction
    self._initial_v = initial_preconditioner
    self._initial_v_hat = initial_max_preconditioner
    self._hparams = collections.OrderedDict([
        (keys.LEARNING_RATE_KEY, learning_rate), (keys.BETA_1_KEY, beta_1),
        (keys.BETA_2_KEY, beta_2), (keys.EPSILON_KEY, epsilon)])
    if delay_threshold is not None:
      self._hparams[keys.DELAY_THRESHOLD_KEY] = delay_threshold
      self._hparams[keys.MAX_DELAY_KEY] = 0.0  # Synchronous rounds.

  @property
  def _slots(self) -> tuple[str, ...]:
    slots = (keys.ACCUMULATOR_KEY, keys.PRECONDITIONER_KEY)
    return slots + ((keys.MAX_PRECONDITIONER_KEY,) if self._amsgrad else ())

  @tf.autograph.experimental.do_not_convert
  def initialize(self, specs: Any) -> collections.OrderedDict:
    zeros = lambda s: tf.zeros(s.shape, s.dtype)
    fill = lambda value: lambda s: tf.fill(s.shape, tf.cast(value, s.dtype))
    state = collections.OrderedDict(self._hparams)
    if self._bias_correction:
      state[keys.STEP_KEY] = 0
    state[keys.ACCUMULATOR_KEY] = tf.nest.map_structure(zeros, specs)
    state[keys.PRECONDITIONER_KEY] = tf.nest.map_structure(fill(self._initial_v), specs)
    if self._amsgrad:
      state[keys.MAX_PRECONDITIONER_KEY] = tf.nest.map_structure(
          fill(self._initial_v_hat), specs)
    return state

  @tf.autograph.experimental.do_not_convert
  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    beta_1, beta_2 = state[keys.BETA_1_KEY], state[keys.BETA_2_KEY]
    epsilon = state[keys.EPSILON_KEY]
    lr = state[keys.LEARNING_RATE_KEY]
    if keys.MAX_DELAY_KEY in state:
      lr = delay_adaptive_learning_rate(
          lr, state[keys.MAX_DELAY_KEY], state[keys.DELAY_THRESHOLD_KEY])
    new_state = collections.OrderedDict((k, state[k]) for k in self._hparams)
    root_scale = 1.0  # Multiplies sqrt(d) in the denominator.
    if self._bias_correction:
      # The authors' form of the module docstring: epsilon outside the corrected root.
      step = state[keys.STEP_KEY] + 1
      t = tf.cast(step, tf.float32)
      lr = tf.cast(lr, tf.float32) / (1.0 - tf.math.pow(tf.cast(beta_1, tf.float32), t))
      root_scale = tf.math.rsqrt(1.0 - tf.math.pow(tf.cast(beta_2, tf.float32), t))
      new_state[keys.STEP_KEY] = step

    flat_w = tf.nest.flatten(weights)
    flat_g = tf.nest.flatten(gradients)  # Keeps None leaves: lists stay aligned.
    slots = {s: tf.nest.flatten(state[s]) for s in self._slots}
    if any(len(v) != len(flat_w) for v in slots.values()):
      raise ValueError(
          f'{self._name} state does not match the weights: {len(flat_w)}'
          ' weights, slots of '
          + ', '.join(f'{len(v)} ({s})' for s, v in slots.items()) + '.')
    new_w = list(flat_w)
    new_slots = {s: list(v) for s, v in slots.items()}
    for i, g in enumerate(flat_g):
      if g is None:
        continue
      dtype = g.dtype
      b1, b2 = tf.cast(beta_1, dtype), tf.cast(beta_2, dtype)
      m = b1 * slots[keys.ACCUMULATOR_KEY][i] + (1.0 - b1) * g
      v = slots[keys.PRECONDITIONER_KEY][i]
      g2 = tf.math.square(g)
      if self._yogi:  # v moves towards g**2 by (1 - beta_2) * g**2.
        v = v - (1.0 - b2) * tf.math.sign(v - g2) * g2
      else:
        v = b2 * v + (1.0 - b2) * g2
      d = v
      if self._amsgrad:
        d = tf.math.maximum(slots[keys.MAX_PRECONDITIONER_KEY][i], v)
        new_slots[keys.MAX_PRECONDITIONER_KEY][i] = d
      new_slots[keys.ACCUMULATOR_KEY][i] = m
      new_slots[keys.PRECONDITIONER_KEY][i] = v
      new_w[i] = flat_w[i] - tf.cast(lr, dtype) * m / (
          tf.cast(root_scale, dtype) * tf.math.sqrt(d) + tf.cast(epsilon, dtype))

    for s in self._slots:
      new_state[s] = tf.nest.pack_sequence_as(state[s], new_slots[s])
    return new_state, tf.nest.pack_sequence_as(weights, new_w)

  def get_hparams(self, state) -> collections.OrderedDict:
    return keys.get_hparams(state, self._hparams)

  def set_hparams(self, state, hparams) -> collections.OrderedDict:
    return keys.set_hparams(self._name, state, hparams, self._hparams)


def build_fedadam(learning_rate, beta_1=REDDI_BETA_1, beta_2=REDDI_BETA_2,
                  epsilon=REDDI_EPSILON,
                  bias_correction: bool = True) -> tff.learning.optimizers.Optimizer:
  """FedAdam: `w = w - lr * c_t * m / (sqrt(v) + epsilon)`, Adam's m and v (v_0 = 0).

  `bias_correction=True` (the default) is TFF's `build_adam`, with
  `c_t = sqrt(1 - beta_2**t) / (1 - beta_1**t)`: the Keras Adam of Reddi et al.'s
  experiments. `bias_correction=False` has `c_t = 1` and no `step` in the state:
  the FedAdamom authors' FedAdam. For beta_1 = 0.9, beta_2 = 0.999, c_t stays
  below 1/3 for the first hundred rounds: the corrected optimizer steps shorter.
  """
  if check_bias_correction(bias_correction):
    return tff.learning.optimizers.build_adam(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon)
  return AdaptiveOptimizer(FEDADAM_NAME, learning_rate, beta_1, beta_2, epsilon)


def build_fedyogi(learning_rate, beta_1=REDDI_BETA_1, beta_2=REDDI_BETA_2,
                  epsilon=REDDI_EPSILON,
                  initial_preconditioner=REDDI_YOGI_INITIAL_PRECONDITIONER,
                  bias_correction: bool = True) -> tff.learning.optimizers.Optimizer:
  """FedYogi: FedAdam with Yogi's `v = v - (1 - beta_2) * sign(v - g**2) * g**2`.

  `bias_correction=True` (the default) is TFF's `build_yogi` (the form of Reddi
  et al.'s `utils/optimizers/yogi.py`); False: `c_t = 1`, the FedAdamom authors'
  FedYogi. `v_0 = initial_preconditioner`, 0 by default as in Reddi et al.'s
  runs and the FedAdamom code (TFF's own default is 1e-6).
  """
  if check_bias_correction(bias_correction):
    return tff.learning.optimizers.build_yogi(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, initial_preconditioner_value=initial_preconditioner)
  return AdaptiveOptimizer(FEDYOGI_NAME, learning_rate, beta_1, beta_2, epsilon,
                           yogi=True, initial_preconditioner=initial_preconditioner)


def build_fedamsgrad(learning_rate=FEDAMS_LEARNING_RATE, beta_1=FEDAMS_BETA_1,
                     beta_2=FEDAMS_BETA_2, epsilon=FEDAMS_EPSILON,
                     initial_max_preconditioner=FEDAMS_INITIAL_MAX_PRECONDITIONER,
                     bias_correction: bool = True) -> tff.learning.optimizers.Optimizer:
  """FedAMSGrad: AMSGrad on the server (FedAMS; synchronous FADAS), the module
  docstring's rule with Adam's v (v_0 = 0) and v_hat_0 = `initial_max_preconditioner`.

  AMSGrad (Reddi, Kale, Kumar, ICLR 2018) divides by the running maximum of
  `v`, so no coordinate's step size ever grows; FedAMS (Wang, Lin and Chen,
  ICML 2022) runs it on the server. Rule and defaults follow the FedAMS
  authors' code (jinghuichen/FedCAMS, `update.py`, optimizer `fedams`): epsilon
  outside the root, and the "max stabilization" `eps = 0`, `v_hat_0 = 1e-3`,
  which keeps the denominator at least `sqrt(1e-3)`.
  """
  return AdaptiveOptimizer(FEDAMSGRAD_NAME, learning_rate, beta_1, beta_2, epsilon,
                           amsgrad=True, bias_correction=bias_correction,
                           initial_max_preconditioner=initial_max_preconditioner)
