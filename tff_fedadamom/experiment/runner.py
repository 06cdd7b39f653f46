"""Runs an experiment: rounds, client sampling, evaluation, checkpoints, outputs.

The one training loop of the project (`loop.iter_rounds`), put together from its
hooks (`hooks`); a Ray Tune trial steps it one evaluation at a time. Resuming
and repairing a run directory is `resume`'s.

Reproducibility: the partition depends on `data.seed` only, client sampling on
(seed, round), each client's shuffle on (seed, round, client), and the model's
initial weights on `seed`. Nothing touches a global RNG, so a run resumed from a
checkpoint samples and trains exactly as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Collection, Generator, Mapping, Optional, Sequence

from tff_fedadamom import session
from tff_fedadamom.config import ConfigError, dump_config, load_config
from tff_fedadamom.experiment import hooks as hooks_lib
from tff_fedadamom.experiment import outputs, resume, tensorboard_events
from tff_fedadamom.experiment.loop import ROUND, EvalEvent, RoundEnd, RoundHook, iter_rounds
from tff_fedadamom.experiment.plan import RunPlan

__all__ = ["EvalEvent", "RunResult", "iter_experiment", "run_experiment"]


@dataclasses.dataclass(frozen=True)
class RunResult:
  output_dir: str
  summary: Mapping[str, Any]


def _device_label(devices) -> str:
  """'GPU:0,GPU:1' for the progress line."""
  return ",".join(d.split("device:")[-1] for d in devices)


def _progress_bar(config, start_round: int, devices):
  from tqdm import tqdm

  return tqdm(total=config.rounds, initial=start_round, unit="round", dynamic_ncols=True,
              desc=f"{config.name or config.server.optimizer} [{_device_label(devices)}]",
              leave=True)


def _round_hooks(config, parts, process, *, started, state_manager, release_managers, histogram_writer,
                 bar, on_round, on_eval, run_async, checkpoint_rounds) -> list[RoundHook]:
  """The hooks of a run, in the order `hooks` documents."""
  hooks = []
  if config.telemetry:
    hooks.append(hooks_lib.Telemetry(
        process, parts.layer_names, config.server.hparams.get("epsilon"),
        config.histogram_every, histogram_writer))
  hooks += [hooks_lib.Divergence(config.diverge_patience),
            hooks_lib.Evaluate(parts.evaluator, config.eval_every),
            hooks_lib.ElapsedTime(started),
            hooks_lib.Release(release_managers, run_async),
            hooks_lib.Checkpoint(state_manager, config.checkpoint_every, run_async,
                                 rounds=checkpoint_rounds)]
  if bar is not None:
    hooks.append(hooks_lib.Progress(bar))
  if on_round is not None:
    hooks.append(hooks_lib.OnRound(on_round))
  if on_eval is not None:
    hooks.append(hooks_lib.OnEval(on_eval, config.output_dir))
  return hooks


def run_experiment(config, *, overrides=(),
                   on_eval: Optional[Callable[[EvalEvent], None]] = None,
                   on_round: Optional[Callable[[int, Mapping[str, float]], None]] = None,
                   progress: bool = True, parts=None, hooks: Sequence[RoundHook] = (),
                   model_and_plot: bool = True,
                   checkpoint_rounds: Optional[Collection[int]] = None) -> RunResult:
  """Runs (or resumes) the experiment a config describes and returns its
  `RunResult`: `iter_experiment` (which documents the arguments) to its end."""
  steps = iter_experiment(config, overrides=overrides, on_eval=on_eval, on_round=on_round,
                          progress=progress, parts=parts, hooks=hooks,
                          model_and_plot=model_and_plot, checkpoint_rounds=checkpoint_rounds)
  while True:
    try:
      next(steps)
    except StopIteration as done:
      return done.value


def iter_experiment(config, *, overrides=(),
                    on_eval: Optional[Callable[[EvalEvent], None]] = None,
                    on_round: Optional[Callable[[int, Mapping[str, float]], None]] = None,
                    progress: bool = True, parts=None,
                    hooks: Sequence[RoundHook] = (), model_and_plot: bool = True,
                    checkpoint_rounds: Optional[Collection[int]] = None
                    ) -> Generator[RoundEnd, None, RunResult]:
  """Runs (or resumes) the experiment a config describes, round by round: a
  generator of each round's `loop.RoundEnd` (after the run's hooks, so its
  metrics row and checkpoint are written), whose value is the `RunResult`.
  A Ray Tune trainable steps it one evaluation at a time; closing it early
  ends the run where it stands (a later run resumes from its checkpoints).

  Args:
    config: A `plan.RunPlan` (`parts.make_plan`), an `ExperimentConfig`, a YAML
      path or a mapping. Anything but a plan is planned here, once.
    overrides: Dotted `key=value` overrides, applied before validation.
    on_eval: Called after every evaluation with an `EvalEvent`.
    on_round: Called after every round with (round, flat metrics).
    progress: Show a progress bar on stderr.
    parts: `parts.ExperimentParts` to run with (from `PartsCache.get(plan)`)
      instead of building them: built for any config of the same
      `structure_key`, they give the same results as parts built for this one.
    hooks: More `loop.RoundHook`s, called after the run's own (and after
      `on_round` and `on_eval`), when the round's metrics and checkpoint are
      written.
    model_and_plot: Write the final model (`model.keras`) and the curves plot
      (`curves.png`) at the end; `summary.json` is written either way. A sweep
      trial's run directory is scratch that ends with the trial, after its last
      Tune checkpoint, so its trials do without them (on a small model they
      cost about as much as the trial's rounds).
    checkpoint_rounds: Save the state at these rounds (and the final one)
      instead of every `checkpoint_every` rounds: for a caller that keeps only
      those checkpoints (a sweep trial, `tuning.sweep.checkpoint_rounds`).

  Returns (as the generator's value):
    A `RunResult` with the output directory and the summary written there.
  """
  from tff_fedadamom.experiment import parts as parts_lib

  if isinstance(config, RunPlan) and not overrides:
    plan = config
  else:
    plan = parts_lib.make_plan(load_config(getattr(config, "config", config), overrides))
  outputs.check_writable(plan.config.output_dir)
  resuming = resume.check_resumable(plan.config, plan.config.output_dir)
  session.release_tff_at_exit()
  session.kernel_threads()  # warns once when the numbers may depend on the cores
  parts_lib.check_parts(plan, parts)
  own_parts = parts is None  # parts given by the caller outlive this run
  parts = parts if parts is not None else parts_lib.build_parts(plan)
  try:
    return (yield from _run(plan, parts, resuming=resuming, on_eval=on_eval, on_round=on_round,
                progress=progress, hooks=hooks, model_and_plot=model_and_plot,
                checkpoint_rounds=checkpoint_rounds))
  finally:
    # After the results: writing them reads the final model's weights, which a
    # backend (tff_cpp's worker_binary) computes.
    if own_parts:
      parts.process.close()


def _run(plan, parts, *, resuming, on_eval, on_round, progress, hooks,
         model_and_plot, checkpoint_rounds) -> Generator[RoundEnd, None, RunResult]:
  """The rounds of `iter_experiment` on `parts`, and its results."""
  import tensorflow_federated as tff

  from tff_fedadamom.data.sampling import UniformSampler
  from tff_fedadamom.experiment import parts as parts_lib

  config, devices = plan.config, list(plan.devices)
  output_dir = config.output_dir
  data, process = parts.data, parts.process
  if config.clients_per_round > len(data.train.client_ids):
    raise ConfigError(
        "<config>", "clients_per_round", f"more than the {len(data.train.client_ids)} "
        f"clients of data set {config.data.name!r}", value=config.clients_per_round,
        allowed=f"an integer in [1, {len(data.train.client_ids)}]")
  sampler = UniformSampler(data.train.client_ids, config.clients_per_round, config.seed)
  if config.asynchronous is not None:
    process, sampler = _buffered(config, process, data.train.client_ids)
  if not resuming:
    dump_config(config, os.path.join(output_dir, outputs.CONFIG_FILE))

  state_manager = resume.state_manager(output_dir)
  state, start_round = resume.restore(
      state_manager, parts_lib.initial_state(plan, process), output_dir)
  csv_manager = tff.program.CSVFileReleaseManager(
      os.path.join(output_dir, outputs.METRICS_FILE), key_fieldname=ROUND)
  finished = resume.finished_summary(output_dir, start_round, config.rounds)
  if finished is not None:
    return RunResult(output_dir, finished)
    yield  # a generator even when there is nothing left to run

  tb_dir = os.path.join(output_dir, outputs.TENSORBOARD_DIR)
  tb_manager = tensorboard_events.ReleaseManager(tb_dir)
  histogram_writer = tensorboard_events.EventWriter(os.path.join(tb_dir, "histograms"))
  bar = _progress_bar(config, start_round, devices) if progress else None
  started = time.perf_counter()
  run_async = hooks_lib.EventLoop()
  try:
    result = yield from iter_rounds(
        process, state, range(start_round + 1, config.rounds + 1), sampler,
        _round_hooks(config, parts, process, started=started, state_manager=state_manager,
                     release_managers=[csv_manager, tb_manager],
                     histogram_writer=histogram_writer, bar=bar, on_round=on_round,
                     on_eval=on_eval, run_async=run_async,
                     checkpoint_rounds=checkpoint_rounds) + list(hooks))
  finally:
    run_async.close()
    tb_manager.close()
    histogram_writer.close()
  wall = time.perf_counter() - started
  summary = _write_results(plan, parts.evaluator if model_and_plot else None,
                           process, result, wall=wall, start_round=start_round)
  return RunResult(output_dir, summary)


def _buffered(config, process, client_ids):
  """(The backend's rounds as asynchronous server steps, their sampler)."""
  from tff_fedadamom.runtime.buffered import buffered_process

  if config.asynchronous.concurrency > len(client_ids):
    raise ConfigError(
        "<config>", "asynchronous.concurrency", f"more than the {len(client_ids)} clients of "
        f"data set {config.data.name!r}", value=config.asynchronous.concurrency,
        allowed=f"an integer in [1, {len(client_ids)}]")
  buffered = buffered_process(process, config, client_ids)
  return buffered, buffered.step_clients


def _write_results(plan, evaluator, process, result, *, wall: float,
                   start_round: int) -> dict:
  """The run's summary, and with an `evaluator` its model (if it completed) and
  curves plot."""
  config = plan.config
  output_dir = config.output_dir
  status = "completed" if result.diverged_round is None else "diverged"
  history = outputs.read_metrics(output_dir)
  if evaluator is not None:
    process.get_model_weights(result.state).assign_weights_to(evaluator.compiled_model())
    if status == "completed":
      evaluator.model_to_save().save(os.path.join(output_dir, outputs.MODEL_FILE) + ".tmp.keras")
      os.replace(os.path.join(output_dir, outputs.MODEL_FILE) + ".tmp.keras",
                 os.path.join(output_dir, outputs.MODEL_FILE))
    outputs.plot_curves({config.server.optimizer: history},
                        os.path.join(output_dir, outputs.CURVES_FILE),
                        title=config.name or os.path.basename(output_dir.rstrip("/")))
  summary = outputs.summarize(
      history, targets=config.targets, status=status, diverged_round=result.diverged_round,
      wall_time_s=wall, rounds_run=result.rounds_run, devices=list(plan.devices),
      extra={"optimizer": config.server.optimizer, "seed": config.seed,
             "backend": plan.backend, "kernel_threads": session.kernel_threads(),
             "resumed_from_round": start_round or None})
  outputs.write_summary(output_dir, summary)
  return summary
