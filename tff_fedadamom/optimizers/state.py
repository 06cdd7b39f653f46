"""The vocabulary of server optimizer states, and the hparam plumbing they share.

Every server optimizer in this package keeps a flat `collections.OrderedDict`
of tensors: the hparams (learning rate first, under TFF's `LEARNING_RATE_KEY`,
so `tff.learning.optimizers.schedule_learning_rate` can drive it), then the
slots, each a structure like the weights. The slot names are TFF's own (its
`build_sgdm`, `build_adam`, `build_yogi` and `build_adagrad` states use
`accumulator`, `preconditioner`, `step`, `beta_1`, `beta_2`, `epsilon`), so a
reader of the state (`tff_fedadamom.pipeline.telemetry`) needs one vocabulary
for TFF's optimizers and ours. This module is that vocabulary's one home; which
keys each optimizer's state has is recorded in the registry
(`OptimizerSpec.state`).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Mapping

import tensorflow as tf
import tensorflow_federated as tff

LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
BETA_1_KEY = 'beta_1'
BETA_2_KEY = 'beta_2'
EPSILON_KEY = 'epsilon'
STEP_KEY = 'step'  # Round counter; present only where bias correction needs it.
MOMENTUM_KEY = 'momentum'  # TFF's SGD-with-momentum coefficient (FedAvgM).
ACCUMULATOR_KEY = 'accumulator'  # m, the momentum / first moment.
PRECONDITIONER_KEY = 'preconditioner'  # v, the second moment.
MAX_PRECONDITIONER_KEY = 'max_preconditioner'  # v_hat = running max of v (AMSGrad).
DELAY_THRESHOLD_KEY = 'delay_threshold'  # FADAS' tau_c.
MAX_DELAY_KEY = 'max_delay'  # FADAS' tau_t^max, the round's largest staleness.


def is_concrete(value) -> bool:
  """True unless `value` is a symbolic (graph) tensor, which cannot be checked."""
  return not tf.is_symbolic_tensor(value)


def show(value) -> str:
  """`value` for an error message (a tensor's numpy value)."""
  return str(value.numpy()) if tf.is_tensor(value) else repr(value)


def check_range(optimizer: str, name: str, value, ok, allowed: str) -> None:
  """ValueError naming `name` when the concrete `value` fails `ok(value)`.

  `ok` must return False for NaN (write comparisons, not negations of them).
  """
  if is_concrete(value) and not bool(ok(value)):
    raise ValueError(
        f'{optimizer} `{name}` must be {allowed}, found {show(value)}.'
    )


def get_hparams(state: Mapping[str, Any], keys: Iterable[str]):
  """The hparams `keys` of `state`, in order."""
  return collections.OrderedDict((k, state[k]) for k in keys)


def set_hparams(optimizer: str, state: Mapping[str, Any], hparams, keys):
  """`state` with the hparams in `hparams` replaced; unknown ones are an error.

  Keeps the state's key order (TFF checks a state's structure, including the
  order of its keys, between rounds).
  """
  keys = list(keys)
  unknown = sorted(set(hparams) - set(keys))
  if unknown:
    raise ValueError(
        f'{optimizer} has no hparams {unknown}; valid: {keys}.'
    )
  return collections.OrderedDict(
      (k, hparams.get(k, v) if k in keys else v) for k, v in state.items()
  )
