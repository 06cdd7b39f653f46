"""Per-round statistics of the server optimizer's state, in vectorised numpy,
read from the learning process state after each round (nothing in the TFF
computation changes).

A statistic is reported where the state has its key (the vocabulary of
`optimizers.state`); the registry's `momentum_coefficient` of the state's
optimizer (FedAdamom's beta1_t) gives the `beta1` statistics. Each statistic is
computed once over the concatenation of every leaf.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tff_fedadamom.metric_names import (BETA1_MEAN, FRAC_BETA1_AT_0, FRAC_BETA1_AT_MAX,
                                        LEARNING_RATE, MOMENTUM_NORM, OPT_PREFIX, UPDATE_NORM,
                                        layer_stat, moment_stats)
from tff_fedadamom import methods
from tff_fedadamom.optimizers.state import (ACCUMULATOR_KEY, EPSILON_KEY, LEARNING_RATE_KEY,
                                            MAX_PRECONDITIONER_KEY, PRECONDITIONER_KEY,
                                            process_moments)

def unwrap_optimizer_state(state: Any) -> Mapping[str, Any]:
  """The inner optimizer state of a server optimizer state, one wrapped (once or
  more) by `schedule_learning_rate` (`{round_num, optimizer}`), or a learning
  process state (its `finalizer`, with the moments the global state of an
  `algorithms` process carries beside the model).
  """
  if hasattr(state, 'finalizer'):
    moments = process_moments(getattr(state, 'global_model_weights', None))
    state = state.finalizer
    if moments:
      # A client-adaptive process (FedCAda, FAFED): the moments the server
      # averages travel with the model; the finalizer holds the learning rate.
      state = {**state, **moments}
  while isinstance(state, Mapping) and 'optimizer' in state and 'round_num' in state:
    state = state['optimizer']
  if not isinstance(state, Mapping):
    raise TypeError('Expected a server optimizer state (a mapping such as '
                    f'{{learning_rate, ...}}), found {type(state).__name__}.')
  return state


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in tf.nest.flatten(tree)]


def _concat(leaves: Sequence[np.ndarray]) -> np.ndarray:
  """One flat array of every leaf (float64 if any leaf is, else float32)."""
  if not leaves:
    return np.zeros([0], np.float32)
  dtype = np.float64 if any(x.dtype == np.float64 for x in leaves) else np.float32
  return np.concatenate([x.ravel() for x in leaves]).astype(dtype, copy=False)


def _sq_norm(leaves: Iterable[np.ndarray]) -> float:
  """The squared global L2 norm: squares in the leaf dtype, sums in float64. A
  square beyond the dtype's range is inf, the norm's value in that dtype (a
  diverging run records it), so numpy's overflow warning is silenced."""
  total = 0.0
  with np.errstate(over="ignore"):
    for x in leaves:
      if x.size:
        total += float(np.sum(np.square(x), dtype=np.float64))
  return total


def _percentiles(x: np.ndarray, percents: Sequence[float]) -> list[float]:
  """`np.percentile(x, percents)` (linear interpolation), by one partition for
  the order statistics it needs. Without sign bits set (a second moment), IEEE
  floats order exactly like their bits read as integers, whose partition is
  faster. The caller handles NaN."""
  n = x.size
  positions = [p / 100.0 * (n - 1) for p in percents]
  lows = [int(np.floor(q)) for q in positions]
  kth = sorted({k for low in lows for k in (low, min(low + 1, n - 1))})
  int_type = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}.get(x.dtype)
  if int_type is not None and not np.signbit(x).any():
    part = np.partition(x.view(int_type), kth).view(x.dtype)
  else:
    part = np.partition(x, kth)
  out = []
  for q, low in zip(positions, lows):
    a = float(part[low])
    b = float(part[min(low + 1, n - 1)])
    frac = q - low
    out.append(a if frac == 0 else a + (b - a) * frac)
  return out


def _scalar(value) -> float:
  return float(np.asarray(value))


def _segment_sums(values: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
  """Sums of consecutive segments of `values` of the given sizes (float64)."""
  sizes = np.asarray(sizes, np.int64)
  out = np.zeros(len(sizes), np.float64)
  nonempty = sizes > 0
  if np.any(nonempty):
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])[nonempty]
    out[nonempty] = np.add.reduceat(values, starts, dtype=np.float64)
  return out


def _layer_stats(beta1: np.ndarray | None, v: np.ndarray, sizes: Sequence[int],
                 layer_names: Sequence[str], upper) -> dict[str, float]:
  """Per-layer means and fractions; leaves sharing a name are pooled."""
  if len(layer_names) != len(sizes):
    raise ValueError(f'`layer_names` has {len(layer_names)} names but the optimizer state '
                     f'has {len(sizes)} tensors; give one name per trainable tensor.')
  names = list(dict.fromkeys(layer_names))  # Unique, in first-seen order.
  index = np.array([names.index(n) for n in layer_names], np.int64)

  def pooled(per_leaf: np.ndarray) -> np.ndarray:
    return np.bincount(index, weights=per_leaf, minlength=len(names))

  counts = pooled(np.asarray(sizes, np.float64))
  sums = {'v_mean': pooled(_segment_sums(v, sizes))}
  if beta1 is not None:
    sums['beta1_mean'] = pooled(_segment_sums(beta1, sizes))
    sums['frac_at_0'] = pooled(_segment_sums(beta1 == 0, sizes))
    sums['frac_at_max'] = pooled(_segment_sums(beta1 >= upper, sizes))
  stats = {}
  for j, name in enumerate(names):
    for stat, total in sums.items():
      value = total[j] / counts[j] if counts[j] else float('nan')
      stats[layer_stat(name, stat)] = float(value)
  return stats


