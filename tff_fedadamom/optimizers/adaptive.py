"""The Adam family on the server: FedAdam, FedYogi, FedAMSGrad and FADAS.

One `tff.learning.optimizers.Optimizer` (`AdaptiveOptimizer`) holds the update
every member shares; the members differ in three build-time choices:

- the second-moment rule: Adam's `v = beta_2 * v + (1 - beta_2) * g**2`, or
  Yogi's additive `v = v - (1 - beta_2) * sign(v - g**2) * g**2`;
- AMSGrad or not: divide by `v_hat = max(v_hat, v)`, the running maximum of
  `v`, instead of by `v`;
- bias correction or not (see below).

FADAS adds a delay-adaptive learning rate (`delay_adaptive_learning_rate`).

With TFF's sign convention the optimizer receives the pseudo-gradient
`g = initial - trained = -Delta` and applies `w - lr * ...`; the papers write
`x + eta * ...` with `Delta`, which is the same update. One round:

```
m     = beta_1 * m + (1 - beta_1) * g
v     = (Adam or Yogi rule above)
v_hat = max(v_hat, v)                              (AMSGrad only)
d     = v_hat if AMSGrad else v
lr_t  = lr                                         (FADAS: delay-adaptive)
lr_t  = lr_t * sqrt(1 - beta_2**t) / (1 - beta_1**t)   (bias correction only)
w     = w - lr_t * m / (sqrt(d) + epsilon)
```

Bias correction. Reddi et al., "Adaptive Federated Optimization" (ICLR 2021),
Algorithm 2 (FedAdagrad, FedYogi, FedAdam) does not correct the moments'
bias; TFF's `build_adam`/`build_yogi` do, in the form above (the learning rate
is rescaled, epsilon is not). `bias_correction` is a build-time Python flag,
not a state hparam: it decides whether the state has a `step` counter (a
different state structure), and `bias_correction=True` for FedAdam/FedYogi
is TFF's own optimizer, the state and behaviour this project always had.

Every member's state is a flat OrderedDict of tensors, learning rate first
(under `LEARNING_RATE_KEY`, so `schedule_learning_rate` works), then the
hparams, then `step` (bias correction only), then the slots `accumulator`
(m), `preconditioner` (v) and `max_preconditioner` (v_hat, AMSGrad only).
Gradients that are None leave their weights and slots unchanged.
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import state as keys

ADAM = 'adam'
YOGI = 'yogi'

# The members' names, in messages, tables and plots.
FEDADAM_NAME = 'FedAdam'
FEDYOGI_NAME = 'FedYogi'
FEDAMSGRAD_NAME = 'FedAMSGrad'


def check_bias_correction(bias_correction) -> bool:
  """`bias_correction` as a Python bool; ValueError naming it otherwise."""
  if not isinstance(bias_correction, bool):
    raise ValueError(
        '`bias_correction` must be true or false (a bool), found'
        f' {bias_correction!r}.'
    )
  return bias_correction


def delay_adaptive_learning_rate(learning_rate, max_delay, delay_threshold):
  """FADAS' server learning rate for a round whose largest staleness is `max_delay`.

  ```
  eta_t = eta                      if tau_max <= tau_c
  eta_t = min(eta, 1 / tau_max)    if tau_max >  tau_c
  ```

  With synchronous rounds `max_delay` is 0 and `eta_t = eta`. Works on Python
  numbers and on tensors (then in `learning_rate`'s dtype).
  """
  if not any(tf.is_tensor(x) for x in (learning_rate, max_delay, delay_threshold)):
    if max_delay <= delay_threshold:
      return learning_rate
    return min(learning_rate, 1.0 / max_delay)
  lr = tf.convert_to_tensor(learning_rate)
  tau = tf.cast(max_delay, lr.dtype)
  late = tau > tf.cast(delay_threshold, lr.dtype)
  # 1 / tau only where tau > tau_c >= 0; elsewhere a harmless 1.
  inv_tau = 1.0 / tf.where(late, tau, tf.ones_like(tau))
  return tf.where(late, tf.minimum(lr, inv_tau), lr)


class AdaptiveOptimizer(tff.learning.optimizers.Optimizer):
  """The Adam-family server optimizer; see the module docstring.

  Args:
    name: The optimizer's name in error messages ('FedAdam', 'FADAS', ...).
    learning_rate, beta_1, beta_2, epsilon: The shared hparams (state).
    rule: `ADAM` or `YOGI`, the second-moment update.
    amsgrad: Divide by the running maximum of `v` (slot `max_preconditioner`).
    bias_correction: Python bool; True adds a `step` to the state.
    initial_preconditioner: The initial `v` (and `v_hat`), >= 0.
    delay_threshold: None, or FADAS' tau_c: the state then also holds
      `delay_threshold` and `max_delay` (0), and the learning rate is
      `delay_adaptive_learning_rate(lr, max_delay, delay_threshold)`.
  """

  def __init__(
      self,
      name: str,
      learning_rate,
      beta_1,
      beta_2,
      epsilon,
      *,
      rule: str = ADAM,
      amsgrad: bool = False,
      bias_correction: bool = False,
      initial_preconditioner: float = 0.0,
      delay_threshold=None,
  ):
    check = keys.check_range
    check(name, 'learning_rate', learning_rate, lambda x: x >= 0.0, 'nonnegative')
    check(name, 'beta_1', beta_1, lambda x: 0.0 <= x <= 1.0, 'in [0.0, 1.0]')
    check(name, 'beta_2', beta_2, lambda x: 0.0 <= x <= 1.0, 'in [0.0, 1.0]')
    # epsilon > 0: with v = 0 (a zero first update) the step would be 0 / 0.
    check(name, 'epsilon', epsilon, lambda x: x > 0.0, 'positive')
    check(name, 'initial_preconditioner', initial_preconditioner,
          lambda x: x >= 0.0, 'nonnegative')
    if delay_threshold is not None:
      check(name, 'delay_threshold', delay_threshold, lambda x: x >= 0.0,
            'nonnegative')
    if rule not in (ADAM, YOGI):
      raise ValueError(f'`rule` must be {ADAM!r} or {YOGI!r}, found {rule!r}.')
    self._name = name
    self._rule = rule
    self._amsgrad = amsgrad
    self._bias_correction = check_bias_correction(bias_correction)
    self._initial_v = initial_preconditioner
    self._hparams = collections.OrderedDict([
        (keys.LEARNING_RATE_KEY, learning_rate),
        (keys.BETA_1_KEY, beta_1),
        (keys.BETA_2_KEY, beta_2),
        (keys.EPSILON_KEY, epsilon),
    ])
    if delay_threshold is not None:
      self._hparams[keys.DELAY_THRESHOLD_KEY] = delay_threshold
      self._hparams[keys.MAX_DELAY_KEY] = 0.0  # Synchronous rounds.

  @property
  def _slots(self) -> tuple[str, ...]:
    slots = (keys.ACCUMULATOR_KEY, keys.PRECONDITIONER_KEY)
    return slots + ((keys.MAX_PRECONDITIONER_KEY,) if self._amsgrad else ())

  def initialize(self, specs: Any) -> collections.OrderedDict:
    zeros = lambda s: tf.zeros(s.shape, s.dtype)
    initial_v = lambda s: tf.fill(s.shape, tf.cast(self._initial_v, s.dtype))
    state = collections.OrderedDict(self._hparams)
    if self._bias_correction:
      state[keys.STEP_KEY] = 0
    state[keys.ACCUMULATOR_KEY] = tf.nest.map_structure(zeros, specs)
    state[keys.PRECONDITIONER_KEY] = tf.nest.map_structure(initial_v, specs)
    if self._amsgrad:
      # AMSGrad's v_hat starts where v does (0 for Adam): max(v_hat_0, v_1) = v_1.
      state[keys.MAX_PRECONDITIONER_KEY] = tf.nest.map_structure(initial_v, specs)
    return state

  def _learning_rate(self, state):
    """The round's learning rate before bias correction."""
    lr = state[keys.LEARNING_RATE_KEY]
    if keys.MAX_DELAY_KEY in state:
      lr = delay_adaptive_learning_rate(
          lr, state[keys.MAX_DELAY_KEY], state[keys.DELAY_THRESHOLD_KEY])
    return lr

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients
    )
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    beta_1 = state[keys.BETA_1_KEY]
    beta_2 = state[keys.BETA_2_KEY]
    epsilon = state[keys.EPSILON_KEY]
    lr = self._learning_rate(state)
    new_state = collections.OrderedDict(
        (k, state[k]) for k in self._hparams)
    if self._bias_correction:
      step = state[keys.STEP_KEY] + 1
      t = tf.cast(step, tf.float32)
      lr = (tf.cast(lr, tf.float32)
            * tf.math.sqrt(1.0 - tf.math.pow(tf.cast(beta_2, tf.float32), t))
            / (1.0 - tf.math.pow(tf.cast(beta_1, tf.float32), t)))
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
      if self._rule == ADAM:
        v = b2 * v + (1.0 - b2) * g2
      else:  # Yogi: v moves towards g**2 by (1 - beta_2) * g**2.
        v = v - (1.0 - b2) * tf.math.sign(v - g2) * g2
      d = v
      if self._amsgrad:
        d = tf.math.maximum(slots[keys.MAX_PRECONDITIONER_KEY][i], v)
        new_slots[keys.MAX_PRECONDITIONER_KEY][i] = d
      new_slots[keys.ACCUMULATOR_KEY][i] = m
      new_slots[keys.PRECONDITIONER_KEY][i] = v
      new_w[i] = flat_w[i] - tf.cast(lr, dtype) * m / (
          tf.math.sqrt(d) + tf.cast(epsilon, dtype))

    for s in self._slots:
      new_state[s] = tf.nest.pack_sequence_as(state[s], new_slots[s])
    return new_state, tf.nest.pack_sequence_as(weights, new_w)

  def get_hparams(self, state) -> collections.OrderedDict:
    return keys.get_hparams(state, self._hparams)

  def set_hparams(self, state, hparams) -> collections.OrderedDict:
    return keys.set_hparams(self._name, state, hparams, self._hparams)


