"""The one registry of server learning-rate schedules.

A schedule maps the server round `t` (0 for the first) to that round's server
learning rate, in TensorFlow ops, applied through `schedule_learning_rate`
(`with_schedule`) to any optimizer whose state holds a `learning_rate`:

```
constant:      lr
exponential:   lr * decay_rate ** (t / decay_steps)        (floor(t / decay_steps)
                                                            when staircase)
cosine:        lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(t, decay_rounds)
                                                 / decay_rounds)) + alpha)
inverse_time:  lr / (1 + decay_rate * t / decay_steps)
```

Every schedule takes an optional linear warm-up of `W = warmup_rounds` rounds
starting from the fraction `warmup_init` of `lr` (0 by default):

```
t <  W:   lr * (warmup_init + (1 - warmup_init) * t / W)
t >= W:   decay(t - W)           # the decay starts when the warm-up ends
```

so the rate reaches `lr` at round `W` and the schedule is continuous there.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Mapping

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import state as keys

ScheduleFn = Callable[[tf.Tensor], tf.Tensor]

_WARMUP_DEFAULTS = {'warmup_rounds': 0, 'warmup_init': 0.0}


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
  """A registered schedule (formulas: module docstring): every parameter with its
  default (warm-up included), and those a sweep may vary."""

  name: str
  defaults: Mapping[str, Any]
  tunable: tuple[str, ...]


def _spec(name, defaults, tunable) -> ScheduleSpec:
  return ScheduleSpec(name, {**defaults, **_WARMUP_DEFAULTS}, tuple(tunable))


SCHEDULES: Mapping[str, ScheduleSpec] = {s.name: s for s in (
    _spec('constant', {}, ['warmup_rounds', 'warmup_init']),
    _spec('exponential', {'decay_rate': 0.99, 'decay_steps': 1, 'staircase': False},
          ['decay_rate', 'decay_steps', 'warmup_rounds']),
    _spec('cosine', {'decay_rounds': 1000, 'alpha': 0.0},
          ['decay_rounds', 'alpha', 'warmup_rounds']),
    _spec('inverse_time', {'decay_rate': 0.01, 'decay_steps': 1},
          ['decay_rate', 'decay_steps', 'warmup_rounds']),
)}


def list_schedules() -> list[str]:
  """Names of the registered schedules."""
  return list(SCHEDULES)


def _bad(kind: str, name: str, value, requirement: str) -> ValueError:
  return ValueError(f'Schedule {kind!r}: `{name}` must be {requirement}, found {value!r}.')


def _real(kind, name, value, ok=lambda x: True, requirement: str = '') -> float:
  """`value` as a finite float for which `ok` holds (else `requirement`)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise _bad(kind, name, value, 'a number')
  number = float(value)
  if not math.isfinite(number):
    raise _bad(kind, name, number, 'finite')
  if not ok(number):
    raise _bad(kind, name, value, requirement)
  return number


def _count(kind, name, value, *, minimum: int) -> int:
  """An integer >= minimum; integral floats (as sweeps produce) are accepted."""
  ok = isinstance(value, numbers.Integral) or (
      isinstance(value, numbers.Real) and float(value).is_integer())
  if isinstance(value, bool) or not ok or int(value) < minimum:
    raise _bad(kind, name, value, f'an integer >= {minimum}')
  return int(value)


def _check_params(kind: str, base_lr, params: dict) -> dict:
  """Returns `params` with checked, normalised values (ValueError otherwise)."""
  out = dict(params)
  unit = lambda x: 0.0 <= x <= 1.0
  _real(kind, 'base_lr', base_lr, lambda x: x >= 0, 'nonnegative')
  out['warmup_rounds'] = _count(kind, 'warmup_rounds', params['warmup_rounds'], minimum=0)
  out['warmup_init'] = _real(kind, 'warmup_init', params['warmup_init'], unit, 'in [0, 1]')
  if kind == 'exponential':
    out['decay_rate'] = _real(kind, 'decay_rate', params['decay_rate'],
                              lambda x: 0.0 < x <= 1.0, 'in (0, 1]')
    if not isinstance(params['staircase'], bool):
      raise _bad(kind, 'staircase', params['staircase'], 'true or false')
  if kind == 'inverse_time':
    out['decay_rate'] = _real(kind, 'decay_rate', params['decay_rate'], lambda x: x >= 0,
                              'nonnegative')
  if kind in ('exponential', 'inverse_time'):
    out['decay_steps'] = _count(kind, 'decay_steps', params['decay_steps'], minimum=1)
  if kind == 'cosine':
    out['decay_rounds'] = _count(kind, 'decay_rounds', params['decay_rounds'], minimum=1)
    out['alpha'] = _real(kind, 'alpha', params['alpha'], unit, 'in [0, 1]')
  return out


