"""Which trial is best: the one rule the sweep export and its live progress share.

A trial counts only if it did not diverge and its objective is finite. Among
those, the trials that ran the whole budget (`budget.rounds`) are preferred:
a trial that ASHA stopped early was compared at an earlier round and would not
reproduce at the full one. The best is the highest objective for `mode: max`,
the lowest for `mode: min`; on a tie the first trial wins.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar

from tff_fedadamom.metric_names import ROUND
from tuning import trainable as trainable_lib

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class TrialRecord:
  """One trial as the export sees it (read from Tune's experiment, or built by hand).

  Attributes:
    optimizer, trial_id, status: Tune's status (TERMINATED, ERROR, ...).
    params: Dotted path -> sampled value.
    history: One dict per report (`round`, `objective`, `diverged`, metrics...).
    node_id, hostname, pid: Where the trial ran (last report).
  """

  optimizer: str
  trial_id: str
  status: str
  params: Mapping[str, Any]
  history: Sequence[Mapping[str, Any]]
  node_id: Optional[str] = None
  hostname: Optional[str] = None
  pid: Optional[int] = None

  @property
  def last(self) -> Mapping[str, Any]:
    return self.history[-1] if self.history else {}

  @property
  def rounds(self) -> int:
    return int(self.last.get(ROUND, 0) or 0)

  @property
  def objective(self) -> Optional[float]:
    value = self.last.get(trainable_lib.OBJECTIVE)
    return None if value is None else float(value)

  @property
  def diverged(self) -> bool:
    return bool(self.last.get(trainable_lib.DIVERGED, 0))

  @property
  def ran(self) -> bool:
    return bool(self.history)


def is_better(a: float, b: Optional[float], mode: str) -> bool:
  """Whether objective `a` beats `b` (None: nothing yet) under `mode` ('max'/'min')."""
  if mode not in ("max", "min"):
    raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
  return b is None or (a > b if mode == "max" else a < b)


def _record_fields(record: TrialRecord) -> tuple[Optional[float], int, bool]:
  return (record.objective if record.ran else None), record.rounds, record.diverged


def choose_best(trials: Iterable[T], *, mode: str, rounds: int,
                fields: Callable[[T], tuple[Optional[float], int, bool]] = _record_fields,
                complete_only: bool = False) -> tuple[Optional[T], bool]:
  """The best trial (see the module docstring).

  Args:
    trials: Trials in a stable order (the first of equal trials wins).
    mode: 'max' or 'min', the sweep's `metric.mode`.
    rounds: The budget's rounds: a trial that ran fewer did not complete it.
    fields: trial -> (objective or None, rounds it ran, diverged); the default
      reads a `TrialRecord`.
    complete_only: Never fall back to a trial that did not complete the budget.

  Returns:
    (the best trial or None, whether it completed the budget).
  """
  eligible = []
  for trial in trials:
    objective, ran, diverged = fields(trial)
    if not diverged and objective is not None and math.isfinite(objective):
      eligible.append((trial, float(objective), (ran or 0) >= rounds))
  complete = [e for e in eligible if e[2]]
  pool = complete if complete or complete_only else eligible
  best = None
  for entry in pool:
    if best is None or is_better(entry[1], best[1], mode):
      best = entry
  return (best[0], best[2]) if best else (None, False)