def _moment_stats(x: np.ndarray, name: str) -> dict[str, float]:
  """`opt/<name>_mean`, `_median`, `_p01`, `_p99` of a flat second moment."""
  if not x.size:
    return {}
  mean = float(np.mean(x, dtype=np.float64))
  p01, p50, p99 = [float('nan')] * 3 if np.isnan(mean) else _percentiles(x, (1.0, 50.0, 99.0))
  return dict(zip(moment_stats(name), (mean, p50, p01, p99)))


def optimizer_state_stats(state: Any, *, previous_weights: Any = None, weights: Any = None,
                          layer_names: Sequence[str] | None = None,
                          epsilon: float | None = None) -> dict[str, float]:
  """Statistics of a server optimizer state (or one `unwrap_optimizer_state`
  unwraps), as Python floats keyed under `opt/`; `epsilon` defaults to the
  state's. The keys present depend on the state:

  - `opt/learning_rate`: the rate the state holds (under a schedule, the NEXT
    round's: `schedule_learning_rate` stores `schedule(round_num)` after it).
  - With a second moment `v`: `opt/v_mean`, `_median`, `_p01`, `_p99`; with
    AMSGrad's `v_hat`, the same as `opt/vhat_*`.
  - With a momentum `m`: `opt/momentum_norm`, its global L2 norm.
  - With `weights` and `previous_weights`: `opt/update_norm`, the round's.
  - Where the registry gives the optimizer a `momentum_coefficient`
    (FedAdamom): `opt/beta1_mean`, `opt/frac_beta1_at_0` and
    `opt/frac_beta1_at_max` (beta1_t == 1 - epsilon), beta1_t recomputed from v.
  - With `layer_names` (one per leaf of `v`, in `tf.nest.flatten` order; leaves
    of one name pooled): `opt/layer/<name>/v_mean` and, for FedAdamom,
    `.../beta1_mean`, `.../frac_at_0`, `.../frac_at_max`.

  Raises ValueError when `layer_names` or the weights do not match the state.
  """
  state = unwrap_optimizer_state(state)
  stats: dict[str, float] = {}
  if LEARNING_RATE_KEY in state:
    stats[LEARNING_RATE] = _scalar(state[LEARNING_RATE_KEY])

  if PRECONDITIONER_KEY in state:
    v_leaves = _leaves(state[PRECONDITIONER_KEY])
    sizes = [x.size for x in v_leaves]
    v = _concat(v_leaves)
    stats.update(_moment_stats(v, 'v'))
    beta1 = upper = None
    coefficient = methods.momentum_coefficient_of_state(state)
    if coefficient is not None and v.size:
      eps = state[EPSILON_KEY] if epsilon is None else epsilon
      beta1 = coefficient(v, _scalar(eps))
      upper = beta1.dtype.type(1) - beta1.dtype.type(_scalar(eps))
      n = beta1.size
      stats[BETA1_MEAN] = float(np.mean(beta1, dtype=np.float64))
      stats[FRAC_BETA1_AT_0] = np.count_nonzero(beta1 == 0) / n
      stats[FRAC_BETA1_AT_MAX] = np.count_nonzero(beta1 >= upper) / n
    if layer_names is not None:
      stats.update(_layer_stats(beta1, v, sizes, layer_names, upper))

  if MAX_PRECONDITIONER_KEY in state:
    # AMSGrad's v_hat, the running maximum of v that divides the step.
    stats.update(_moment_stats(_concat(_leaves(state[MAX_PRECONDITIONER_KEY])), 'vhat'))

  if ACCUMULATOR_KEY in state:
    stats[MOMENTUM_NORM] = float(np.sqrt(_sq_norm(_leaves(state[ACCUMULATOR_KEY]))))

  if weights is not None and previous_weights is not None:
    new, old = _leaves(weights), _leaves(previous_weights)
    if len(new) != len(old) or any(a.shape != b.shape for a, b in zip(new, old)):
      raise ValueError('`weights` and `previous_weights` differ in structure: shapes '
                       f'{[a.shape for a in new]} vs {[b.shape for b in old]}.')
    stats[UPDATE_NORM] = float(np.sqrt(_sq_norm(np.subtract(a, b) for a, b in zip(new, old))))
  return stats


def state_histograms(state: Any, *, epsilon: float | None = None) -> dict[str, np.ndarray]:
  """Flat arrays for TensorBoard histograms: `opt/v` (every leaf of the second
  moment, concatenated), `opt/vhat` (AMSGrad's running maximum of it) and
  `opt/beta1` (FedAdamom's beta1_t), where the state has them.
  """
  state = unwrap_optimizer_state(state)
  out: dict[str, np.ndarray] = {}
  if MAX_PRECONDITIONER_KEY in state:
    out[OPT_PREFIX + 'vhat'] = _concat(_leaves(state[MAX_PRECONDITIONER_KEY]))
  if PRECONDITIONER_KEY in state:
    v = _concat(_leaves(state[PRECONDITIONER_KEY]))
    out[OPT_PREFIX + 'v'] = v
    coefficient = methods.momentum_coefficient_of_state(state)
    if coefficient is not None and v.size:
      eps = state[EPSILON_KEY] if epsilon is None else epsilon
      out[OPT_PREFIX + 'beta1'] = coefficient(v, _scalar(eps))
  return out
