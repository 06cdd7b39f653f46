"""The vocabulary of server optimizer states, and the hparam plumbing they share.

Every server optimizer here keeps a flat OrderedDict: the hparams (learning
rate first, under TFF's `LEARNING_RATE_KEY`, so `schedule_learning_rate` can
drive it), then the slots, each shaped like the weights. The key names are
TFF's own, so telemetry reads TFF's optimizers and ours with one vocabulary.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, Mapping

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.naming import did_you_mean

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
# The model in the global state of a client-adaptive process (FedCAda, FAFED),
# beside the averaged moments (`process_moments`).
MODEL_KEY = 'model'


@dataclasses.dataclass(frozen=True)
class StateKeys:
  """The top-level keys of an optimizer's state, by which telemetry knows it:
  those it `always` has, and those a build-time switch adds (`switched`: `step`)."""

  always: frozenset[str]
  switched: frozenset[str] = frozenset()

  def fits(self, state_keys) -> bool:
    """True when a state with exactly `state_keys` can be this optimizer's."""
    found = frozenset(state_keys)
    return self.always <= found <= self.always | self.switched


# Each optimizer's vocabulary (the registry records which is whose).
SGD_STATE = StateKeys(frozenset({LEARNING_RATE_KEY}))
SGDM_STATE = StateKeys(frozenset({LEARNING_RATE_KEY, MOMENTUM_KEY, ACCUMULATOR_KEY}))
ADAGRAD_STATE = StateKeys(frozenset({LEARNING_RATE_KEY, EPSILON_KEY, PRECONDITIONER_KEY}))
ADAM_STATE = StateKeys(
    frozenset({LEARNING_RATE_KEY, BETA_1_KEY, BETA_2_KEY, EPSILON_KEY,
               ACCUMULATOR_KEY, PRECONDITIONER_KEY}),
    frozenset({STEP_KEY}))
AMSGRAD_STATE = StateKeys(ADAM_STATE.always | {MAX_PRECONDITIONER_KEY}, ADAM_STATE.switched)
FADAS_STATE = StateKeys(AMSGRAD_STATE.always | {DELAY_THRESHOLD_KEY, MAX_DELAY_KEY},
                        ADAM_STATE.switched)
# A client-adaptive process (FedCAda, FAFED): the finalizer's learning rate and
# the moments the server averages (`process_moments`).
CLIENT_ADAPTIVE_STATE = StateKeys(
    frozenset({LEARNING_RATE_KEY, ACCUMULATOR_KEY, PRECONDITIONER_KEY}))


def is_concrete(value) -> bool:
  """True unless `value` is a symbolic (graph) tensor, which cannot be checked."""
  return not tf.is_symbolic_tensor(value)


def check_range(optimizer: str, name: str, value, ok, allowed: str) -> None:
  """ValueError naming `name` when the concrete `value` fails `ok(value)`.

  `ok` must return False for NaN (write comparisons, not negations of them).
  """
  if is_concrete(value) and not bool(ok(value)):
    shown = str(value.numpy()) if tf.is_tensor(value) else repr(value)
    raise ValueError(f'{optimizer} `{name}` must be {allowed}, found {shown}.')


def lookup(table: Mapping[str, Any], name, what: str):
  """`table[name]`; else ValueError naming `what`, the valid names and the closest."""
  try:
    return table[name]
  except (KeyError, TypeError):
    raise ValueError(f'Unknown {what} {name!r}; valid: {list(table)}.'
                     + did_you_mean(str(name), table)) from None


def check_known(owner: str, given: Iterable[str], valid: Iterable[str], what: str) -> None:
  """ValueError naming the first of `given` that is not in `valid` (and the valid ones)."""
  valid = list(valid)
  unknown = sorted(set(given) - set(valid))
  if unknown:
    raise ValueError(f'{owner} has no {what} {unknown[0]!r}; valid: {sorted(valid)}.'
                     + did_you_mean(unknown[0], valid))


def get_hparams(state: Mapping[str, Any], keys: Iterable[str]):
  """The hparams `keys` of `state`, in order."""
  return collections.OrderedDict((k, state[k]) for k in keys)


def set_hparams(optimizer: str, state: Mapping[str, Any], hparams, keys):
  """`state` with the hparams in `hparams` replaced; unknown ones are an error.
  Keeps the key order, which TFF checks between rounds."""
  keys = list(keys)
  unknown = sorted(set(hparams) - set(keys))
  if unknown:
    raise ValueError(f'{optimizer} has no hparams {unknown}; valid: {keys}.')
  return collections.OrderedDict(
      (k, hparams.get(k, v) if k in keys else v) for k, v in state.items())


def process_moments(global_state) -> dict[str, Any]:
  """The moments a client-adaptive process' global state carries beside the
  model (FedCAda, FAFED: {model, accumulator, preconditioner, ...}), keyed as in
  an optimizer state; {} for any other global state (a plain `ModelWeights`)."""
  if not isinstance(global_state, Mapping) or MODEL_KEY not in global_state:
    return {}
  moments = (ACCUMULATOR_KEY, PRECONDITIONER_KEY)
  return {k: v for k, v in global_state.items() if k in moments}
