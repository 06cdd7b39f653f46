"""Resuming a run: which saved run it is, the state to go on from, repairs.

A run directory holds the saved config, the program state of the last few
rounds (`checkpoints/round_<n>`, TFF's `FileProgramStateManager`) and the
metrics rows of every round run. A run killed at any instant leaves them
consistent enough to go on from:

  * the newest checkpoint that loads is the one resumed; an unreadable one
    (killed mid-write, damaged on disk) is moved to `checkpoints_corrupt/` and
    an older one tried;
  * metrics rows after that checkpoint's round are dropped (those rounds run
    again), and when rows the checkpoint covers were lost, the run goes back to
    the newest checkpoint whose rounds all have their rows, dropping the newer
    checkpoints, or starts over.

Since client sampling and every client's shuffle are functions of (seed, round),
the rounds run again give what the lost ones gave.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from typing import Any, Optional

from tff_fedadamom.config import ConfigError, ExperimentConfig, config_to_dict, load_config
from tff_fedadamom.config.loader import first_difference
from tff_fedadamom.pipeline import outputs

logger = logging.getLogger("tff_fedadamom")

# Sections a resumed run may change: how long it runs, how, and its name.
RESUMABLE_CHANGES = ("runtime", "output_dir", "rounds", "name")


def check_resumable(config: ExperimentConfig, output_dir: str) -> bool:
  """True if `output_dir` holds a run of this config to resume; error if another."""
  saved_path = os.path.join(output_dir, outputs.CONFIG_FILE)
  if not os.path.exists(saved_path):
    return False
  saved = config_to_dict(load_config(saved_path))
  current = config_to_dict(config)
  for section in RESUMABLE_CHANGES:
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


def state_manager(output_dir: str):
  """TFF's program-state manager of the run: the last 3 saved rounds."""
  import tensorflow_federated as tff

  return tff.program.FileProgramStateManager(
      os.path.join(output_dir, outputs.CHECKPOINT_DIR), prefix="round_", keep_total=3,
      keep_first=False)


def save_state(manager, state, round_num: int, run_async=asyncio.run) -> None:
  """Saves `state` as round `round_num`'s checkpoint (the coroutine run by
  `run_async`: a run passes its `hooks.EventLoop`).

  The state is saved flat: TFF's saver cannot serialize the dicts inside
  `LearningAlgorithmState`, and the initial state gives the structure back.
  """
  import tensorflow as tf

  run_async(manager.save(tf.nest.flatten(state), version=round_num))


def load_checkpoint(manager, structure, root_dir: str, at_most: Optional[int] = None):
  """(The newest checkpoint that loads, its round); falls back past corrupt ones.

  An unreadable checkpoint is moved aside to `checkpoints_corrupt/` (kept for
  inspection), so that the round can be saved again when the run redoes it.
  (None, 0) when there is none; an error when there are some and none loads.
  """
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


def drop_checkpoints_after(manager, round_num: int) -> None:
  """Deletes checkpoints newer than `round_num`: the run redoes those rounds."""
  for version in asyncio.run(manager.get_versions()) or []:
    if version > round_num:
      shutil.rmtree(manager._get_path_for_version(version))  # noqa: SLF001


def _restored(manager, initial, root_dir: str, at_most: Optional[int] = None):
  """(state, round) of the newest loadable checkpoint, or (initial, 0)."""
  import tensorflow as tf

  flat, round_num = load_checkpoint(manager, tf.nest.flatten(initial), root_dir, at_most)
  if flat is None:
    return initial, 0
  return tf.nest.pack_sequence_as(initial, list(flat)), round_num


def restore(manager, initial, output_dir: str) -> tuple[Any, int]:
  """The state to go on from and the rounds it has run, with the run's metrics
  rows repaired to match (see the module doc).

  Args:
    manager: The run's `state_manager`.
    initial: The run's initial state: its structure is the checkpoints', and it
      is what a run with nothing to resume starts from.
    output_dir: The run directory.
  """
  root_dir = os.path.join(output_dir, outputs.CHECKPOINT_DIR)
  state, start_round = _restored(manager, initial, root_dir)
  complete = outputs.repair_metrics(output_dir, start_round)
  if complete < start_round:
    # Metrics rows the checkpoint covers were lost (a kill mid-write): go back to
    # the newest checkpoint whose rounds all have their rows, or start over.
    state, start_round = _restored(manager, initial, root_dir, at_most=complete)
    outputs.repair_metrics(output_dir, start_round)
    drop_checkpoints_after(manager, start_round)
  return state, start_round


def finished_summary(output_dir: str, start_round: int, rounds: int) -> Optional[dict]:
  """The summary of a run that has already run all its `rounds`, else None."""
  path = os.path.join(output_dir, outputs.SUMMARY_FILE)
  if start_round < rounds or not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
