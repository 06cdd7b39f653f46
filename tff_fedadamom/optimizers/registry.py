"""The one registry of server optimizers: name -> TFF optimizer builder.

Every place in the project that turns an optimizer name into an optimizer goes
through `build_server_optimizer`; the config and sweep layers ask this module
which names exist, which hyperparameters each one has, and which are tunable.

Hyperparameter names are shared across optimizers (`learning_rate`, `beta_1`,
`beta_2`, `epsilon`, `momentum`, `bias_correction`). Defaults of the adaptive
baselines follow Reddi et al., "Adaptive Federated Optimization" (ICLR 2021):
beta_1 = 0.9, beta_2 = 0.99, epsilon (their tau, the adaptivity) = 1e-3; FADAS'
follow its authors' code. Their server learning rates must be tuned; the
defaults here are starting points in the range where the papers found the best
values.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import tensorflow_federated as tff

from tff_fedadamom.naming import did_you_mean

from tff_fedadamom.optimizers import adaptive
from tff_fedadamom.optimizers import fadas
from tff_fedadamom.optimizers import fedadamom


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """A registered server optimizer.

  Attributes:
    name: Registry name.
    builder: Callable taking the hparams as keywords, returning a TFF optimizer.
    defaults: Every hparam the optimizer accepts, with its default. A bool
      default marks a build-time switch (`bias_correction`): it picks the
      update rule and the state's structure, so it is not in the state.
    tunable: The hparams a sweep varies by default (a subset of `defaults`,
      each with a search range). Bool switches are not tunable: a sweep
      varies one only when it asks, with `{dist: choice, values: [...]}`
      (see `sweepable_hparams`).
    description: One line for listings and docs.
    search_ranges: For each tunable hparam, the literature's search range as
      (distribution, low, high), distribution 'loguniform' or 'uniform'.
  """

  name: str
  builder: Callable[..., tff.learning.optimizers.Optimizer]
  defaults: Mapping[str, Any]
  tunable: tuple[str, ...]
  description: str
  search_ranges: Mapping[str, tuple[str, float, float]]


def _fedavg(learning_rate):
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)


def _fedavgm(learning_rate, momentum):
  return tff.learning.optimizers.build_sgdm(
      learning_rate=learning_rate, momentum=momentum
  )


def _fedadam(learning_rate, beta_1, beta_2, epsilon, bias_correction):
  return adaptive.build_fedadam(learning_rate, beta_1, beta_2, epsilon,
                                bias_correction=bias_correction)


def _fedyogi(learning_rate, beta_1, beta_2, epsilon, initial_preconditioner,
             bias_correction):
  return adaptive.build_fedyogi(learning_rate, beta_1, beta_2, epsilon,
                                initial_preconditioner,
                                bias_correction=bias_correction)


def _fedadagrad(learning_rate, epsilon, initial_preconditioner):
  return tff.learning.optimizers.build_adagrad(
      learning_rate=learning_rate,
      initial_preconditioner_value=initial_preconditioner,
      epsilon=epsilon,
  )


# Search ranges from the literature. eta: Reddi et al. (2021) grid 10^-3..10^1;
# epsilon: their tau grid 10^-5..10^-1 (FedAdamom's clip margin, reference 1e-3,
# lies inside); Adam-family beta_2 around their fixed 0.99; FedAvgM momentum,
# Hsu et al. (2019) best 0.9-0.97; FedAdamom beta_2: the paper's ablation 0.01-0.3.
# FADAS: eta log-uniform 1e-4..1e0 and epsilon 1e-8..1e-1 hold the authors'
# settings (eta 1e-4 and 1e-3, eps 1e-8) and most of Reddi et al.'s grids.
_RANGES = {
    'learning_rate': ('loguniform', 1e-3, 1e1),
    'epsilon': ('loguniform', 1e-5, 1e-1),
    'beta_2': ('uniform', 0.9, 0.999),
    'momentum': ('uniform', 0.5, 0.99),
}


# Reddi et al. (2021): beta_1 = 0.9, beta_2 = 0.99, tau = 1e-3; eta a starting
# point inside their best range.
_REDDI_ADAM_DEFAULTS = {'learning_rate': 0.01, 'beta_1': 0.9, 'beta_2': 0.99,
                        'epsilon': 1e-3}


def _spec(name, builder, defaults, tunable, description, **ranges) -> OptimizerSpec:
  search_ranges = {h: ranges.get(h, _RANGES[h]) for h in tunable}
  return OptimizerSpec(name, builder, dict(defaults), tuple(tunable), description,
                       search_ranges)


OPTIMIZERS: Mapping[str, OptimizerSpec] = {
    s.name: s
    for s in (
        _spec(
            'fedavg',
            _fedavg,
            {'learning_rate': 1.0},
            ['learning_rate'],
            'FedAvg: server SGD, w - eta * g (eta = 1 is plain averaging).',
        ),
        _spec(
            'fedavgm',
            _fedavgm,
            {'learning_rate': 1.0, 'momentum': 0.9},
            ['learning_rate', 'momentum'],
            'FedAvgM: server heavy-ball momentum, m = momentum * m + g.',
        ),
        _spec(
            'fedadam',
            _fedadam,
            {**_REDDI_ADAM_DEFAULTS, 'bias_correction': True},
            ['learning_rate', 'beta_2', 'epsilon'],
            'FedAdam (Reddi et al. 2021): Adam on the server.',
        ),
        _spec(
            'fedyogi',
            _fedyogi,
            {**_REDDI_ADAM_DEFAULTS, 'initial_preconditioner': 1e-6,
             'bias_correction': True},
            ['learning_rate', 'beta_2', 'epsilon'],
            'FedYogi (Reddi et al. 2021): Yogi on the server.',
        ),
        _spec(
            'fedadagrad',
            _fedadagrad,
            {'learning_rate': 0.1, 'epsilon': 1e-3,
             'initial_preconditioner': 0.0},
            ['learning_rate', 'epsilon'],
            'FedAdagrad (Reddi et al. 2021): Adagrad on the server.',
        ),
        _spec(
            'fedadamom',
            fedadamom.build_fedadamom,
            {'learning_rate': fedadamom.DEFAULT_LEARNING_RATE,
             'beta_2': fedadamom.DEFAULT_BETA_2,
             'epsilon': fedadamom.DEFAULT_EPSILON},
            ['learning_rate', 'beta_2', 'epsilon'],
            'FedAdamom: second moment sets a per-coordinate momentum.',
            beta_2=('uniform', 0.01, 0.3),
        ),
        _spec(
            'fedamsgrad',
            adaptive.build_fedamsgrad,
            {**_REDDI_ADAM_DEFAULTS, 'bias_correction': False},
            ['learning_rate', 'beta_2', 'epsilon'],
            'FedAMSGrad: AMSGrad on the server (Reddi et al. 2021 conventions).',
        ),
        _spec(
            'fadas',
            fadas.build_fadas,
            {'learning_rate': fadas.DEFAULT_LEARNING_RATE,
             'beta_1': fadas.DEFAULT_BETA_1,
             'beta_2': fadas.DEFAULT_BETA_2,
             'epsilon': fadas.DEFAULT_EPSILON,
             'delay_threshold': fadas.DEFAULT_DELAY_THRESHOLD,
             'bias_correction': False},
            ['learning_rate', 'beta_2', 'epsilon'],
            'FADAS (Wang et al. 2024): AMSGrad, delay-adaptive rate; '
            'synchronous rounds only.',
            learning_rate=('loguniform', 1e-4, 1e0),
            epsilon=('loguniform', 1e-8, 1e-1),
        ),
    )
}


def list_optimizers() -> list[str]:
  """Names of the registered server optimizers."""
  return list(OPTIMIZERS)



def get_spec(name: str) -> OptimizerSpec:
  """Returns the registry entry for `name`; ValueError listing the valid names."""
  try:
    return OPTIMIZERS[name]
  except (KeyError, TypeError):
    raise ValueError(
        f'Unknown server optimizer {name!r}; valid: {list_optimizers()}.'
        + did_you_mean(str(name), OPTIMIZERS)
    ) from None


def default_hparams(name: str) -> dict[str, Any]:
  """Every hparam of optimizer `name`, with its default."""
  return dict(get_spec(name).defaults)


def tunable_hparams(name: str) -> tuple[str, ...]:
  """The hparams of optimizer `name` that a sweep may vary."""
  return get_spec(name).tunable


def sweepable_hparams(name: str) -> tuple[str, ...]:
  """The hparams a sweep may vary: the tunable ones, then the bool switches.

  A switch (such as `bias_correction`) has no default range; a sweep varies
  it only with an explicit choice of values.
  """
  spec = get_spec(name)
  switches = tuple(h for h, v in spec.defaults.items()
                   if isinstance(v, bool) and h not in spec.tunable)
  return spec.tunable + switches


def search_ranges(name: str) -> dict[str, tuple[str, float, float]]:
  """(distribution, low, high) from the literature for each tunable hparam."""
  return dict(get_spec(name).search_ranges)


def resolve_hparams(name: str, **hparams) -> dict[str, Any]:
  """Defaults of `name` updated with `hparams`; unknown hparams are an error."""
  spec = get_spec(name)
  unknown = sorted(set(hparams) - set(spec.defaults))
  if unknown:
    raise ValueError(
        f'Server optimizer {name!r} has no hparam {unknown[0]!r}; valid:'
        f' {sorted(spec.defaults)}.' + did_you_mean(unknown[0], spec.defaults)
    )
  return {**spec.defaults, **hparams}


def build_server_optimizer(
    name: str, **hparams
) -> tff.learning.optimizers.Optimizer:
  """Builds the server optimizer `name` with `hparams` over its defaults.

  Args:
    name: One of `list_optimizers()`.
    **hparams: Values for any of the optimizer's hparams (`default_hparams`).

  Returns:
    A `tff.learning.optimizers.Optimizer`.

  Raises:
    ValueError: For an unknown name or hparam (listing the valid ones), or an
      out-of-range value (raised by the optimizer, naming the argument).
  """
  return get_spec(name).builder(**resolve_hparams(name, **hparams))
