"""The round hooks a run is made of (`loop.iter_rounds`), in the order the runner
passes them, which is the order each needs the others' work in:

  Telemetry    optimizer-state statistics and histograms (`telemetry`)
  Divergence   marks the round diverged: the run ends with it
  Evaluate     the global model on the test set, every `eval_every` rounds
               and on the run's final round
  ElapsedTime  `time/elapsed_s`
  Release      the round's metrics to metrics.csv and TensorBoard
  Checkpoint   the program state, every `checkpoint_every` rounds and on the
               final round (so a finished or diverged run can be resumed)
  Progress     the progress bar
  OnRound, OnEval   the caller's callbacks; a caller's own hooks come last,
               when the round's metrics and checkpoint are on disk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import time
from typing import Callable, Collection, Mapping, Optional, Sequence

import numpy as np

from tff_fedadamom.metric_names import ELAPSED_S, NONFINITE_UPDATES, ROUND, TELEMETRY_S
from tff_fedadamom.metric_names import TEST_ACCURACY, TRAIN_LOSS
from tff_fedadamom.experiment.loop import EvalEvent, RoundEnd, RoundHook


class Telemetry(RoundHook):
  """Adds the optimizer-state statistics of each round (`opt/...`, per layer),
  and every `histogram_every` rounds writes the state's histograms to `writer`
  (a `tensorboard_events.EventWriter`)."""

  def __init__(self, process, layer_names: Sequence[str], epsilon: Optional[float],
               histogram_every: int, writer):
    self._process = process
    self._layer_names = list(layer_names)
    self._epsilon = epsilon
    self._every = histogram_every
    self._writer = writer
    self._previous = None

  def start_round(self, round_num: int, state) -> None:
    del round_num
    if self._previous is None:  # later rounds start from the last one's weights
      self._previous = self._process.get_model_weights(state).trainable

  def end_round(self, end: RoundEnd) -> None:
    from tff_fedadamom.experiment import telemetry as telemetry_lib

    weights = end.weights
    t0 = time.perf_counter()
    end.metrics.update(telemetry_lib.optimizer_state_stats(
        end.state, previous_weights=self._previous, weights=weights,
        layer_names=self._layer_names, epsilon=self._epsilon))
    self._previous = weights  # the next round starts from this state
    if end.round_num % self._every == 0:
      self._writer.histograms(telemetry_lib.state_histograms(end.state), end.round_num)
    end.metrics[TELEMETRY_S] = time.perf_counter() - t0


class Divergence(RoundHook):
  """Marks a round diverged when the weights or the training loss are not
  finite, or when the server has rejected `patience` updates in a row (its
  finalizer counts non-finite updates, which it does not apply)."""

  def __init__(self, patience: int):
    self._patience = patience
    self._rejected_streak = 0

  def end_round(self, end: RoundEnd) -> None:
    import tensorflow as tf

    self._rejected_streak = self._rejected_streak + 1 if end.metrics[NONFINITE_UPDATES] else 0
    finite = all(np.all(np.isfinite(np.asarray(x))) for x in tf.nest.flatten(end.weights))
    end.diverged = (not finite or not math.isfinite(end.metrics[TRAIN_LOSS])
                    or self._rejected_streak >= self._patience)


def evaluation_rounds(rounds: int, every: int) -> list[int]:
  """The rounds `Evaluate(..., every)` evaluates in a run of rounds 1..`rounds`
  that runs to its end: every `every`-th, and the last."""
  return [*range(every, rounds, every), rounds]


class Evaluate(RoundHook):
  """Adds `evaluator(process, state)` every `every` rounds and on the final one
  (`evaluation_rounds`)."""

  def __init__(self, evaluator: Callable, every: int):
    self._evaluator = evaluator
    self._every = every

  def end_round(self, end: RoundEnd) -> None:
    if end.round_num % self._every == 0 or end.final:
      end.metrics.update(self._evaluator(end.process, end.state))


class ElapsedTime(RoundHook):
  """Adds `time/elapsed_s`: seconds since `started` (a `time.perf_counter()`)."""

  def __init__(self, started: float):
    self._started = started

  def end_round(self, end: RoundEnd) -> None:
    end.metrics[ELAPSED_S] = time.perf_counter() - self._started


class _CallingThread(concurrent.futures.ThreadPoolExecutor):
  """A `ThreadPoolExecutor` (all asyncio accepts as a loop's default executor)
  that never starts a thread: it runs each call at once, in the submitting one."""

  def __init__(self):
    super().__init__(max_workers=1)

  def submit(self, fn, /, *args, **kwargs):
    future = concurrent.futures.Future()
    try:
      future.set_result(fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
      future.set_exception(e)
    return future


class EventLoop:
  """One asyncio loop, with no executor thread, for a run's TFF program calls.

  TFF's release and program-state managers do their file work in the loop's
  default executor. A loop and a thread per round (`asyncio.run`) made a long
  run's memory grow (`benchmarks/rounds.py`), as did one executor thread per
  run: glibc gives each allocating thread its own malloc arena, and what
  TensorFlow keeps of a save pinned pages of it. The round loop waits for every
  call anyway, so the file work runs in the calling thread (`_CallingThread`).
  """

  def __init__(self):
    self._loop = asyncio.new_event_loop()
    self._loop.set_default_executor(_CallingThread())

  def __call__(self, coroutine):
    return self._loop.run_until_complete(coroutine)

  def close(self) -> None:
    if not self._loop.is_closed():
      self._loop.run_until_complete(self._loop.shutdown_default_executor())
      self._loop.close()


class Release(RoundHook):
  """Releases each round's metrics (without `round`, the key) to TFF release
  managers, through `run_async` (the run's `EventLoop`; default `asyncio.run`)."""

  def __init__(self, managers: Sequence, run_async: Callable = asyncio.run):
    self._managers = list(managers)
    self._run = run_async

  def end_round(self, end: RoundEnd) -> None:
    release = {k: v for k, v in end.metrics.items() if k != ROUND}
    for manager in self._managers:
      self._run(manager.release(release, key=end.round_num))


class Checkpoint(RoundHook):
  """Saves the state every `every` rounds, or at the rounds of `rounds` (those a
  caller keeps, `tuning.sweep.checkpoint_rounds`), and on the final one
  (`resume.save_state`), and sets `checkpoint_saved`."""

  def __init__(self, manager, every: int, run_async: Callable = asyncio.run,
               rounds: Optional[Collection[int]] = None):
    self._manager = manager
    self._every = every
    self._rounds = None if rounds is None else frozenset(rounds)
    self._run = run_async

  def end_round(self, end: RoundEnd) -> None:
    from tff_fedadamom.experiment import resume

    due = (end.round_num % self._every == 0 if self._rounds is None
           else end.round_num in self._rounds)
    if due or end.final:
      resume.save_state(self._manager, end.state, end.round_num, run_async=self._run)
      end.checkpoint_saved = True


class Progress(RoundHook):
  """Advances a tqdm bar each round, showing the loss and the last accuracy."""

  def __init__(self, bar):
    self._bar = bar

  def end_round(self, end: RoundEnd) -> None:
    self._bar.update(1)
    shown = {"loss": f"{end.metrics[TRAIN_LOSS]:.4f}"}
    if end.evaluated:
      shown["acc"] = f"{end.metrics[TEST_ACCURACY]:.4f}"
    self._bar.set_postfix(shown)

  def close(self) -> None:
    self._bar.close()


class OnRound(RoundHook):
  """Calls `callback(round_num, metrics)` after every round."""

  def __init__(self, callback: Callable[[int, Mapping[str, float]], None]):
    self._callback = callback

  def end_round(self, end: RoundEnd) -> None:
    self._callback(end.round_num, end.metrics)


class OnEval(RoundHook):
  """Calls `callback(EvalEvent)` after every evaluation of the run in `output_dir`."""

  def __init__(self, callback: Callable[[EvalEvent], None], output_dir: str):
    self._callback = callback
    self._output_dir = output_dir

  def end_round(self, end: RoundEnd) -> None:
    if end.evaluated:
      self._callback(end.eval_event(self._output_dir))
