"""The Tune trainable: one trial = one experiment through `run_experiment`.

A plain function trainable. It builds the trial's experiment (the sweep's base,
the optimizer, the sampled hparams, a private run directory), restores the run
directory from `tune.get_checkpoint()` when Tune restarts the trial (after a
crash, or when a sweep is resumed), and runs the project's one training loop
with a callback that calls `tune.report` after every evaluation, with the run
directory as the checkpoint where one is needed: at ASHA's rungs, at the last
round, and where a diverged run stops (`eval_result`). In a sweep the rounds
run in a long-lived worker that keeps the built experiment between trials
(`tuning.workers`); this process then only reports. The last checkpoint of a
trial (where it ended) holds the run's metrics.csv, config.yaml, TensorBoard
events and program state; the run directory itself is deleted when the trial
ends.

What each report holds: the evaluation's flat metrics (`test/accuracy`,
`train/loss`, ...), `round`, `objective` (the sweep's metric averaged over the
last k evaluations; the one value the TuneConfig optimises), `diverged` (0/1),
`node_id` and `worker_pid`, the process that ran the rounds (Tune adds
`hostname`, `node_ip` and `pid`, the trainable's process, itself). A diverged
trial reports `objective = worst_objective(mode)`, a finite value no real
metric reaches, so it can never be chosen as best, and ASHA's cut-offs (which
interpolate between recorded values) stay finite.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import uuid
from typing import Any, Callable, Collection, Iterable, Mapping, Optional

from tff_fedadamom.metric_names import ROUND, evaluated
from tff_fedadamom.experiment.loop import RoundHook
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
  """`rows` (each with a `round`) in round order, one per round, the last row
  of a round winning. A round appears twice when a run resumed from a
  checkpoint older than its last row: a restarted trial reports again the
  rounds after its latest Tune checkpoint, with the same values."""
  by_round = {}
  for row in rows:
    by_round[int(row[ROUND])] = row
  return [by_round[r] for r in sorted(by_round)]


def objective_from_history(history: Iterable[Mapping[str, Any]], metric: str, last_k: int,
                           upto_round: Optional[int] = None) -> Optional[float]:
  """Mean of `metric` over the last `last_k` evaluations (fewer if fewer exist).

  `history` holds per-round rows with a `round` key (the pipeline's metrics.csv
  or a summary's history); only evaluation rows (those with a `test/` metric)
  count, so that a `train/` metric is averaged over the same rounds as a test
  one. A round seen twice (a resumed run) counts once, its last row winning.
  Rows after `upto_round` are ignored. None when no evaluation has the metric;
  NaN when one of the values is not finite.
  """
  rows = one_row_per_round(
      row for row in history
      if evaluated(row) and metric in row and (upto_round is None or row[ROUND] <= upto_round))
  values = [float(row[metric]) for row in rows][-last_k:]
  if not values:
    return None
  if not all(math.isfinite(v) for v in values):
    return math.nan
  return sum(values) / len(values)


def trial_threads() -> int:
  """The threads of this trial: from the CPUs Tune gave it (`threads_for_cpus`)."""
  from ray import tune

  from tff_fedadamom.experiment.plan import threads_for_cpus

  resources = tune.get_context().get_trial_resources()
  return threads_for_cpus(resources.required_resources.get("CPU", 1) if resources else 1)


def trial_session(threads: int, gpu: bool):
  """The `Session` of a trial that runs in its own process (no worker pool).

  Its environment sizes what the thread settings cannot reach: TFF's
  worker_binary, a child process with its own TensorFlow runtime, where the
  federated computations run. A trial without a GPU is kept off the node's
  GPUs whatever Ray's default for zero-GPU tasks is (it is changing); one
  with a GPU keeps the devices Ray shows it.
  """
  from tff_fedadamom.session import Session
  from tuning.workers import worker_env

  env = worker_env(threads, [])
  if gpu:
    del env["CUDA_VISIBLE_DEVICES"]
  return Session(threads=threads, environ=env)


def _numbers(metrics: Mapping[str, Any]) -> dict:
  out = {}
  for key, value in metrics.items():
    value = plain(value)  # numpy scalars -> Python numbers
    if isinstance(value, bool):
      out[key] = int(value)
    elif isinstance(value, (int, float)):
      out[key] = value
  return out


def eval_result(event, *, metric, node_id: str,
                checkpoint_rounds: Collection[int]) -> tuple[dict, Optional[str]]:
  """What a trial reports after an evaluation: (result, the run directory to
  checkpoint or None). Runs where the run runs (the trial's worker).

  The run directory goes to Tune only where a checkpoint is needed: at
  `checkpoint_rounds` (`tuning.sweep.checkpoint_rounds`: ASHA's rungs and the
  last round), or where the run stops because it diverged; and only when the
  pipeline has just saved this round (`checkpoint_saved`), so that the copy
  resumes exactly here. Each Tune checkpoint costs a copy of the run directory
  into the trial's storage and a registration by the driver; between them a
  restart runs the rounds after the latest checkpoint again, with the same
  results."""
  from tff_fedadamom.experiment import outputs

  history = outputs.read_metrics(event.output_dir)
  value = objective_from_history(history, metric.name, metric.last_k,
                                 upto_round=event.round_num)
  diverged = bool(event.diverged) or value is None or not math.isfinite(value)
  result = _numbers(event.metrics)
  result.update({ROUND: int(event.round_num), DIVERGED: int(diverged),
                 OBJECTIVE: worst_objective(metric.mode) if diverged else value,
                 NODE_ID: node_id, WORKER_PID: os.getpid()})
  due = event.diverged or int(event.round_num) in checkpoint_rounds
  return result, event.output_dir if event.checkpoint_saved and due else None


class TuneReport(RoundHook):
  """The round hook a trial's run reports through: after every evaluation,
  `report(make_result(event))` with the round's `EvalEvent`. It runs after the
  run's own hooks, so the round's metrics row and checkpoint are on disk when
  `make_result` reads them.

  Args:
    output_dir: The trial's run directory.
    make_result: `EvalEvent -> (result, checkpoint_dir or None)` (`eval_result`).
    report: Hands that pair to Tune (`_report_to_tune`).
  """

  def __init__(self, output_dir: str, make_result: Callable, report: Callable):
    self._output_dir = output_dir
    self._make_result = make_result
    self._report = report

  def end_round(self, end) -> None:
    if end.evaluated:
      self._report(self._make_result(end.eval_event(self._output_dir)))


def _report_to_tune(payload) -> None:
  """Hands `eval_result`'s (result, checkpoint directory or None) to Tune."""
  from ray import tune

  result, checkpoint_dir = payload
  if checkpoint_dir is not None:
    tune.report(result, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))
  else:
    tune.report(result)


def train_trial(config: dict, *, sweep, optimizer: Optional[str], pool: Optional[str],
                checkpoint_rounds: Collection[int]) -> None:
  """Runs one trial: of `optimizer` with the hparams `config`, or of the
  optimizer and hparams that `config` names (`tuning.joint.split`).

  Bound to `sweep`, `optimizer`, `pool` and `checkpoint_rounds` (the rounds
  whose reports carry a checkpoint, `tuning.sweep.checkpoint_rounds`, and the
  only rounds whose state the run saves: Tune keeps no other) with
  `tune.with_parameters` by `run_sweep`. With `pool` (a `tuning.workers`
  pool's name) the trial runs in a long-lived worker of that pool and this
  process only reports; without, it runs here, in a process of its own.
  """
  import ray
  from ray import tune

  from tuning import joint
  from tuning import space as space_lib

  optimizer, config = joint.split(config, optimizer)
  threads = trial_threads()
  gpu_ids = [str(g) for g in ray.get_gpu_ids()]
  context = tune.get_context()
  # The run directory is private scratch on this node: Tune's trial directory is
  # synced by the driver while the run writes (and would race with its temp
  # files). What outlives the trial is what it reports, and its checkpoints.
  # Without a pool, one name per trial: a restart (after a crash) replaces what
  # a killed attempt left here. With one, a name per attempt: a worker may
  # still be giving up a killed attempt, and removes its directory itself.
  attempt = f"-{uuid.uuid4().hex[:8]}" if pool else ""
  scratch = os.path.join(tempfile.gettempdir(),
                         f"tff-trial-{context.get_trial_id()}{attempt}")
  shutil.rmtree(scratch, ignore_errors=True)
  output_dir = os.path.join(scratch, RUN_SUBDIR)
  checkpoint = tune.get_checkpoint()
  if checkpoint is not None:
    checkpoint.to_directory(output_dir)  # run_experiment resumes from it exactly
  params = {path: plain(value) for path, value in config.items()}
  make_experiment = functools.partial(
      space_lib.experiment_dict, sweep, optimizer, params, output_dir=output_dir,
      threads=threads, name=f"{sweep.name}/{optimizer}/{context.get_trial_name()}")
  make_result = functools.partial(eval_result, metric=sweep.metric,
                                  node_id=ray.get_runtime_context().get_node_id(),
                                  checkpoint_rounds=checkpoint_rounds)
  try:
    if pool is not None:
      from tuning import workers

      workers.run_trial(pool, make_experiment, make_result, _report_to_tune, threads=threads,
                        gpu_ids=gpu_ids, scratch=scratch, checkpoint_rounds=checkpoint_rounds)
      return
    # The trial owns its process: its session goes first, before TensorFlow runs.
    trial_session(threads, gpu=bool(gpu_ids)).apply()
    from tff_fedadamom.experiment import run_experiment

    # The run closes the parts it builds (a tff_cpp backend's worker_binary with them).
    run_experiment(make_experiment(),
                   hooks=[TuneReport(output_dir, make_result, _report_to_tune)],
                   progress=False, model_and_plot=False, checkpoint_rounds=checkpoint_rounds)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