def build_fedadam(
    learning_rate,
    beta_1=0.9,
    beta_2=0.99,
    epsilon=1e-3,
    bias_correction: bool = True,
) -> tff.learning.optimizers.Optimizer:
  """FedAdam: Adam on the server, with or without bias correction.

  `bias_correction=True` (the default) is TFF's `build_adam`:

  ```
  m = beta_1 * m + (1 - beta_1) * g;   v = beta_2 * v + (1 - beta_2) * g**2
  w = w - lr * sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (sqrt(v) + epsilon)
  ```

  `bias_correction=False` is FedAdam of Reddi et al. (ICLR 2021), Algorithm 2:
  the same without the factor `sqrt(1 - beta_2**t) / (1 - beta_1**t)`; its
  state has no `step`. With the same hparams the two take different early
  steps: for beta_1 = 0.9, beta_2 = 0.99 the correction factor is 1 at t = 1,
  0.742 at t = 2, 0.475 at t = 10, 0.796 at t = 100 and tends to 1, so the
  corrected optimizer steps about half as far in rounds 5-30. Open in the
  paper and fixed here: `v` starts at 0 (the paper asks `v_{-1} >= tau**2`; the
  `epsilon` (tau) in the denominator already keeps the step finite), and
  epsilon must be positive. Defaults: the paper's beta_1 = 0.9,
  beta_2 = 0.99, tau = 1e-3.

  Raises:
    ValueError: naming an out-of-range argument or a non-bool `bias_correction`.
  """
  if check_bias_correction(bias_correction):
    return tff.learning.optimizers.build_adam(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon)
  return AdaptiveOptimizer(FEDADAM_NAME, learning_rate, beta_1, beta_2, epsilon)


