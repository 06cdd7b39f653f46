"""The live progress of a sweep: a Tune callback (`SweepProgress`)."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Mapping, Optional

from ray import tune

from tuning import trainable as trainable_lib
from tuning.best import is_better
from tuning.schema import Sweep


@dataclasses.dataclass
class OptimizerState:
  total: int
  done: int = 0
  running: int = 0
  errored: int = 0
  diverged: int = 0
  best: Optional[float] = None
  best_params: Optional[dict] = None
  trial_seconds: list = dataclasses.field(default_factory=list)
  started: bool = False


@dataclasses.dataclass
class SweepState:
  sweep: Sweep
  started: float
  per_optimizer: dict
  last_print: float = 0.0
  max_running: int = 1
  stream: Any = None


# Live state per sweep directory, during one `run_sweep` call. Callbacks hold the
# key: Tune pickles them into the experiment and, on `Tuner.restore` (which takes
# no callbacks, Ray 2.52), runs an unpickled copy, which reaches the state here.
LIVE: dict[str, SweepState] = {}


def _fmt_time(seconds: Optional[float]) -> str:
  if seconds is None or not math.isfinite(seconds):
    return "?"
  seconds = max(0, int(seconds))
  return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _fmt_params(params: Optional[Mapping[str, Any]]) -> str:
  if not params:
    return ""
  return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                  for k, v in params.items())


class SweepProgress(tune.Callback):
  """Prints, every `interval_s` seconds and when a trial ends, per optimizer the
  trials done, running, errored and diverged and the best objective so far,
  and the time elapsed and left (estimated from the finished trials). `key`:
  see `LIVE`."""

  def __init__(self, key: str, interval_s: float):
    self.key, self.interval_s = key, interval_s

  def _update(self, state: SweepState, trials) -> None:
    from tuning import joint

    by_optimizer: dict[str, list] = {}
    for trial in trials:
      by_optimizer.setdefault(joint.optimizer_of(trial), []).append(trial)
    for optimizer, its_trials in by_optimizer.items():
      _update_optimizer(state, optimizer, its_trials)
    state.max_running = max(state.max_running, sum(
        state.per_optimizer[o].running for o in by_optimizer))

  def on_step_end(self, iteration, trials, **info):
    state = LIVE.get(self.key)
    if state is not None:
      self._update(state, trials)
      if time.monotonic() - state.last_print >= self.interval_s:
        print_progress(state)

  def on_trial_complete(self, iteration, trials, trial, **info):
    state = LIVE.get(self.key)
    if state is not None:
      self._update(state, trials)
      print_progress(state)

  def on_trial_error(self, iteration, trials, trial, **info):
    self.on_trial_complete(iteration, trials, trial)


def _update_optimizer(state: SweepState, optimizer: str, trials) -> None:
  """Refreshes `optimizer`'s line from its `trials`."""
  from tuning import joint

  mode = state.sweep.metric.mode
  entry = state.per_optimizer[optimizer]
  entry.started = True
  entry.running = sum(t.status == "RUNNING" for t in trials)
  entry.done = sum(t.status == "TERMINATED" for t in trials)
  entry.errored = sum(t.status == "ERROR" for t in trials)
  entry.diverged = 0
  entry.trial_seconds = []
  best, best_params = None, None
  for trial in trials:
    result = trial.last_result or {}
    if trial.status in ("TERMINATED", "ERROR") and "time_total_s" in result:
      entry.trial_seconds.append(result["time_total_s"])
    if result.get(trainable_lib.DIVERGED):
      entry.diverged += 1
      continue
    value = result.get(trainable_lib.OBJECTIVE)
    if value is None or not math.isfinite(value):
      continue
    if is_better(value, best, mode):
      best, best_params = value, joint.split(trial.config, optimizer)[1]
  entry.best, entry.best_params = best, best_params


def print_progress(state: SweepState) -> None:
  sweep = state.sweep
  now = time.monotonic()
  state.last_print = now
  elapsed = now - state.started
  durations = [s for e in state.per_optimizer.values() for s in e.trial_seconds]
  remaining = sum(max(0, e.total - e.done - e.errored) for e in state.per_optimizer.values())
  estimate = (remaining * (sum(durations) / len(durations)) / max(1, state.max_running)
              if durations else None)
  budget = sweep.resources.time_budget_s
  left = f"~{_fmt_time(estimate)} (estimate)"
  if budget:
    left += f", {_fmt_time(budget - elapsed)} of the time budget"
  lines = [f"== sweep {sweep.name}: {_fmt_time(elapsed)} elapsed, time left {left}; "
           f"objective = {sweep.metric.name} "
           f"(mean of last {sweep.metric.last_k}, {sweep.metric.mode})"]
  width = max(len(n) for n in state.per_optimizer)
  for name, e in state.per_optimizer.items():
    if not e.started:
      lines.append(f"   {name:<{width}}  waiting ({e.total} trials)")
      continue
    best = "-" if e.best is None else f"{e.best:.4f}"
    lines.append(f"   {name:<{width}}  trials {e.done}/{e.total} done, {e.running} running,"
                 f" {e.errored} errored, {e.diverged} diverged | best {best} "
                 f"{_fmt_params(e.best_params)}")
  print("\n".join(lines), file=state.stream or sys.stdout, flush=True)
