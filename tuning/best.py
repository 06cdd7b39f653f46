"""Which trial is best: the one rule the sweep export and its live progress share.

A trial counts only if it did not diverge and its objective is finite. Among
those, the trials that ran the whole budget are preferred: one ASHA stopped
early was compared at an earlier round and would not reproduce at the full one.
The best has the highest objective (`mode: max`) or the lowest; on a tie, the first.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import ROUND
from tuning import trainable as trainable_lib


@dataclasses.dataclass(frozen=True)
class TrialRecord:
  """One trial as the export sees it: Tune's `status` (TERMINATED, ERROR, ...),
  `params` (dotted path -> sampled value), `history` (one dict per report) and
  where it ran (last report)."""

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


def choose_best(trials: Iterable[TrialRecord], *, mode: str,
                rounds: int) -> tuple[Optional[TrialRecord], bool]:
  """(The best of `trials` or None, whether it ran all `rounds`): see the module
  docstring; `mode` is the sweep's `metric.mode`."""
  eligible = []
  for trial in trials:
    objective = trial.objective
    if not trial.diverged and objective is not None and math.isfinite(objective):
      eligible.append((trial, objective, trial.rounds >= rounds))
  complete = [e for e in eligible if e[2]]
  pool = complete or eligible
  best = None
  for entry in pool:
    if best is None or is_better(entry[1], best[1], mode):
      best = entry
  return (best[0], best[2]) if best else (None, False)
