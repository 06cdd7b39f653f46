"""The Tune trainable (`SweepTrial`): one trial = one experiment, stepped one
evaluation at a time, in a scratch run directory removed when the trial ends.

A result holds the evaluation's flat metrics, `round`, `objective` (the sweep's
metric averaged over the last k evaluations), `diverged` (0/1), `node_id` and
`worker_pid`. A diverged trial reports `worst_objective(mode)`, a finite value
no real metric reaches, so it is never best and ASHA's cut-offs stay finite.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import Any, Collection, Iterable, Mapping, Optional

from ray import tune

from tff_fedadamom.metric_names import ROUND, evaluated
from tff_fedadamom.plain import plain

OBJECTIVE = "objective"
DIVERGED = "diverged"
WORKER_PID = "worker_pid"
NODE_ID = "node_id"
RUN_SUBDIR = "run"
_WORST = 1e300


def worst_objective(mode: str) -> float:
  """The objective of a diverged trial: below (max) or above (min) any real one."""
  return -_WORST if mode == "max" else _WORST


def one_row_per_round(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """`rows` (each with a `round`) in round order, the last row of a round
  winning: a trial restarted from its latest checkpoint reports the rounds
  after it again, with the same values."""
  by_round = {}
  for row in rows:
    by_round[int(row[ROUND])] = row
  return [by_round[r] for r in sorted(by_round)]


def objective_from_history(history: Iterable[Mapping[str, Any]], metric: str, last_k: int,
                           upto_round: Optional[int] = None) -> Optional[float]:
  """Mean of `metric` over the last `last_k` evaluations (fewer if fewer exist)
  up to `upto_round`; None when no evaluation has it, NaN when a value is not
  finite. Only evaluated rows count, so a `train/` metric is averaged over the
  same rounds as a `test/` one; a round seen twice counts once."""
  rows = one_row_per_round(
      row for row in history
      if evaluated(row) and metric in row and (upto_round is None or row[ROUND] <= upto_round))
  values = [float(row[metric]) for row in rows][-last_k:]
  if not values:
    return None
  if not all(math.isfinite(v) for v in values):
    return math.nan
  return sum(values) / len(values)


def _result(metrics: Mapping[str, Any], objective: Optional[float], diverged: bool, mode: str,
            node_id: str) -> dict:
  """A report: the numbers of `metrics` (a bool as 0/1), and `objective`, or
  `worst_objective(mode)` for a diverged run or one without a finite objective."""
  out = {}
  for key, value in metrics.items():
    value = plain(value)  # numpy scalars -> Python numbers
    if isinstance(value, bool):
      out[key] = int(value)
    elif isinstance(value, (int, float)):
      out[key] = value
  diverged = diverged or objective is None or not math.isfinite(objective)
  out.update({DIVERGED: int(diverged), OBJECTIVE: worst_objective(mode) if diverged else objective,
              NODE_ID: node_id, WORKER_PID: os.getpid()})
  return out


def eval_result(event, *, metric, node_id: str,
                checkpoint_rounds: Collection[int]) -> tuple[dict, Optional[str]]:
  """What a trial reports after an evaluation, and the run directory to checkpoint
  or None. Each checkpoint costs a copy into the trial's storage, so only at
  `checkpoint_rounds` or where a diverged run stops, and only when the pipeline
  has just saved this round, so that the copy resumes exactly here."""
  from tff_fedadamom.experiment import outputs

  history = outputs.read_metrics(event.output_dir)
  value = objective_from_history(history, metric.name, metric.last_k,
                                 upto_round=event.round_num)
  result = _result({**event.metrics, ROUND: int(event.round_num)}, value,
                   bool(event.diverged), metric.mode, node_id)
  due = event.diverged or int(event.round_num) in checkpoint_rounds
  return result, event.output_dir if event.checkpoint_saved and due else None


def trial_environ(threads: int, gpus: bool) -> dict[str, str]:
  """What a trial's process (and TFF's worker_binary, which inherits it) sets
  before TensorFlow starts: kernels on one thread (`tff_fedadamom.session`),
  clients side by side on `threads`, and without a GPU, no GPU visible
  (whatever Ray's default for zero-GPU actors is)."""
  env = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": str(threads),
         "OMP_NUM_THREADS": "1"}
  if not gpus:
    env["CUDA_VISIBLE_DEVICES"] = ""
  return env


