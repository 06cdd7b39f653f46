"""The round loop: sample clients, run a round, hand the round's end to the hooks.

Shaped like TFF's `tff.simulation.run_training_process` and FedJAX's
`run_federated_experiment`: the loop knows the process, the rounds to run and
how clients are sampled; everything a run does around a round (telemetry,
divergence, evaluation, releasing metrics, checkpoints, the progress bar, Ray
Tune's report) is a `RoundHook` handed in, as TFF hands in its release and
program-state managers. The hooks run in the order given, and each sees what
the earlier ones added: the divergence hook decides whether this round is the
run's last, so the evaluation and checkpoint hooks that follow it know to
evaluate and save it.

The loop itself keeps nothing between rounds but the state: a hook that needs
history (a divergence streak, a progress bar) keeps its own.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Callable, Generator, Iterable, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import ASYNC_PREFIX, NONFINITE_UPDATES, ROUND, TEST_ACCURACY, TRAIN_ACCURACY
from tff_fedadamom.metric_names import LOSS, NUM_EXAMPLES, TRAIN_LOSS, TRAIN_NUM_EXAMPLES

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


@dataclasses.dataclass
class RoundEnd:
  """A round as the hooks see it; they add to `metrics` and set the flags.

  Attributes:
    round_num: The round just run (rounds count from 1).
    state: The process state after it.
    metrics: The round's flat metrics, `round` first (`flatten_round_metrics`).
    clients: The clients that trained in it.
    last: Whether it is the last round the loop was asked to run.
    process: The process that ran it.
    diverged: Set by a hook: the run stops after this round.
    checkpoint_saved: Set by a hook that saved this round's state.
  """

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
  """Something a run does around each round; every method is optional.

  `start_round` sees the state before the round, `end_round` the `RoundEnd`
  after it, and `close` runs once when the loop ends, however it ends.
  """

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
  }
  finalizer = metrics.get("finalizer", {})
  out[NONFINITE_UPDATES] = float(finalizer.get("update_non_finite", 0))
  step = metrics.get("asynchronous")  # `runtime.buffered`'s server steps
  if step is not None:
    out.update({ASYNC_PREFIX + key: float(value) for key, value in step.items()})
  return out


def run_rounds(process, state, rounds: Iterable[int], sampler: Callable[[int], list],
               hooks: Sequence[RoundHook] = ()) -> LoopResult:
  """Runs `rounds` of `process` from `state`, calling `hooks` around each
  (`iter_rounds`, run to its end)."""
  steps = iter_rounds(process, state, rounds, sampler, hooks)
  while True:
    try:
      next(steps)
    except StopIteration as done:
      return done.value


def iter_rounds(process, state, rounds: Iterable[int], sampler: Callable[[int], list],
                hooks: Sequence[RoundHook] = ()) -> Generator[RoundEnd, None, LoopResult]:
  """Runs `rounds` of `process` from `state`, calling `hooks` around each, and
  yields each round's `RoundEnd` once its hooks have run: a generator, so that
  a caller (a Tune trainable's `step`) can run a run a few rounds at a time.
  Closing it early ends the loop there (the hooks' `close` runs).

  Args:
    process: The run's backend (`backends.Backend`): each round is
      `process.next_for_clients(state, clients, round_num)`, whichever backend
      it is; the hooks read `get_model_weights`.
    state: The state to start from (initial, or restored by `resume`).
    rounds: The round numbers to run, in order (`range(start + 1, total + 1)`).
    sampler: `round_num -> clients` (`data.sampling.UniformSampler`).
    hooks: `RoundHook`s, called in this order.

  Returns (as the generator's value):
    A `LoopResult`. The loop stops early after a round a hook marks diverged.
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
