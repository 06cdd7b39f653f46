"""Resuming a run: which saved run it is, the state to go on from, repairs.

A run directory holds the saved config, the program state of the last few
rounds and the metrics rows of every round run. A run killed at any instant
leaves them consistent enough to go on from: the newest checkpoint that loads
is resumed (an unreadable one is moved to `checkpoints_corrupt/`); metrics rows
after its round are dropped, and when rows it covers were lost, the run goes
back to the newest checkpoint whose rounds all have their rows, or starts over.
Client sampling and shuffles are functions of (seed, round), so the rounds run
again give what the lost ones gave.

A checkpoint is a short list of arrays (`pack_leaves`: one per dtype), so
`ArrayStateManager` is TFF's `FileProgramStateManager` (its versions, paths and
retention) writing each version with NumPy instead of as a SavedModel, whose
save traces new graphs for every version, takes time that grows with the number
of arrays, and leaves cyclic garbage holding native memory. Version `v` is
`<root_dir>/<prefix><v>/arrays.npz`, written into a hidden directory and renamed
into place, so a process killed mid-write leaves no version that lists.
Versions in TFF's SavedModel format still load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import uuid
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_fedadamom.config import ConfigError, ExperimentConfig, config_to_dict, load_config
from tff_fedadamom.config.loader import first_difference
from tff_fedadamom.experiment import outputs

logger = logging.getLogger("tff_fedadamom")

# Sections a resumed run may change: how long it runs, how, and its name.
RESUMABLE_CHANGES = ("runtime", "output_dir", "rounds", "name")
ARRAYS_FILE = "arrays.npz"
# Where a version is written before it is renamed into place (never a version).
PARTIAL_PREFIX = ".partial-"


class ArrayStateManager(tff.program.FileProgramStateManager):
  """`tff.program.FileProgramStateManager` for program states that are flat
  sequences of arrays, each version one `.npz` file (see the module doc)."""

  async def save(self, program_state: Sequence, version: int) -> None:
    """Saves `program_state` (a list or tuple of values NumPy converts to
    arrays, materialized first) as `version`, then applies the retention."""
    if not isinstance(program_state, (list, tuple)):
      raise TypeError("program_state must be a list or tuple of arrays, got "
                      f"{type(program_state).__name__}")
    path = self._get_path_for_version(version)
    if os.path.exists(path):
      raise tff.program.ProgramStateExistsError(version=version, path=self._root_dir)
    values = await tff.program.materialize_value(list(program_state))
    arrays = [np.asarray(value) for value in values]
    self._remove_partial_writes()
    partial = os.path.join(self._root_dir, f"{PARTIAL_PREFIX}{os.path.basename(path)}-"
                           f"{uuid.uuid4().hex}")
    os.makedirs(partial)
    try:
      np.savez(os.path.join(partial, ARRAYS_FILE), *arrays)
      os.rename(partial, path)
    except BaseException:
      shutil.rmtree(partial, ignore_errors=True)
      raise
    await self._remove_old_program_state()

  async def load(self, version: int, structure: Sequence) -> list:
    """The arrays of `version`, one per item of `structure`; ValueError (or the
    errors of NumPy's and zipfile's readers) when it holds another number or is
    damaged."""
    path = self._get_path_for_version(version)
    arrays_path = os.path.join(path, ARRAYS_FILE)
    if not os.path.exists(arrays_path):
      if os.path.isdir(path) and not os.path.exists(os.path.join(path, "saved_model.pb")):
        raise ValueError(f"{path} holds neither {ARRAYS_FILE} nor a SavedModel")
      return list(await super().load(version, structure))  # TFF's format; not found
    with np.load(arrays_path, allow_pickle=False) as stored:
      arrays = [stored[f"arr_{i}"] for i in range(len(stored.files))]
    if len(arrays) != len(structure):
      raise ValueError(f"{arrays_path} holds {len(arrays)} arrays, not {len(structure)}")
    return arrays

  def _remove_partial_writes(self) -> None:
    """Removes what saves killed mid-write left (a run directory has one writer)."""
    for entry in os.listdir(self._root_dir):
      if entry.startswith(PARTIAL_PREFIX):
        shutil.rmtree(os.path.join(self._root_dir, entry), ignore_errors=True)


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
    raise ConfigError(
        str(saved_path), first_difference(saved, current),
        "output_dir already holds a run of a different config; use another "
        "output_dir or delete this one",
        allowed="the same config as the saved run (only rounds, runtime and name may change)")
  return True


def state_manager(output_dir: str):
  """The run's program-state manager: the last 3 saved rounds, as arrays."""
  return ArrayStateManager(os.path.join(output_dir, outputs.CHECKPOINT_DIR),
                           prefix="round_", keep_total=3, keep_first=False)


