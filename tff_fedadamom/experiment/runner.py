"""Runs an experiment: the project's one training loop (`loop.iter_rounds`) put
together from its `hooks`; resuming and repairing a run directory is `resume`'s.

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
from tff_fedadamom.atomic_io import atomic_write_json
from tff_fedadamom.config import ConfigError, dump_config, load_config
from tff_fedadamom.experiment import hooks as hooks_lib
from tff_fedadamom.experiment import outputs, resume, tensorboard_events
from tff_fedadamom.experiment.loop import (ROUND, EvalEvent, RoundEnd, RoundHook, drain,
                                          iter_rounds)
from tff_fedadamom.experiment.plan import RunPlan

__all__ = ["EvalEvent", "RunResult", "iter_experiment", "run_experiment"]


@dataclasses.dataclass(frozen=True)
class RunResult:
  output_dir: str
  summary: Mapping[str, Any]


def _progress_bar(config, start_round: int, devices):
  from tqdm import tqdm

  device_label = ",".join(d.split("device:")[-1] for d in devices)  # 'GPU:0,GPU:1'
  return tqdm(total=config.rounds, initial=start_round, unit="round", dynamic_ncols=True,
              desc=f"{config.name or config.server.optimizer} [{device_label}]", leave=True)


def run_experiment(config, *, overrides=(),
                   on_eval: Optional[Callable[[EvalEvent], None]] = None,
                   on_round: Optional[Callable[[int, Mapping[str, float]], None]] = None,
                   progress: bool = True, parts=None, hooks: Sequence[RoundHook] = (),
                   model_and_plot: bool = True,
                   checkpoint_rounds: Optional[Collection[int]] = None) -> RunResult:
  """Runs (or resumes) the experiment a config describes and returns its
  `RunResult`: `iter_experiment` (which documents the arguments) to its end."""
  return drain(iter_experiment(
      config, overrides=overrides, on_eval=on_eval, on_round=on_round, progress=progress,
      parts=parts, hooks=hooks, model_and_plot=model_and_plot,
      checkpoint_rounds=checkpoint_rounds))


def iter_experiment(config, *, overrides=(),
                    on_eval: Optional[Callable[[EvalEvent], None]] = None,
                    on_round: Optional[Callable[[int, Mapping[str, float]], None]] = None,
                    progress: bool = True, parts=None,
                    hooks: Sequence[RoundHook] = (), model_and_plot: bool = True,
                    checkpoint_rounds: Optional[Collection[int]] = None
                    ) -> Generator[RoundEnd, None, RunResult]:
  """Runs (or resumes) the experiment a config describes: a generator of each
  round's `loop.RoundEnd` once its metrics row and checkpoint are written, whose
  value is the `RunResult` (the output directory and the summary written
  there). Closing it early ends the run where it stands (a later run resumes).

  Args:
    config: A `plan.RunPlan` (`parts.make_plan`), an `ExperimentConfig`, a YAML
      path or a mapping. Anything but a plan is planned here, once.
    overrides: Dotted `key=value` overrides, applied before validation.
    on_eval, on_round: Called with an `EvalEvent` after every evaluation, with
      (round, flat metrics) after every round.
    progress: Show a progress bar on stderr.
    parts: `parts.ExperimentParts` to run with (`PartsCache.get(plan)`): parts
      built for any config of the same `structure_key` give the same results.
    hooks: More `loop.RoundHook`s, called last, when the round's metrics and
      checkpoint are written.
    model_and_plot: Write `model.keras` and `curves.png` at the end
      (`summary.json` is written either way). A sweep trial's directory ends
      with the trial, and on a small model these cost about its rounds.
    checkpoint_rounds: Save the state at these rounds (and the final one)
      instead of every `checkpoint_every` rounds (`hooks.Checkpoint`).
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
  if parts is not None and parts.key != plan.key:
    raise ValueError("run_experiment `parts` were built for a config of another "
                     "structure (model, data, client set-up, ...); build them with "
                     "build_parts(config) or PartsCache.get(config)")
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

  from tff_fedadamom.experiment import parts as parts_lib

  config, devices = plan.config, list(plan.devices)
  output_dir = config.output_dir
  data, process = parts.data, parts.process
  process, sampler = _process_and_sampler(config, process, data.train.client_ids)
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
    # The run's hooks, in the order `hooks` documents; the caller's come last.
    round_hooks = [hooks_lib.Telemetry(
        process, parts.layer_names, config.server.hparams.get("epsilon"),
        config.histogram_every, histogram_writer)] if config.telemetry else []
    round_hooks += [hooks_lib.Divergence(config.diverge_patience),
                    hooks_lib.Evaluate(parts.evaluator, config.eval_every),
                    hooks_lib.ElapsedTime(started),
                    hooks_lib.Release([csv_manager, tb_manager], run_async),
                    hooks_lib.Checkpoint(state_manager, config.checkpoint_every, run_async,
                                         rounds=checkpoint_rounds)]
    if bar is not None:
      round_hooks.append(hooks_lib.Progress(bar))
    if on_round is not None:
      round_hooks.append(hooks_lib.OnRound(on_round))
    if on_eval is not None:
      round_hooks.append(hooks_lib.OnEval(on_eval, output_dir))
    result = yield from iter_rounds(process, state, range(start_round + 1, config.rounds + 1),
                                    sampler, round_hooks + list(hooks))
  finally:
    run_async.close()
    tb_manager.close()
    histogram_writer.close()
  wall = time.perf_counter() - started
  summary = _write_results(plan, parts.evaluator if model_and_plot else None,
                           process, result, wall=wall, start_round=start_round)
  return RunResult(output_dir, summary)


def _process_and_sampler(config, process, client_ids):
  """The backend and its uniform sampler, or with `asynchronous` its rounds as
  asynchronous server steps (`runtime.buffered`) and their sampler."""
  from tff_fedadamom.data.sampling import UniformSampler

  _check_clients(config, "clients_per_round", config.clients_per_round, len(client_ids))
  sampler = UniformSampler(client_ids, config.clients_per_round, config.seed)
  if config.asynchronous is None:
    return process, sampler
  from tff_fedadamom.runtime.buffered import buffered_process

  _check_clients(config, "asynchronous.concurrency", config.asynchronous.concurrency,
                 len(client_ids))
  buffered = buffered_process(process, config, client_ids)
  return buffered, buffered.step_clients


def _check_clients(config, field: str, value: int, clients: int) -> None:
  """ConfigError when `field` asks for more than the data set's `clients` clients."""
  if value > clients:
    raise ConfigError(
        "<config>", field, f"more than the {clients} clients of data set {config.data.name!r}",
        value=value, allowed=f"an integer in [1, {clients}]")


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
      model_path = os.path.join(output_dir, outputs.MODEL_FILE)
      evaluator.model_to_save().save(model_path + ".tmp.keras")
      os.replace(model_path + ".tmp.keras", model_path)
    outputs.plot_curves({config.server.optimizer: history},
                        os.path.join(output_dir, outputs.CURVES_FILE),
                        title=config.name or os.path.basename(output_dir.rstrip("/")))
  summary = outputs.summarize(
      history, targets=config.targets, status=status, diverged_round=result.diverged_round,
      wall_time_s=wall, rounds_run=result.rounds_run, devices=list(plan.devices),
      extra={"optimizer": config.server.optimizer, "seed": config.seed,
             "backend": plan.backend, "kernel_threads": session.kernel_threads(),
             "resumed_from_round": start_round or None})
  atomic_write_json(os.path.join(output_dir, outputs.SUMMARY_FILE), summary)
  return summary
