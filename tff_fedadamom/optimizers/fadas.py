"""FADAS: AMSGrad on the server with a delay-adaptive server learning rate.

Wang, Wang, Lu and Chen, "FADAS: Towards Federated Adaptive Asynchronous
Optimization", ICML 2024 (PMLR 235; arXiv:2407.18365); the authors' code is
github.com/yujiaw98/FADAS.
"""

from __future__ import annotations

import tensorflow_federated as tff

from tff_fedadamom.optimizers import adaptive

# The authors' code (yujiaw98/FADAS: `options.py`; README run commands, CIFAR-10
# ResNet): beta_1 0.9, beta_2 0.99, eps 1e-8, tau_c 1, max_init 0, global lr
# 1e-3 with the delay-adaptive rate (1e-4 without it), chosen with the bias
# correction of `update.py` on.
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_BETA_1 = 0.9
DEFAULT_BETA_2 = 0.99
NAME = 'FADAS'  # In messages, tables and plots.
DEFAULT_EPSILON = 1e-8
DEFAULT_DELAY_THRESHOLD = 1.0


def build_fadas(
    learning_rate=DEFAULT_LEARNING_RATE,
    beta_1=DEFAULT_BETA_1,
    beta_2=DEFAULT_BETA_2,
    epsilon=DEFAULT_EPSILON,
    delay_threshold=DEFAULT_DELAY_THRESHOLD,
    bias_correction: bool = True,
) -> tff.learning.optimizers.Optimizer:
  """Returns FADAS' server optimizer as a `tff.learning.optimizers.Optimizer`.

  FADAS' server buffers M client updates (each computed from a possibly stale
  model), averages them into the pseudo-gradient and takes one AMSGrad step
  whose learning rate shrinks when the buffered updates are too stale. With
  TFF's sign convention (`g = -Delta`, the optimizer applies `w - ...`), in
  server round t:

  ```
  m     = beta_1 * m + (1 - beta_1) * g
  v     = beta_2 * v + (1 - beta_2) * g**2
  v_hat = max(v_hat, v)                               (elementwise, v_hat_0 = 0)
  eta_t = eta                    if tau_max <= tau_c   (delay-adaptive rate)
        = eta / tau_max          if tau_max >  tau_c
  w     = w - eta_t / (1 - beta_1**t) * m / (sqrt(v_hat / (1 - beta_2**t)) + epsilon)
  ```

  `tau_max` is the largest staleness (in server rounds) among the round's
  buffered updates and `tau_c` the delay threshold. The state carries both as
  hparams: `delay_threshold` (tau_c) and `max_delay` (tau_max, 0 after
  `initialize`), so an asynchronous driver sets the round's staleness with
  `set_hparams(state, {'max_delay': tau})` before `next`; the rule is
  `adaptive.delay_adaptive_learning_rate`.

  Synchronous only. This project's pipeline runs synchronous rounds
  (`tff.learning.algorithms.build_weighted_fed_avg`: every sampled client
  starts from the current model and the server waits for all of them), so
  every update has staleness 0, `max_delay` stays 0, `eta_t = eta`, and FADAS
  is FedAMSGrad's rule (`adaptive.build_fedamsgrad`) with FADAS' defaults
  (v_hat_0 = 0, epsilon 1e-8). The buffered asynchronous mode (clients
  training on stale models, a buffer of M updates) is NOT offered: it needs a
  different learning process, not a server optimizer.

  Source. Only the paper's abstract could be read, so the rule above is the
  authors' code (yujiaw98/FADAS): `update.py`, optimizer `fedams`, for the
  step, and `g_delay_adaptive.py` for the rate. In particular:

  - Bias correction: on by default, as the code always corrects (and its
    eta = 1e-3 was chosen so); epsilon is added after `sqrt(v_hat)` is divided
    by `sqrt(1 - beta_2**t)`, as there. `v_hat` is the maximum of the
    uncorrected `v`. `bias_correction=False` drops both `1 - beta**t` factors.
  - Delay-adaptive rate: `eta / tau_max` above the threshold, the code's
    `lr_lambda = 1 / max(delay)` multiplying eta.
  - Initial values: m = v = 0, v_hat = 0 (the code's `max_init` default).

  Args:
    learning_rate: Nonnegative base server learning rate eta. Default 1e-3,
      the authors' command for CIFAR-10 with the delay-adaptive rate.
    beta_1: First-moment decay in [0, 1]; 0.9 as in the code.
    beta_2: Second-moment decay in [0, 1]; 0.99 as in the code.
    epsilon: Positive term added to the denominator; 1e-8 as in the code.
    delay_threshold: tau_c >= 0, in rounds; 1 as in the code.
    bias_correction: Python bool, see above; True follows the code.

  Raises:
    ValueError: naming an out-of-range argument or a non-bool `bias_correction`.
  """
  return adaptive.AdaptiveOptimizer(
      NAME, learning_rate, beta_1, beta_2, epsilon, amsgrad=True,
      bias_correction=bias_correction, delay_threshold=delay_threshold)
