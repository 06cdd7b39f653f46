"""Runs an experiment: rounds, client sampling, evaluation, checkpoints, outputs.

The one training loop of the project. `tff-fedadamom run` passes a callback that
drives the progress bar; the Ray Tune trainable passes one that reports to Tune.

Reproducibility: the partition depends on `data.seed` only, client sampling on
(seed, round), each client's shuffle on (seed, round, client), and the model's
initial weights on `seed`. Nothing touches a global RNG, so a run resumed from a
checkpoint samples and trains exactly as an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import re
import time
from typing import Any, Callable, Mapping, Optional

import numpy as np

from tff_fedadamom.config import ConfigError, ExperimentConfig, config_to_dict, dump_config
from tff_fedadamom.config import load_config
from tff_fedadamom.config.loader import first_difference
from tff_fedadamom.pipeline import outputs, runtime

logger = logging.getLogger("tff_fedadamom")


@dataclasses.dataclass(frozen=True)
class EvalEvent:
  """What a callback sees after each evaluation.

  Attributes:
    round_num: Rounds completed so far.
    metrics: Flat metrics of this round (`train/loss`, `test/accuracy`, ...).
    diverged: True when the run stops here because it diverged.
    output_dir: The run directory; with `checkpoint_saved`, copying it back
      lets a later run resume from this round.
    checkpoint_saved: Whether a checkpoint of this round was just written.
  """

  round_num: int
  metrics: Mapping[str, float]
  diverged: bool
  output_dir: str
  checkpoint_saved: bool


@dataclasses.dataclass(frozen=True)
class RunResult:
  output_dir: str
  summary: Mapping[str, Any]


def sample_clients(client_ids, clients_per_round: int, seed: int, round_num: int) -> list:
  """`clients_per_round` distinct clients, a function of (seed, round) only."""
  rng = np.random.default_rng([seed, round_num])
  picked = rng.choice(len(client_ids), size=clients_per_round, replace=False)
  return [client_ids[i] for i in picked]


def flatten_round_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The useful scalars of a learning process's round metrics, with flat names."""
  from tff_fedadamom.models import ACCURACY_METRIC

  train = metrics.get("client_work", {}).get("train", {})
  out = {
      "train/loss": float(train.get("loss", math.nan)),
      "train/accuracy": float(train.get(ACCURACY_METRIC, math.nan)),
      "train/num_examples": float(train.get("num_examples", 0)),
  }
  finalizer = metrics.get("finalizer", {})
  out["nonfinite_updates"] = float(finalizer.get("update_non_finite", 0))
  return out


def layer_labels(keras_model) -> list[str]:
  """Stable names of the trainable variables, in TFF's order: position plus the
  variable path without Keras' per-process uniquifying suffix ('dense_3' ->
  'dense'), so that a resumed run writes the same metric columns."""
  labels = []
  for i, variable in enumerate(keras_model.trainable_variables):
    parts = variable.name.split(":")[0].split("/")
    parts[0] = re.sub(r"_\d+$", "", parts[0])
    labels.append(f"{i:02d}_" + "/".join(parts))
  return labels


def _device_label(devices) -> str:
  """'GPU:0,GPU:1' for the progress line."""
  return ",".join(d.split("device:")[-1] for d in devices)


def _all_finite(structure) -> bool:
  import tensorflow as tf

  return all(np.all(np.isfinite(np.asarray(x))) for x in tf.nest.flatten(structure))


def _check_resumable(config: ExperimentConfig, output_dir: str) -> bool:
  """True if `output_dir` holds a run of this config to resume; error if another."""
  saved_path = os.path.join(output_dir, outputs.CONFIG_FILE)
  if not os.path.exists(saved_path):
    return False
  saved = config_to_dict(load_config(saved_path))
  current = config_to_dict(config)
  for section in ("runtime", "output_dir", "rounds", "name"):
    saved.pop(section, None)
    current.pop(section, None)
  if saved != current:
    diff = first_difference(saved, current)
    raise ConfigError(
        str(saved_path), diff,
        "output_dir already holds a run of a different config; use another "
        "output_dir or delete this one",
        allowed="the same config as the saved run (only rounds, runtime and name may change)")
  return True


