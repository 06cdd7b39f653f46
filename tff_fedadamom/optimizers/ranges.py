"""The hparam ranges of the server optimizers, checked without building one.

The registry (`methods.check_hparams`) runs these on a config's plain numbers;
our optimizers run them when built; for TFF's builders (SGD, Adam, Yogi) they
state TFF's ranges in TFF's words. Each raises ValueError naming the argument
in backticks, which `config.validate` turns into a ConfigError on the field.
"""

from __future__ import annotations

from tff_fedadamom.optimizers.state import check_range, is_concrete


def _nonnegative(optimizer: str, name: str, value) -> None:
  check_range(optimizer, name, value, lambda x: x >= 0.0, 'nonnegative')


def check_bias_correction(bias_correction) -> bool:
  """`bias_correction` as a Python bool; ValueError naming it otherwise."""
  if not isinstance(bias_correction, bool):
    raise ValueError(f'`bias_correction` must be true or false (a bool), found '
                     f'{bias_correction!r}.')
  return bias_correction


def check_sgd(learning_rate, momentum=None) -> None:
  """TFF's `build_sgdm`: a nonnegative rate; a momentum, when not 0, in [0, 1]."""
  _nonnegative('SGD', 'learning_rate', learning_rate)
  if momentum:
    check_range('SGD', 'momentum', momentum, lambda x: 0.0 <= x <= 1.0,
                '`None` or in the range [0, 1]')


def check_adagrad(learning_rate, epsilon, initial_preconditioner) -> None:
  """`adagrad.AdagradOptimizer`'s ranges (the registry's `fedadagrad`): its
  g / (sqrt(v) + epsilon) needs epsilon > 0 unless v starts above 0."""
  _nonnegative('Adagrad', 'learning_rate', learning_rate)
  _nonnegative('Adagrad', 'initial_preconditioner', initial_preconditioner)
  if is_concrete(initial_preconditioner) and initial_preconditioner > 0:
    _nonnegative('Adagrad', 'epsilon', epsilon)
  else:
    check_range('Adagrad', 'epsilon', epsilon, lambda x: x > 0.0,
                '> 0 when `initial_preconditioner` is 0')


def check_adaptive(name: str, learning_rate, beta_1, beta_2, epsilon, *, amsgrad: bool = False,
                   bias_correction: bool = False, initial_preconditioner=0.0,
                   initial_max_preconditioner=None, delay_threshold=None) -> None:
  """`adaptive.AdaptiveOptimizer`'s ranges (FedAdam and FedYogi uncorrected,
  FedAMSGrad, FADAS); `name` is the optimizer's in messages.

  The denominator sqrt(v) + epsilon must stay above 0 (a zero first update
  would give 0 / 0): epsilon > 0, unless AMSGrad's v_hat starts above 0.
  """
  _nonnegative(name, 'learning_rate', learning_rate)
  check_range(name, 'beta_1', beta_1, lambda x: 0.0 <= x <= 1.0, 'in [0.0, 1.0]')
  check_range(name, 'beta_2', beta_2, lambda x: 0.0 <= x <= 1.0, 'in [0.0, 1.0]')
  _nonnegative(name, 'initial_preconditioner', initial_preconditioner)
  if initial_max_preconditioner is None:
    initial_max_preconditioner = initial_preconditioner
  _nonnegative(name, 'initial_max_preconditioner', initial_max_preconditioner)
  if amsgrad and is_concrete(initial_max_preconditioner) and initial_max_preconditioner > 0:
    check_range(name, 'epsilon', epsilon, lambda x: x >= 0.0,
                'nonnegative (initial_max_preconditioner > 0)')
  else:
    check_range(name, 'epsilon', epsilon, lambda x: x > 0.0, 'positive')
  if delay_threshold is not None:
    _nonnegative(name, 'delay_threshold', delay_threshold)
  check_bias_correction(bias_correction)


def check_adam_family(name: str, tff_name: str, learning_rate, beta_1, beta_2, epsilon,
                      bias_correction, initial_preconditioner=None) -> None:
  """FedAdam and FedYogi: TFF's Adam or Yogi (`tff_name`) with bias correction,
  `AdaptiveOptimizer` (`name`) without; `initial_preconditioner` is Yogi's."""
  if not check_bias_correction(bias_correction):
    check_adaptive(name, learning_rate, beta_1, beta_2, epsilon,
                   initial_preconditioner=initial_preconditioner or 0.0)
    return
  unit = 'in the range [0.0, 1.0]' if tff_name == 'Adam' else 'in the range [0, 1]'
  _nonnegative(tff_name, 'learning_rate', learning_rate)
  check_range(tff_name, 'beta_1', beta_1, lambda x: 0.0 <= x <= 1.0, unit)
  check_range(tff_name, 'beta_2', beta_2, lambda x: 0.0 <= x <= 1.0, unit)
  _nonnegative(tff_name, 'epsilon', epsilon)
  if initial_preconditioner is not None:
    _nonnegative(tff_name, 'initial_preconditioner', initial_preconditioner)
