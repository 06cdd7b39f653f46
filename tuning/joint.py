"""One Tune experiment for all the optimizers of a sweep, the budget equal per optimizer.

Why one: a `Tuner` has a fixed cost before and after its trials (controller,
actors, experiment state on disk); a Tuner per optimizer paid it per optimizer
and left a slot idle at the end of each.

What keeps the budget equal:
  * Random and grid search: each optimizer's trials are drawn from its own
    space before Tune starts (`space.sample_trials`) and handed to Tune as one
    grid, interleaved (every optimizer's first trial, then every second, ...),
    so a time budget that ends the sweep early cuts every optimizer alike.
  * Optuna: `PerOptimizerSearch` keeps one study per optimizer, asks them in
    turn, and stops each at its budget.
  * Early stopping compares an optimizer with itself only (`PerOptimizerScheduler`).

A trial's Tune config is `{"trial": {"optimizer": name, <dotted path>: value}}`,
read by `split`.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Mapping, Optional, Sequence

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from tuning import space as space_lib

EXPERIMENT = "trials"  # the experiment's directory under the sweep directory
TRIAL_KEY = "trial"
OPTIMIZER_KEY = "optimizer"


def trial_configs(sweep, optimizers: Optional[Sequence[str]] = None) -> list[dict]:
  """The trials of `optimizers` (default: the sweep's), interleaved (module doc)."""
  per_optimizer = [[{OPTIMIZER_KEY: o, **params} for params in space_lib.sample_trials(sweep, o)]
                   for o in (sweep.optimizers if optimizers is None else optimizers)]
  longest = max((len(trials) for trials in per_optimizer), default=0)
  return [trials[i] for i in range(longest) for trials in per_optimizer if i < len(trials)]


def param_space(sweep, optimizers: Optional[Sequence[str]] = None) -> dict:
  """Tune's `param_space`: one grid point per trial of `trial_configs`."""
  from ray import tune

  return {TRIAL_KEY: tune.grid_search(trial_configs(sweep, optimizers))}


def split(config: Mapping[str, Any], optimizer: Optional[str] = None) -> tuple[str, dict]:
  """(optimizer, dotted path -> value) of a trial's Tune config; a flat config
  (Optuna's) is `optimizer`'s, the optimizer of its Tuner."""
  if TRIAL_KEY not in config:
    return optimizer, dict(config)
  entry = dict(config[TRIAL_KEY])
  return entry.pop(OPTIMIZER_KEY), entry


def optimizer_of(trial) -> str:
  """The optimizer of a Tune `Trial` of a joint experiment."""
  return split(trial.config)[0]


class _Pickled:
  """Tune's `save`/`restore` of a scheduler or searcher: its whole state, pickled."""

  def save(self, checkpoint_path: str) -> None:
    with open(checkpoint_path, "wb") as f:
      pickle.dump(self.__dict__, f)

  def restore(self, checkpoint_path: str) -> None:
    with open(checkpoint_path, "rb") as f:
      self.__dict__.update(pickle.load(f))


class NewestPendingFirst(FIFOScheduler):
  """Tune's FIFO scheduler, except that the newest pending trial starts first.

  Why: Tune hands a cached actor to the trial its scheduler chooses even when a
  new actor is starting for it, and removes the new one (Ray 2.52,
  `TuneController._maybe_reuse_cached_actor`). Oldest first, with trials
  shorter than an actor's start, the sweep ran one trial at a time. The newest
  pending trial has no actor yet: it takes the cached one.
  """

  def choose_trial_to_run(self, tune_controller) -> Optional[Trial]:
    trials = tune_controller.get_trials()
    newest = next((t for t in reversed(trials) if t.status == Trial.PENDING), None)
    return newest or next((t for t in trials if t.status == Trial.PAUSED), None)


class PerOptimizerScheduler(_Pickled, NewestPendingFirst):
  """One scheduler per optimizer (`make()` each) behind Tune's one scheduler: a
  trial's events go to its optimizer's, so ASHA's rung cut-offs are computed
  among that optimizer's trials only. Which trial starts next is decided here."""

  def __init__(self, make: Callable[[], TrialScheduler], optimizers: Sequence[str]):
    super().__init__()
    self._by_optimizer = {o: make() for o in optimizers}

  def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
    accepted = all([s.set_search_properties(metric, mode, **spec)
                    for s in self._by_optimizer.values()])
    if accepted and metric:
      self._metric = metric
    return accepted

  def _of(self, trial) -> TrialScheduler:
    if len(self._by_optimizer) == 1:
      return next(iter(self._by_optimizer.values()))
    return self._by_optimizer[optimizer_of(trial)]

  def on_trial_add(self, tune_controller, trial) -> None:
    self._of(trial).on_trial_add(tune_controller, trial)

  def on_trial_error(self, tune_controller, trial) -> None:
    self._of(trial).on_trial_error(tune_controller, trial)

  def on_trial_result(self, tune_controller, trial, result) -> str:
    return self._of(trial).on_trial_result(tune_controller, trial, result)

  def on_trial_complete(self, tune_controller, trial, result) -> None:
    self._of(trial).on_trial_complete(tune_controller, trial, result)

  def on_trial_remove(self, tune_controller, trial) -> None:
    self._of(trial).on_trial_remove(tune_controller, trial)

  def debug_string(self) -> str:
    return "\n".join(f"{o}: {s.debug_string()}" for o, s in self._by_optimizer.items())


class PerOptimizerSearch(_Pickled, Searcher):
  """One searcher per optimizer (`make(optimizer)`, an Optuna study each) behind
  Tune's one searcher. They are asked in turn, each until it has proposed its
  `trials_per_optimizer` (one with nothing to propose yet is passed over), and
  each sees only its own trials' results."""

  def __init__(self, make: Callable[[str], Searcher], optimizers: Sequence[str],
               trials_per_optimizer: int):
    super().__init__()
    self._by_optimizer = {o: make(o) for o in optimizers}
    self._budget = trials_per_optimizer
    self._proposed = {o: 0 for o in optimizers}
    self._owner: dict[str, str] = {}  # trial id -> its optimizer
    self._turn = 0

  def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict,
                            **spec) -> bool:
    # The studies have their spaces, metric and mode; Tune's are the same.
    if config:
      return False
    self._metric, self._mode = metric or self._metric, mode or self._mode
    return True

  def suggest(self, trial_id: str) -> Optional[dict]:
    order = list(self._by_optimizer)
    for k in range(len(order)):
      optimizer = order[(self._turn + k) % len(order)]
      if self._proposed[optimizer] >= self._budget:
        continue
      params = self._by_optimizer[optimizer].suggest(trial_id)
      if params is None or params == Searcher.FINISHED:
        continue
      self._proposed[optimizer] += 1
      self._owner[trial_id] = optimizer
      self._turn = (order.index(optimizer) + 1) % len(order)
      return {TRIAL_KEY: {OPTIMIZER_KEY: optimizer, **params}}
    if all(n >= self._budget for n in self._proposed.values()):
      return Searcher.FINISHED
    return None

  def on_trial_result(self, trial_id: str, result: dict) -> None:
    if trial_id in self._owner:
      self._by_optimizer[self._owner[trial_id]].on_trial_result(trial_id, result)

  def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                        error: bool = False) -> None:
    if trial_id in self._owner:
      self._by_optimizer[self._owner[trial_id]].on_trial_complete(trial_id, result, error)


class OptimizerResults(Sequence):
  """One optimizer's trials of a joint experiment's `ResultGrid`, with what a
  `ResultGrid` offers for them: a sequence, `errors` and `num_terminated`
  (Tune's status, read from the experiment on disk)."""

  def __init__(self, results: Sequence[Any], statuses: Mapping[str, str]):
    self._results = list(results)
    self._statuses = statuses

  def __len__(self) -> int:
    return len(self._results)

  def __getitem__(self, i):
    return self._results[i]

  @property
  def errors(self) -> list:
    return [r.error for r in self._results if r.error]

  @property
  def num_terminated(self) -> int:
    return sum(self._statuses.get(r.path) == "TERMINATED" for r in self._results)


def by_optimizer(grid, optimizers: Sequence[str], statuses: Mapping[str, str]) -> dict:
  """Optimizer -> `OptimizerResults` of a joint experiment's `ResultGrid`;
  `statuses` maps a trial's path to its status as saved on disk."""
  results = list(grid)
  return {o: OptimizerResults([r for r in results if split(r.config)[0] == o], statuses)
          for o in optimizers}