def _load_checkpoint(manager, structure, root_dir: str, at_most: Optional[int] = None):
  """The newest checkpoint that loads; falls back past corrupt ones.

  An unreadable checkpoint is moved aside to `checkpoints_corrupt/` (kept for
  inspection), so that the round can be saved again when the run redoes it.
  """
  import shutil

  versions = asyncio.run(manager.get_versions()) or []
  if at_most is not None:
    versions = [v for v in versions if v <= at_most]
  for version in sorted(versions, reverse=True):
    try:
      return asyncio.run(manager.load(version, structure)), version
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped
      logger.warning("checkpoint of round %d is unreadable (%s); trying an older one",
                     version, str(e).splitlines()[0][:200])
      path = manager._get_path_for_version(version)  # noqa: SLF001
      aside = os.path.join(os.path.dirname(root_dir), "checkpoints_corrupt",
                           f"{os.path.basename(path)}_{int(time.time())}")
      os.makedirs(os.path.dirname(aside), exist_ok=True)
      shutil.move(path, aside)
  if versions and at_most is None:
    raise RuntimeError(
        f"every checkpoint in {root_dir} is unreadable (moved to checkpoints_corrupt/); "
        "delete the output directory to start over")
  return None, 0


def _drop_checkpoints_after(manager, round_num: int) -> None:
  """Deletes checkpoints newer than `round_num`: the run redoes those rounds."""
  import shutil

  for version in asyncio.run(manager.get_versions()) or []:
    if version > round_num:
      shutil.rmtree(manager._get_path_for_version(version))  # noqa: SLF001