def resolve_schedule_params(kind: str, base_lr=1.0, **params) -> dict[str, Any]:
  """Every parameter of schedule `kind` (not `base_lr`, though it is checked
  too): its defaults updated with `params`, normalised.

  Raises:
    ValueError: an unknown kind or parameter (listing the valid ones), or a bad
      value (naming the parameter and the value).
  """
  spec = keys.lookup(SCHEDULES, kind, 'learning-rate schedule')
  keys.check_known(f'Schedule {kind!r}', params, spec.defaults, 'parameter')
  return _check_params(kind, base_lr, {**spec.defaults, **params})


def _decay_fn(kind: str, lr: float, p: dict) -> Callable[[tf.Tensor], tf.Tensor]:
  """Returns t (float32, rounds since the warm-up ended) -> learning rate.

  Parameters stay Python numbers until the callable runs, so that no eager
  tensor is captured when TFF traces it into a computation.
  """
  if kind == 'constant':
    return lambda t: tf.fill(tf.shape(t), tf.constant(lr, tf.float32))
  if kind == 'exponential':
    rate, steps, staircase = p['decay_rate'], float(p['decay_steps']), p['staircase']

    def exponential(t):
      e = t / steps
      if staircase:
        e = tf.math.floor(e)
      return lr * tf.math.pow(tf.constant(rate, tf.float32), e)

    return exponential
  if kind == 'cosine':
    rounds, alpha = float(p['decay_rounds']), p['alpha']

    def cosine(t):
      done = tf.minimum(t, rounds) / rounds
      cos = 0.5 * (1.0 + tf.math.cos(math.pi * done))
      return lr * ((1.0 - alpha) * cos + alpha)

    return cosine
  if kind == 'inverse_time':
    rate, steps = p['decay_rate'], float(p['decay_steps'])
    return lambda t: lr / (1.0 + rate * t / steps)
  raise AssertionError(kind)  # Unreachable: `kind` was checked.


def build_schedule(kind: str, base_lr, **params) -> ScheduleFn:
  """The schedule `kind` (module docstring) as `round_num -> float32 rate` in TF ops.

  `round_num` is an integer scalar, 0 for the first round. `base_lr` replaces
  the optimizer's own rate when the schedule is applied: pass that rate. The
  callable carries `kind`, `base_lr`, `params` (defaults filled in) and
  `is_constant` (`constant` without warm-up), for logging and `with_schedule`.

  Raises:
    ValueError: as `resolve_schedule_params`.
  """
  p = resolve_schedule_params(kind, base_lr, **params)
  base_lr = float(base_lr)
  decay = _decay_fn(kind, base_lr, p)
  warmup, init = p['warmup_rounds'], p['warmup_init']

  def schedule(round_num) -> tf.Tensor:
    t = tf.cast(round_num, tf.float32)
    if not warmup:
      return decay(t)
    w = float(warmup)
    ramp = base_lr * (init + (1.0 - init) * t / w)
    # Both branches are finite for every t >= 0, so tf.where is safe.
    return tf.where(t < w, ramp, decay(tf.maximum(t - w, 0.0)))

  schedule.kind = kind
  schedule.base_lr = base_lr
  schedule.params = p
  schedule.is_constant = kind == 'constant' and not warmup
  schedule.__name__ = f'{kind}_schedule'
  return schedule


def with_schedule(optimizer: tff.learning.optimizers.Optimizer,
                  schedule_fn: ScheduleFn | None) -> tff.learning.optimizers.Optimizer:
  """`tff.learning.optimizers.schedule_learning_rate(optimizer, schedule_fn)`:
  round `i` uses `schedule_fn(i)`, and the state becomes `{round_num,
  optimizer}`, whose inner `learning_rate` is the rate of the NEXT round.

  A constant schedule (`is_constant`) or None returns `optimizer` unchanged, so
  constant-rate runs keep the plain optimizer state.
  """
  if schedule_fn is None or getattr(schedule_fn, 'is_constant', False):
    return optimizer
  return tff.learning.optimizers.schedule_learning_rate(optimizer, schedule_fn)
