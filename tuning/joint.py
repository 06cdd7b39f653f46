"""One Tune experiment for all the optimizers of a sweep, the budget equal per optimizer.

Why one: a `Tuner` has a fixed cost of its own before and after its trials
(Tune's controller, the trials' actors, the experiment state written to disk);
a Tuner per optimizer paid it once per optimizer and left a slot idle at the
end of each. One Tuner pays it once and runs trials of different optimizers
side by side.

What keeps the budget equal:
  * Random and grid search: the trials are fixed before Tune starts, each
    optimizer's `trials_per_optimizer` configurations drawn from its own space,
    each dimension with a seed of its own (`space.sample_trials`), handed to
    Tune as one grid of fully specified trials, interleaved (every optimizer's
    first trial, then every optimizer's second, ...), so a time budget that
    ends the sweep early cuts each optimizer's trials alike, within one.
  * Optuna proposes a trial from the ones before it: `PerOptimizerSearch`
    keeps one study per optimizer, each in its own space, asks them in turn,
    and stops each at its budget.
  * Early stopping compares an optimizer with itself only:
    `PerOptimizerScheduler` keeps one ASHA per optimizer.

A trial's Tune config is `{"trial": {"optimizer": name, <dotted path>: value}}`;
`split` is the one place that reads it.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from tuning import space as space_lib

# The experiment's directory under the sweep directory.
EXPERIMENT = "trials"
TRIAL_KEY = "trial"
OPTIMIZER_KEY = "optimizer"


def trial_configs(sweep, optimizers: Optional[Sequence[str]] = None) -> list[dict]:
  """The trials of `optimizers` (default: all of the sweep's), interleaved
  across optimizers (see the module doc)."""
  per_optimizer = [[{OPTIMIZER_KEY: o, **params} for params in space_lib.sample_trials(sweep, o)]
                   for o in (sweep.optimizers if optimizers is None else optimizers)]
  longest = max((len(trials) for trials in per_optimizer), default=0)
  return [trials[i] for i in range(longest) for trials in per_optimizer if i < len(trials)]


def param_space(sweep, optimizers: Optional[Sequence[str]] = None) -> dict:
  """Tune's `param_space` over `trial_configs(sweep, optimizers)`: one grid
  point per trial, nothing left to sample."""
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

  Why: Tune hands a cached actor (a finished trial's, kept for reuse) to the
  trial its scheduler chooses even when a new actor is already starting for
  that trial, and removes the new one (`TuneController._maybe_reuse_cached_actor`,
  Ray 2.52). Oldest first, the trial chosen was the one whose actor was
  starting: when a sweep's trials took less time than an actor's start, each
  new actor was removed before it came up, and the whole sweep ran one trial at
  a time, in one actor. The newest pending trial is the one the searcher has
  just added, with no actor yet: it takes the cached actor, and the starting
  one keeps its trial. A joint experiment's trials are interleaved by
  optimizer, and stay so in this order too.
  """

  def choose_trial_to_run(self, tune_controller) -> Optional[Trial]:
    trials = tune_controller.get_trials()
    newest = next((t for t in reversed(trials) if t.status == Trial.PENDING), None)
    return newest or next((t for t in trials if t.status == Trial.PAUSED), None)


class PerOptimizerScheduler(_Pickled, NewestPendingFirst):
  """One scheduler per optimizer behind Tune's single-scheduler interface.

  Each trial's events go to its optimizer's scheduler, so ASHA's rung cut-offs
  are computed among that optimizer's trials only, as with a Tuner per
  optimizer. Which trial starts next is decided here (`NewestPendingFirst`).

  Args:
    make: Returns a new scheduler (one per optimizer, built here).
    optimizers: The sweep's optimizers.
  """

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
  """One searcher per optimizer (an Optuna study each) behind Tune's one searcher.

  Trials are asked of the optimizers in turn, each until it has proposed its
  `trials_per_optimizer`; an optimizer whose searcher has nothing to propose
  yet is passed over. Each searcher sees only its own trials' results, so a
  study models one optimizer's space, as it would in a Tuner of its own.

  Args:
    make: optimizer -> its searcher, built with its space, metric and mode.
    optimizers: The sweep's optimizers, in the order they are asked.
    trials_per_optimizer: Each optimizer's budget.
  """

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
  `ResultGrid` offers for them: `len`, iteration, indexing, `errors` and
  `num_terminated` (Tune's status, read from the experiment on disk)."""

  def __init__(self, results: Sequence[Any], statuses: Mapping[str, str]):
    self._results = list(results)
    self._statuses = statuses

  def __len__(self) -> int:
    return len(self._results)

  def __getitem__(self, i):
    return self._results[i]

  def __iter__(self) -> Iterator[Any]:
    return iter(self._results)

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