def build_fedyogi(
    learning_rate,
    beta_1=0.9,
    beta_2=0.99,
    epsilon=1e-3,
    initial_preconditioner=1e-6,
    bias_correction: bool = True,
) -> tff.learning.optimizers.Optimizer:
  """FedYogi: Yogi on the server, with or without bias correction.

  ```
  m = beta_1 * m + (1 - beta_1) * g
  v = v - (1 - beta_2) * sign(v - g**2) * g**2        v_0 = initial_preconditioner
  w = w - lr_t * m / (sqrt(v) + epsilon)
  ```

  `bias_correction=True` (the default) is TFF's `build_yogi`, with
  `lr_t = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)`. `bias_correction=False`
  is FedYogi of Reddi et al. (ICLR 2021), Algorithm 2, with `lr_t = lr` and no
  `step` in the state. The paper's `v_{-1} >= tau**2` is met by the default
  `initial_preconditioner = 1e-6 = tau**2` for tau = 1e-3 (TFF's default too).

  Raises:
    ValueError: naming an out-of-range argument or a non-bool `bias_correction`.
  """
  if check_bias_correction(bias_correction):
    return tff.learning.optimizers.build_yogi(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, initial_preconditioner_value=initial_preconditioner)
  return AdaptiveOptimizer(FEDYOGI_NAME, learning_rate, beta_1, beta_2, epsilon,
                   rule=YOGI, initial_preconditioner=initial_preconditioner)


def build_fedamsgrad(
    learning_rate=0.01,
    beta_1=0.9,
    beta_2=0.99,
    epsilon=1e-3,
    bias_correction: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """FedAMSGrad: AMSGrad on the server (synchronous FADAS, without delays).

  ```
  m     = beta_1 * m + (1 - beta_1) * g
  v     = beta_2 * v + (1 - beta_2) * g**2
  v_hat = max(v_hat, v)                       (elementwise, v_hat_0 = 0)
  w     = w - lr * m / (sqrt(v_hat) + epsilon)
  ```

  AMSGrad (Reddi, Kale, Kumar, "On the Convergence of Adam and Beyond", ICLR
  2018) divides by the running maximum of `v`, so no coordinate's step size
  ever grows. Its server form is the synchronous case of FADAS (Wang et al.,
  ICML 2024; see `build_fadas`) and the FedAMSGrad baseline of Wang, Lin and
  Chen, "Communication-Efficient Adaptive Federated Learning" (ICML 2022).
  Conventions here are Reddi et al.'s "Adaptive Federated Optimization"
  (ICLR 2021), as for `fedadam`: no bias correction by default, epsilon (their
  tau) added to `sqrt(v_hat)` outside the root, defaults beta_1 = 0.9,
  beta_2 = 0.99, tau = 1e-3. `bias_correction=True` multiplies `lr` by
  `sqrt(1 - beta_2**t) / (1 - beta_1**t)` (TFF's form; `v_hat` is the maximum
  of the uncorrected `v`, as in Keras' and PyTorch's AMSGrad).

  The state adds `max_preconditioner` (v_hat) to Adam's slots.

  Raises:
    ValueError: naming an out-of-range argument or a non-bool `bias_correction`.
  """
  return AdaptiveOptimizer(FEDAMSGRAD_NAME, learning_rate, beta_1, beta_2, epsilon,
                   amsgrad=True, bias_correction=bias_correction)
