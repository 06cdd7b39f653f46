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
  """FADAS' server optimizer: FedAMSGrad's rule (`adaptive`, v_hat_0 = 0) at the
  delay-adaptive rate `eta_t` of `adaptive.delay_adaptive_learning_rate`.

  The server buffers client updates, each computed from a possibly stale model,
  and takes one step on their average; `eta_t = eta / tau_max` when the largest
  staleness `tau_max` (in server steps) of the buffer exceeds the threshold
  `tau_c`. Both are hparams in the state (`max_delay`, 0 after `initialize`, and
  `delay_threshold`): the asynchronous driver (`runtime.buffered`) sets
  `max_delay` with `set_hparams` before each step. In synchronous rounds `eta_t =
  eta`, so FADAS is FedAMSGrad with FADAS' defaults.

  Source: only the paper's abstract could be read, so the rule is the authors'
  code (yujiaw98/FADAS): `update.py` (optimizer `fedams`: bias correction always
  on, epsilon after `sqrt(v_hat)` is rescaled, v_hat_0 = 0) and the delay rule
  of `adaptive.delay_adaptive_learning_rate`; `DEFAULT_*` name their source.
  """
  return adaptive.AdaptiveOptimizer(
      NAME, learning_rate, beta_1, beta_2, epsilon, amsgrad=True,
      bias_correction=bias_correction, delay_threshold=delay_threshold)