class SweepTrial(tune.Trainable):
  """One trial of a sweep, in Tune's class API (bound to `sweep` and
  `checkpoint_rounds` by `tune.with_parameters`). The actor keeps a
  `PartsCache` across trials (`reset_config`), so a trial of a structure it ran
  before builds nothing; a checkpoint is a copy of the run directory, from
  which a restored trial resumes exactly.
  """

  def setup(self, config, *, sweep, checkpoint_rounds: Collection[int] = ()):
    import ray

    from tff_fedadamom.experiment.plan import threads_for_cpus
    from tff_fedadamom.session import Session, startup_imports

    self._sweep = sweep
    self._checkpoint_rounds = frozenset(checkpoint_rounds)
    resources = tune.get_context().get_trial_resources()  # the CPUs Tune gave the trial
    self._threads = threads_for_cpus(
        resources.required_resources.get("CPU", 1) if resources else 1)
    gpus = bool(ray.get_gpu_ids())
    # The actor is its process's entry point: its session goes first.
    with startup_imports():
      Session(threads=self._threads, environ=trial_environ(self._threads, gpus)).apply()
      from tff_fedadamom.experiment.parts_cache import PartsCache
    self._node_id = ray.get_runtime_context().get_node_id()
    # One structure per optimizer recurs trial after trial.
    self._cache = PartsCache(max_size=max(2, len(sweep.optimizers)))
    self._steps = self._scratch = None
    self._start(config)

  def _start(self, config) -> None:
    """Plans the trial `config` names; its rounds start at the first `step`,
    after any checkpoint Tune restores is in place."""
    from tff_fedadamom.config import load_config
    from tff_fedadamom.experiment.parts import make_plan
    from tuning import joint
    from tuning import space as space_lib

    self.cleanup()  # the previous trial's, when the actor is reused
    optimizer, params = joint.split(config)
    self._scratch = tempfile.mkdtemp(prefix=f"tff-trial-{self.trial_id}-")
    self._output_dir = os.path.join(self._scratch, RUN_SUBDIR)
    experiment = space_lib.experiment_dict(
        self._sweep, optimizer, {path: plain(value) for path, value in params.items()},
        output_dir=self._output_dir, threads=self._threads,
        name=f"{self._sweep.name}/{optimizer}/{self.trial_name}")
    self._plan = make_plan(load_config(experiment))

  def step(self) -> dict:
    from tff_fedadamom.experiment.runner import iter_experiment

    if self._steps is None:
      self._steps = iter_experiment(
          self._plan, parts=self._cache.get(self._plan), progress=False,
          model_and_plot=False, checkpoint_rounds=self._checkpoint_rounds)
    for end in self._steps:
      if end.evaluated:
        result, checkpoint_dir = eval_result(
            end.eval_event(self._output_dir), metric=self._sweep.metric,
            node_id=self._node_id, checkpoint_rounds=self._checkpoint_rounds)
        return {**result, tune.result.SHOULD_CHECKPOINT: checkpoint_dir is not None,
                tune.result.DONE: end.final}
    # Nothing left to run: the run directory held a finished run (a restored
    # final checkpoint); its last evaluation is the trial's result.
    return {**self._finished_result(), tune.result.DONE: True}

  def _finished_result(self) -> dict:
    from tff_fedadamom.experiment import outputs

    metric = self._sweep.metric
    rows = [row for row in outputs.read_metrics(self._output_dir) if evaluated(row)]
    value = objective_from_history(rows, metric.name, metric.last_k)
    return _result(rows[-1] if rows else {}, value, False, metric.mode, self._node_id)

  def save_checkpoint(self, checkpoint_dir: str) -> None:
    shutil.copytree(self._output_dir, checkpoint_dir, dirs_exist_ok=True)

  def load_checkpoint(self, checkpoint_dir: str) -> None:
    self._end_run()
    shutil.rmtree(self._output_dir, ignore_errors=True)
    shutil.copytree(checkpoint_dir, self._output_dir)  # the run resumes from it exactly

  def reset_config(self, new_config) -> bool:
    self._start(new_config)
    return True

  def _end_run(self) -> None:
    """Ends the current run where it stands (its hooks close)."""
    if self._steps is not None:
      self._steps.close()
      self._steps = None

  def cleanup(self) -> None:
    self._end_run()
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)
      self._scratch = None