def run_experiment(config, *, overrides=(), on_eval: Optional[Callable[[EvalEvent], None]] = None,
                   on_round: Optional[Callable[[int, Mapping[str, float]], None]] = None,
                   progress: bool = True, parts=None) -> RunResult:
  """Runs (or resumes) the experiment a config describes.

  Args:
    config: An `ExperimentConfig`, a YAML path or a mapping.
    overrides: Dotted `key=value` overrides, applied before validation.
    on_eval: Called after every evaluation with an `EvalEvent`.
    on_round: Called after every round with (round, flat metrics).
    progress: Show a progress bar on stderr.
    parts: `parts.ExperimentParts` to run with (from `PartsCache.get(config)`)
      instead of building them: built for any config of the same
      `structure_key`, they give the same results as parts built for this one.

  Returns:
    A `RunResult` with the output directory and the summary written there.
  """
  config = load_config(config, overrides)
  output_dir = config.output_dir
  outputs.check_writable(output_dir)
  resuming = _check_resumable(config, output_dir)
  summary_path = os.path.join(output_dir, outputs.SUMMARY_FILE)
  runtime.configure_threads(config.runtime.threads)
  devices = runtime.round_devices(config.runtime)

  import tensorflow as tf
  import tensorflow_federated as tff

  from tff_fedadamom.pipeline import parts as parts_lib
  from tff_fedadamom.pipeline import process as process_lib
  from tff_fedadamom.pipeline import telemetry as telemetry_lib

  parts_lib.check_parts(config, parts)
  own_parts = parts is None  # parts given by the caller outlive this run
  parts = parts if parts is not None else parts_lib.build_parts(config)
  data = parts.data
  if config.clients_per_round > len(data.train.client_ids):
    raise ConfigError(
        "<config>", "clients_per_round", f"more than the {len(data.train.client_ids)} "
        f"clients of data set {config.data.name!r}", value=config.clients_per_round,
        allowed=f"an integer in [1, {len(data.train.client_ids)}]")
  if not resuming:
    dump_config(config, os.path.join(output_dir, outputs.CONFIG_FILE))
  process, keras_model, evaluator = parts.process, parts.keras_model, parts.evaluator
  layer_names = list(parts.layer_names)

  checkpoint_dir = os.path.join(output_dir, outputs.CHECKPOINT_DIR)
  state_manager = tff.program.FileProgramStateManager(
      checkpoint_dir, prefix="round_", keep_total=3, keep_first=False)
  tb_dir = os.path.join(output_dir, outputs.TENSORBOARD_DIR)
  tb_manager = tff.program.TensorBoardReleaseManager(tb_dir)
  histogram_writer = tf.summary.create_file_writer(os.path.join(tb_dir, "histograms"))

  state = parts_lib.initial_state(config, process)
  # The state is saved flat: TFF's saver cannot serialize the dicts inside
  # LearningAlgorithmState, and the initial state gives the structure back.
  restored, start_round = _load_checkpoint(state_manager, tf.nest.flatten(state), checkpoint_dir)
  if restored is not None:
    state = tf.nest.pack_sequence_as(state, list(restored))
  complete = outputs.repair_metrics(output_dir, start_round)
  if complete < start_round:
    # Metrics rows the checkpoint covers were lost (a kill mid-write): go back to
    # the newest checkpoint whose rounds all have their rows, or start over.
    restored, start_round = _load_checkpoint(state_manager, tf.nest.flatten(state),
                                             checkpoint_dir, at_most=complete)
    state = (tf.nest.pack_sequence_as(state, list(restored)) if restored is not None
             else parts_lib.initial_state(config, process))
    outputs.repair_metrics(output_dir, start_round)
    _drop_checkpoints_after(state_manager, start_round)
  csv_manager = tff.program.CSVFileReleaseManager(
      os.path.join(output_dir, outputs.METRICS_FILE), key_fieldname="round")
  if start_round >= config.rounds and os.path.exists(summary_path):
    import json

    with open(summary_path) as f:
      return RunResult(output_dir, json.load(f))

  bar = None
  if progress:
    from tqdm import tqdm

    bar = tqdm(total=config.rounds, initial=start_round, unit="round", dynamic_ncols=True,
               desc=f"{config.name or config.server.optimizer} [{_device_label(devices)}]",
               leave=True)
  client_ids = list(data.train.client_ids)
  status, diverged_round, rejected_streak = "completed", None, 0
  started = time.perf_counter()
  rounds_run = 0
  try:
    for round_num in range(start_round + 1, config.rounds + 1):
      sampled = sample_clients(client_ids, config.clients_per_round, config.seed, round_num)
      previous_weights = (process.get_model_weights(state).trainable
                          if config.telemetry else None)
      output = process_lib.next_round(process, state, config, data, sampled, round_num)
      state = output.state
      rounds_run += 1
      metrics = {"round": round_num, **flatten_round_metrics(output.metrics)}
      weights = process.get_model_weights(state).trainable
      if config.telemetry:
        t0 = time.perf_counter()
        metrics.update(telemetry_lib.optimizer_state_stats(
            state, previous_weights=previous_weights, weights=weights,
            layer_names=layer_names, epsilon=config.server.hparams.get("epsilon")))
        if round_num % config.histogram_every == 0:
          with histogram_writer.as_default(step=round_num):
            for name, values in telemetry_lib.state_histograms(state).items():
              tf.summary.histogram(name, values)
        metrics["time/telemetry_s"] = time.perf_counter() - t0
      rejected_streak = rejected_streak + 1 if metrics["nonfinite_updates"] else 0
      diverged = (not _all_finite(weights) or not math.isfinite(metrics["train/loss"])
                  or rejected_streak >= config.diverge_patience)
      is_last = round_num == config.rounds or diverged
      if round_num % config.eval_every == 0 or is_last:
        metrics.update(evaluator(process, state))
      metrics["time/elapsed_s"] = time.perf_counter() - started
      release = {k: v for k, v in metrics.items() if k != "round"}
      asyncio.run(csv_manager.release(release, key=round_num))
      asyncio.run(tb_manager.release(release, key=round_num))
      saved = False
      if round_num % config.checkpoint_every == 0 or is_last:
        asyncio.run(state_manager.save(tf.nest.flatten(state), version=round_num))
        saved = True
      if bar is not None:
        bar.update(1)
        shown = {"loss": f"{metrics['train/loss']:.4f}"}
        if "test/accuracy" in metrics:
          shown["acc"] = f"{metrics['test/accuracy']:.4f}"
        bar.set_postfix(shown)
      if on_round is not None:
        on_round(round_num, metrics)
      if "test/accuracy" in metrics and on_eval is not None:
        on_eval(EvalEvent(round_num, metrics, diverged, output_dir, saved))
      if diverged:
        status, diverged_round = "diverged", round_num
        logger.warning("diverged at round %d", round_num)
        break
  finally:
    if bar is not None:
      bar.close()
    histogram_writer.flush()
    if own_parts and hasattr(process, "close"):
      process.close()
  wall = time.perf_counter() - started

  process.get_model_weights(state).assign_weights_to(keras_model)
  if status == "completed":
    keras_model.save(os.path.join(output_dir, outputs.MODEL_FILE) + ".tmp.keras")
    os.replace(os.path.join(output_dir, outputs.MODEL_FILE) + ".tmp.keras",
               os.path.join(output_dir, outputs.MODEL_FILE))
  history = outputs.read_metrics(output_dir)
  outputs.plot_curves({config.server.optimizer: history},
                      os.path.join(output_dir, outputs.CURVES_FILE),
                      title=config.name or os.path.basename(output_dir.rstrip("/")))
  summary = outputs.summarize(
      history, targets=config.targets, status=status, diverged_round=diverged_round,
      wall_time_s=wall, rounds_run=rounds_run, devices=devices,
      extra={"optimizer": config.server.optimizer, "seed": config.seed,
             "backend": runtime.backend(config.runtime),
             "resumed_from_round": start_round or None})
  outputs.write_summary(output_dir, summary)
  return RunResult(output_dir, summary)
