"""The one registry of methods: name -> server optimizer, or whole learning process.

An entry of `kind=LEARNING_PROCESS` (FedCAda, FAFED) changes what the clients
do too, so it is not a server optimizer inside FedAvg; `build_process`
dispatches on `kind`.

Hparam names are shared (`learning_rate`, `beta_1`, `beta_2`, `epsilon`,
`momentum`, `bias_correction`). Each entry's defaults follow its method's
official code (FedAdam, FedYogi, FedAdagrad: google-research/federated
`optimization/`; FedAMSGrad: jinghuichen/FedCAMS; FADAS: yujiaw98/FADAS), else
the paper or a named public implementation; the building module cites the file.
Server learning rates must be tuned: their defaults are starting points.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

import tensorflow_federated as tff

from tff_fedadamom import algorithms
from tff_fedadamom.algorithms import fafed, fedcada
from tff_fedadamom.optimizers import adagrad
from tff_fedadamom.optimizers import adaptive
from tff_fedadamom.optimizers import fadas
from tff_fedadamom.optimizers import fedadamom
from tff_fedadamom.optimizers import ranges
from tff_fedadamom.optimizers import state as keys

# What an entry builds (`OptimizerSpec.kind`).
SERVER_OPTIMIZER = 'server_optimizer'  # a tff.learning.optimizers.Optimizer for FedAvg's server
LEARNING_PROCESS = 'learning_process'  # a whole LearningProcess (the clients change too)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """A registered method.

  Attributes:
    builder: `builder(**hparams) -> Optimizer` (`SERVER_OPTIMIZER`), or
      `builder(model_fn, client_learning_rate, **hparams, **client_options)
      -> LearningProcess` (`LEARNING_PROCESS`, see `tff_fedadamom.algorithms`).
    defaults: Every hparam, with its default. A bool default is a build-time
      switch (`bias_correction`): it picks the rule and the state's structure.
    tunable: The hparams a sweep varies by default, each with a `search_ranges`
      entry (distribution 'loguniform'|'uniform', low, high).
    communication: Parameter-sized tensors a sampled client sends (and
      receives) per round, relative to FedAvg's one model (`communication_note`).
    check: `check(**hparams)` raises ValueError naming an out-of-range hparam.
    state: The keys of its state as telemetry reads it.
    momentum_coefficient: None, or `f(v_flat, epsilon)`: the per-coordinate
      momentum the state's second moment sets (FedAdamom's beta1_t).
  """

  name: str
  builder: Callable[..., tff.learning.optimizers.Optimizer]
  defaults: Mapping[str, Any]
  tunable: tuple[str, ...]
  description: str
  search_ranges: Mapping[str, tuple[str, float, float]]
  kind: str = SERVER_OPTIMIZER
  communication: float = 1.0
  communication_note: str = 'the model update up, the model down'
  check: Optional[Callable[..., None]] = None
  display_name: str = ''
  state: keys.StateKeys = keys.StateKeys(frozenset())
  momentum_coefficient: Optional[Callable[[Any, Any], Any]] = None


# Search ranges from the literature: eta and epsilon (tau) Reddi et al.'s (2021)
# grids, which hold FedAdamom's clip margin 1e-3; Adam-family beta_2 around the
# official codes' 0.99 and 0.999; FedAvgM momentum around Hsu et al.'s (2019)
# best 0.9-0.97; FedAdamom's beta_2 its paper's ablation; FADAS' ranges hold its
# authors' settings (eta 1e-4 and 1e-3, eps 1e-8) and most of Reddi et al.'s grids.
_RANGES = {
    'learning_rate': ('loguniform', 1e-3, 1e1),
    'epsilon': ('loguniform', 1e-5, 1e-1),
    'beta_2': ('uniform', 0.9, 0.999),
    'momentum': ('uniform', 0.5, 0.99),
}


# Reddi et al.'s notes (`adaptive.REDDI_*`); eta a starting point in their best range.
_REDDI_ADAM_DEFAULTS = {'learning_rate': 0.01, 'beta_1': adaptive.REDDI_BETA_1,
                        'beta_2': adaptive.REDDI_BETA_2, 'epsilon': adaptive.REDDI_EPSILON}


def _spec(name, display_name, builder, defaults, tunable, description, state, *,
          check=None, process=None, momentum_coefficient=None,
          **search) -> OptimizerSpec:
  """An entry; `process=dict(check, communication, communication_note)` makes it
  a `LEARNING_PROCESS`; `search` overrides `_RANGES`."""
  search_ranges = {h: search.get(h, _RANGES.get(h)) for h in tunable}
  extra = dict(kind=LEARNING_PROCESS, **process) if process else dict(check=check)
  return OptimizerSpec(name, builder, dict(defaults), tuple(tunable), description,
                       search_ranges, display_name=display_name, state=state,
                       momentum_coefficient=momentum_coefficient, **extra)


# FedCAda and FAFED: neither paper's hparam grid could be consulted; the ranges
# are the usual ones for client Adam and, for FAFED, a decade or more around the
# defaults of the implementation its module cites (alpha = rho = 0.1).
_CLIENT_ADAPTIVE_COMM = ('the model update, the first and the second moment up; the model'
                         ' and both moments down (plus a scalar step count for FedCAda)')


OPTIMIZERS: Mapping[str, OptimizerSpec] = {s.name: s for s in (
    _spec('fedavg', 'FedAvg', tff.learning.optimizers.build_sgdm, {'learning_rate': 1.0},
          ['learning_rate'], 'FedAvg: server SGD, w - eta * g (eta = 1 is plain averaging).',
          keys.SGD_STATE, check=ranges.check_sgd),
    _spec('fedavgm', 'FedAvgM', tff.learning.optimizers.build_sgdm,
          {'learning_rate': 1.0, 'momentum': 0.9}, ['learning_rate', 'momentum'],
          'FedAvgM: server heavy-ball momentum, m = momentum * m + g.', keys.SGDM_STATE,
          check=ranges.check_sgd),
    _spec('fedadam', adaptive.FEDADAM_NAME, adaptive.build_fedadam,
          {**_REDDI_ADAM_DEFAULTS, 'bias_correction': True},
          ['learning_rate', 'beta_2', 'epsilon'],
          'FedAdam (Reddi et al. 2021): Adam on the server.', keys.ADAM_STATE,
          check=functools.partial(ranges.check_adam_family, adaptive.FEDADAM_NAME, 'Adam')),
    _spec('fedyogi', adaptive.FEDYOGI_NAME, adaptive.build_fedyogi,
          {**_REDDI_ADAM_DEFAULTS,
           'initial_preconditioner': adaptive.REDDI_YOGI_INITIAL_PRECONDITIONER,
           'bias_correction': True},
          ['learning_rate', 'beta_2', 'epsilon'],
          'FedYogi (Reddi et al. 2021): Yogi on the server.', keys.ADAM_STATE,
          check=functools.partial(ranges.check_adam_family, adaptive.FEDYOGI_NAME, 'Yogi')),
    # Reddi et al.'s Adagrad (their code runs Keras'; `optimizers.adagrad`):
    # no momentum, v_0 = 0 (optimization/docs/hyperparameters.md), epsilon 1e-3.
    _spec('fedadagrad', adagrad.NAME, adagrad.build_fedadagrad,
          {'learning_rate': 0.1, 'epsilon': 1e-3, 'initial_preconditioner': 0.0},
          ['learning_rate', 'epsilon'],
          'FedAdagrad (Reddi et al. 2021): Adagrad on the server.', keys.ADAGRAD_STATE,
          check=ranges.check_adagrad),
    _spec('fedadamom', fedadamom.NAME, fedadamom.build_fedadamom,
          {'learning_rate': fedadamom.DEFAULT_LEARNING_RATE,
           'beta_2': fedadamom.DEFAULT_BETA_2, 'epsilon': fedadamom.DEFAULT_EPSILON},
          ['learning_rate', 'beta_2', 'epsilon'],
          'FedAdamom: second moment sets a per-coordinate momentum.',
          keys.StateKeys(frozenset(fedadamom.STATE_KEYS)), check=fedadamom.check_hparams,
          momentum_coefficient=fedadamom.momentum_coefficient_numpy,
          beta_2=('uniform', 0.01, 0.3)),
    _spec('fedamsgrad', adaptive.FEDAMSGRAD_NAME, adaptive.build_fedamsgrad,
          {'learning_rate': adaptive.FEDAMS_LEARNING_RATE,
           'beta_1': adaptive.FEDAMS_BETA_1, 'beta_2': adaptive.FEDAMS_BETA_2,
           'epsilon': adaptive.FEDAMS_EPSILON,
           'initial_max_preconditioner': adaptive.FEDAMS_INITIAL_MAX_PRECONDITIONER,
           'bias_correction': True},
          ['learning_rate', 'beta_2', 'epsilon'],
          'FedAMSGrad (FedAMS, Wang et al. 2022): AMSGrad on the server.',
          keys.AMSGRAD_STATE,
          check=functools.partial(ranges.check_adaptive, adaptive.FEDAMSGRAD_NAME,
                                  amsgrad=True)),
    _spec('fadas', fadas.NAME, fadas.build_fadas,
          {'learning_rate': fadas.DEFAULT_LEARNING_RATE, 'beta_1': fadas.DEFAULT_BETA_1,
           'beta_2': fadas.DEFAULT_BETA_2, 'epsilon': fadas.DEFAULT_EPSILON,
           'delay_threshold': fadas.DEFAULT_DELAY_THRESHOLD, 'bias_correction': True},
          ['learning_rate', 'beta_2', 'epsilon'],
          'FADAS (Wang et al. 2024): AMSGrad, delay-adaptive rate; synchronous rounds only.',
          keys.FADAS_STATE,
          check=functools.partial(ranges.check_adaptive, fadas.NAME, amsgrad=True),
          learning_rate=('loguniform', 1e-4, 1e0), epsilon=('loguniform', 1e-8, 1e-1)),
    _spec('fedcada', fedcada._NAME, algorithms.build_fedcada,  # pylint: disable=protected-access
          {'learning_rate': fedcada.DEFAULT_LEARNING_RATE, 'beta_1': fedcada.DEFAULT_BETA_1,
           'beta_2': fedcada.DEFAULT_BETA_2, 'epsilon': fedcada.DEFAULT_EPSILON},
          ['beta_2', 'epsilon'],
          'FedCAda (Zhou et al. 2024): Adam on the clients, Adam state averaged.',
          keys.CLIENT_ADAPTIVE_STATE,
          process=dict(check=fedcada.check_hparams, communication=3.0,
                       communication_note=_CLIENT_ADAPTIVE_COMM),
          beta_2=('uniform', 0.99, 0.999), epsilon=('loguniform', 1e-8, 1e-3)),
    _spec('fafed', fafed._NAME, algorithms.build_fafed,  # pylint: disable=protected-access
          {'learning_rate': fafed.DEFAULT_LEARNING_RATE, 'alpha': fafed.DEFAULT_ALPHA,
           'beta_2': fafed.DEFAULT_BETA_2, 'epsilon': fafed.DEFAULT_EPSILON},
          ['alpha', 'epsilon'],
          'FAFED (Wu et al. 2023): STORM client steps, shared adaptive matrix.',
          keys.CLIENT_ADAPTIVE_STATE,
          process=dict(check=fafed.check_hparams, communication=3.0,
                       communication_note=_CLIENT_ADAPTIVE_COMM),
          alpha=('loguniform', 1e-2, 1.0), epsilon=('loguniform', 1e-3, 1.0)),
)}


def list_optimizers() -> list[str]:
  """Names of the registered server optimizers."""
  return list(OPTIMIZERS)


def display_name(name: str) -> str:
  """How messages, tables and plots spell optimizer `name` ('fedadamom' -> 'FedAdamom')."""
  return get_spec(name).display_name


def optimizers_of_state(state_keys) -> list[str]:
  """The registered optimizers whose state can have exactly `state_keys`, in
  registry order (Adam and Yogi share a vocabulary, so a state can fit several)."""
  found = frozenset(state_keys)
  return [name for name, spec in OPTIMIZERS.items() if spec.state.fits(found)]


def momentum_coefficient_of_state(state_keys) -> Optional[Callable[[Any, Any], Any]]:
  """The diagnostic `momentum_coefficient` of the optimizer a state with
  `state_keys` belongs to; None unless that optimizer is known and has one."""
  names = optimizers_of_state(state_keys)
  coefficients = {OPTIMIZERS[n].momentum_coefficient for n in names}
  return coefficients.pop() if len(coefficients) == 1 else None


def get_spec(name: str) -> OptimizerSpec:
  """Returns the registry entry for `name`; ValueError listing the valid names."""
  return keys.lookup(OPTIMIZERS, name, 'server optimizer')


def default_hparams(name: str) -> dict[str, Any]:
  """Every hparam of optimizer `name`, with its default."""
  return dict(get_spec(name).defaults)


def sweepable_hparams(name: str) -> tuple[str, ...]:
  """The hparams a sweep may vary: the tunable ones, then the bool switches
  (which have no default range: a sweep varies one only with explicit values)."""
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
  keys.check_known(f'Server optimizer {name!r}', hparams, spec.defaults, 'hparam')
  return {**spec.defaults, **hparams}


def is_learning_process(name: str) -> bool:
  """True if `name` builds a whole learning process rather than a server optimizer."""
  return get_spec(name).kind == LEARNING_PROCESS


def check_hparams(name: str, **hparams) -> dict[str, Any]:
  """The resolved hparams of `name`; ValueError (naming the argument) when one is
  unknown or out of range, without building anything."""
  resolved = resolve_hparams(name, **hparams)
  get_spec(name).check(**resolved)
  return resolved


def build_server_optimizer(name: str, **hparams) -> tff.learning.optimizers.Optimizer:
  """The server optimizer `name` with `hparams` over its defaults; ValueError for
  an unknown name or hparam, an out-of-range value, or a learning process."""
  spec = get_spec(name)
  if spec.kind == LEARNING_PROCESS:
    raise ValueError(
        f'{name!r} is a learning process (its clients change too), not a server optimizer;'
        f' build it with tff_fedadamom.experiment.build_process(config) or'
        f' {spec.builder.__module__}.{spec.builder.__name__}(model_fn, ...).')
  return spec.builder(**resolve_hparams(name, **hparams))
