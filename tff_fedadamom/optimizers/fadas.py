"""FADAS: AMSGrad on the server with a delay-adaptive server learning rate.

Wang, Wang, Lu and Chen, "FADAS: Towards Federated Adaptive Asynchronous
Optimization", ICML 2024 (PMLR 235; arXiv:2407.18365); the authors' code is
github.com/yujiaw98/FADAS.
"""

from __future__ import annotations

import tensorflow_federated as tff

from tff_fedadamom.optimizers import adaptive

# The authors' code (yujiaw98/FADAS: `options.py`; the README's CIFAR-10 command:
# global lr 1e-3 with the delay-adaptive rate, chosen with bias correction on).
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_BETA_1 = 0.9
DEFAULT_BETA_2 = 0.99
NAME = 'FADAS'  # In messages, tables and plots.
DEFAULT_EPSILON = 1e-8
DEFAULT_DELAY_THRESHOLD = 1.0


def build_fadas(learning_rate=DEFAULT_LEARNING_RATE, beta_1=DEFAULT_BETA_1,
                beta_2=DEFAULT_BETA_2, epsilon=DEFAULT_EPSILON,
                delay_threshold=DEFAULT_DELAY_THRESHOLD,
                bias_correction: bool = True) -> tff.learning.optimizers.Optimizer:
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

  `tau_max` is the largest staleness (in server steps) of the step's buffered
  updates and `tau_c` the delay threshold, both in the state as hparams
  (`max_delay`, 0 after `initialize`, and `delay_threshold`): the asynchronous
  driver (`runtime.buffered`) sets `max_delay` with `set_hparams` before each
  step. In synchronous rounds (`build_weighted_fed_avg`) staleness is 0, so
  `eta_t = eta` and FADAS is FedAMSGrad's rule with FADAS' defaults (v_hat_0 =
  0, epsilon 1e-8).

  Source: only the paper's abstract could be read, so the rule is the authors'
  code (yujiaw98/FADAS): `update.py` (optimizer `fedams`: bias correction always
  on, epsilon after `sqrt(v_hat)` is rescaled, v_hat_0 = 0) and the delay rule
  of `adaptive.delay_adaptive_learning_rate`; `DEFAULT_*` name their source.

  Raises:
    ValueError: naming an out-of-range argument or a non-bool `bias_correction`.
  """
  return adaptive.AdaptiveOptimizer(
      NAME, learning_rate, beta_1, beta_2, epsilon, amsgrad=True,
      bias_correction=bias_correction, delay_threshold=delay_threshold)
