"""The round loop: sample clients, run a round, hand the round's end to the hooks.

Shaped like TFF's `tff.simulation.run_training_process`: everything a run does
around a round (telemetry, divergence, evaluation, metrics, checkpoints, the
progress bar, Tune's report) is a `RoundHook` handed in, as TFF hands in its
release and program-state managers. The hooks run in the order given, each
seeing what the earlier ones added (the divergence hook decides whether the
round is the run's last, so evaluation and checkpoint know to do it). The loop
keeps nothing between rounds but the state; a hook that needs history keeps it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Callable, Generator, Iterable, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import (ASYNC_PREFIX, LOSS, NONFINITE_UPDATES, NUM_EXAMPLES,
                                        ROUND, TEST_ACCURACY, TRAIN_ACCURACY, TRAIN_LOSS,
                                        TRAIN_NUM_EXAMPLES)

logger = logging.getLogger("tff_fedadamom")


@dataclasses.dataclass(frozen=True)
class EvalEvent:
  """What a callback sees after each evaluation: the rounds completed, the
  round's flat metrics, whether the run stops here because it diverged, and the
  run directory; with `checkpoint_saved` (a checkpoint of this round was just
  written), copying it back lets a later run resume from this round."""

  round_num: int
  metrics: Mapping[str, float]
  diverged: bool
  output_dir: str
  checkpoint_saved: bool


@dataclasses.dataclass
class RoundEnd:
  """A round as the hooks see it: rounds count from 1, `metrics` are flat
  (`round` first), `last` marks the last round the loop was asked to run. Hooks
  add to `metrics` and set `diverged` (the run stops after this round) and
  `checkpoint_saved`."""

  round_num: int
  state: Any
  metrics: dict
  clients: list
  last: bool
  process: Any = dataclasses.field(repr=False)
  diverged: bool = False
  checkpoint_saved: bool = False

  @functools.cached_property
  def weights(self):
    """The trainable weights after the round, fetched once for every hook."""
    return self.process.get_model_weights(self.state).trainable

  @property
  def final(self) -> bool:
    """The run ends with this round: it is the last one, or it diverged."""
    return self.last or self.diverged

  @property
  def evaluated(self) -> bool:
    """Whether a hook evaluated the global model this round."""
    return TEST_ACCURACY in self.metrics

  def eval_event(self, output_dir: str) -> EvalEvent:
    return EvalEvent(self.round_num, self.metrics, self.diverged, output_dir,
                     self.checkpoint_saved)


class RoundHook:
  """Something a run does around each round; every method is optional. `close`
  runs once when the loop ends, however it ends."""

  def start_round(self, round_num: int, state) -> None:
    del round_num, state

  def end_round(self, end: RoundEnd) -> None:
    del end

  def close(self) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class LoopResult:
  """The state after the loop, how many rounds it ran, and the round it
  stopped at because a hook found it diverged (None if none did)."""

  state: Any
  rounds_run: int
  diverged_round: Optional[int]


def flatten_round_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The useful scalars of a learning process's round metrics, with flat names."""
  from tff_fedadamom.models import ACCURACY_METRIC

  train = metrics.get("client_work", {}).get("train", {})
  out = {
      TRAIN_LOSS: float(train.get(LOSS, math.nan)),
      TRAIN_ACCURACY: float(train.get(ACCURACY_METRIC, math.nan)),
      TRAIN_NUM_EXAMPLES: float(train.get(NUM_EXAMPLES, 0)),
      NONFINITE_UPDATES: float(metrics.get("finalizer", {}).get("update_non_finite", 0)),
  }
  step = metrics.get("asynchronous")  # `runtime.buffered`'s server steps
  if step is not None:
    out.update({ASYNC_PREFIX + key: float(value) for key, value in step.items()})
  return out


def drain(steps: Generator):
  """Runs the generator `steps` to its end and returns its value."""
  while True:
    try:
      next(steps)
    except StopIteration as done:
      return done.value


def run_rounds(process, state, rounds: Iterable[int], sampler: Callable[[int], list],
               hooks: Sequence[RoundHook] = ()) -> LoopResult:
  """`iter_rounds`, run to its end."""
  return drain(iter_rounds(process, state, rounds, sampler, hooks))


def iter_rounds(process, state, rounds: Iterable[int], sampler: Callable[[int], list],
                hooks: Sequence[RoundHook] = ()) -> Generator[RoundEnd, None, LoopResult]:
  """Runs `rounds` (round numbers, in order) of `process` (a `backends.Backend`:
  `next_for_clients(state, clients, round_num)`) from `state`, with the clients
  of `sampler(round_num)`, calling `hooks` around each in order. Yields each
  round's `RoundEnd` once its hooks have run, so that a caller (a Tune
  trainable's `step`) can run a few rounds at a time; closing it early ends the
  loop there. Its value is a `LoopResult`: the loop stops early after a round a
  hook marks diverged.
  """
  rounds = list(rounds)
  rounds_run = 0
  try:
    for round_num in rounds:
      clients = sampler(round_num)
      for hook in hooks:
        hook.start_round(round_num, state)
      output = process.next_for_clients(state, clients, round_num)
      state = output.state
      rounds_run += 1
      end = RoundEnd(round_num, state, {ROUND: round_num, **flatten_round_metrics(output.metrics)},
                     clients, last=round_num == rounds[-1], process=process)
      for hook in hooks:
        hook.end_round(end)
      yield end
      if end.diverged:
        logger.warning("diverged at round %d", round_num)
        return LoopResult(state, rounds_run, round_num)
  finally:
    for hook in hooks:
      hook.close()
  return LoopResult(state, rounds_run, None)