def pack_leaves(leaves) -> list:
  """The leaves as one 1-D array per dtype, in the order each dtype first
  appears, each leaf raveled in turn: what a checkpoint holds (`save_state`)."""
  groups: dict = {}
  for leaf in leaves:
    value = np.asarray(leaf)
    groups.setdefault(value.dtype.str, []).append(value.ravel())
  return [np.concatenate(parts) for parts in groups.values()]


def unpack_leaves(packed, like) -> list:
  """The leaves `pack_leaves` packed, with the shapes and dtypes of `like` (the
  initial state's leaves); one array per leaf (written before packing) is
  returned as it is. ValueError when `packed` holds neither layout."""
  like = [np.asarray(leaf) for leaf in like]
  packed = [np.asarray(value) for value in packed]
  if len(packed) == len(like) and all(p.shape == l.shape and p.dtype == l.dtype
                                      for p, l in zip(packed, like)):
    return packed
  sizes: dict = {}
  for leaf in like:
    sizes[leaf.dtype.str] = sizes.get(leaf.dtype.str, 0) + leaf.size
  if [(v.dtype.str, v.shape) for v in packed] != [(d, (n,)) for d, n in sizes.items()]:
    raise ValueError(f"a checkpoint of {len(packed)} arrays does not hold this run's state "
                     f"({len(like)} leaves)")
  arrays, offsets = dict(zip(sizes, packed)), dict.fromkeys(sizes, 0)
  out = []
  for leaf in like:
    start = offsets[leaf.dtype.str]
    offsets[leaf.dtype.str] = start + leaf.size
    out.append(arrays[leaf.dtype.str][start:start + leaf.size].reshape(leaf.shape))
  return out


def save_state(manager, state, round_num: int, run_async=asyncio.run) -> None:
  """Saves `state` flat and packed (`pack_leaves`) as round `round_num`'s
  checkpoint, through `run_async` (a run's `hooks.EventLoop`); the initial state
  gives the structure, shapes and dtypes back."""
  import tensorflow as tf

  run_async(manager.save(pack_leaves(tf.nest.flatten(state)), version=round_num))


def _load_leaves(manager, version: int, like, layouts) -> list:
  """The leaves of checkpoint `version`, shaped as `like`, read with each of
  `layouts` in turn (TFF's loader wants the saved layout)."""
  error = None
  for layout in layouts:
    try:
      return unpack_leaves(asyncio.run(manager.load(version, layout)), like)
    except Exception as e:  # noqa: BLE001 - the other layout, then the caller's handling
      error = error or e
  raise error


def load_checkpoint(manager, like, root_dir: str, at_most: Optional[int] = None):
  """(The leaves of the newest checkpoint that loads, shaped as `like`, its round);
  (None, 0) when there is none, an error when none of them loads. An unreadable
  one is moved aside to `checkpoints_corrupt/`, so the redone round can be saved.
  """
  versions = asyncio.run(manager.get_versions()) or []
  if at_most is not None:
    versions = [v for v in versions if v <= at_most]
  layouts = (pack_leaves(like), list(like))
  for version in sorted(versions, reverse=True):
    try:
      return _load_leaves(manager, version, like, layouts), version
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


def _restored(manager, initial, root_dir: str, at_most: Optional[int] = None):
  """(state, round) of the newest loadable checkpoint, or (initial, 0)."""
  import tensorflow as tf

  flat, round_num = load_checkpoint(manager, tf.nest.flatten(initial), root_dir, at_most)
  if flat is None:
    return initial, 0
  return tf.nest.pack_sequence_as(initial, flat), round_num


def restore(manager, initial, output_dir: str) -> tuple[Any, int]:
  """The state to go on from and the rounds it has run, with the run's metrics
  rows repaired to match (see the module doc); `initial`, the run's initial
  state, gives the checkpoints' structure and is what a new run starts from."""
  root_dir = os.path.join(output_dir, outputs.CHECKPOINT_DIR)
  state, start_round = _restored(manager, initial, root_dir)
  complete = outputs.repair_metrics(output_dir, start_round)
  if complete < start_round:
    # Rows the checkpoint covers were lost: back to one whose rows are all kept.
    state, start_round = _restored(manager, initial, root_dir, at_most=complete)
    outputs.repair_metrics(output_dir, start_round)
    for version in asyncio.run(manager.get_versions()) or []:
      if version > start_round:  # the run redoes those rounds
        shutil.rmtree(manager._get_path_for_version(version))  # noqa: SLF001
  return state, start_round


def finished_summary(output_dir: str, start_round: int, rounds: int) -> Optional[dict]:
  """The summary of a run that has already run all its `rounds`, else None."""
  path = os.path.join(output_dir, outputs.SUMMARY_FILE)
  if start_round < rounds or not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
