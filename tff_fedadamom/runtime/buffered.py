"""Buffered asynchronous rounds (FedBuff, FADAS) on the in-process or ray backend.

`asynchrony.Timeline` says which clients start when, from which model version,
and which updates each server step averages; `BufferedProcess` trains along it.
A server step of the wrapped learning process's MapReduceForm (`server` says
how a round runs) differs from a synchronous round in its middle line only:

    accumulator = zero, accumulate(scale(work(d_i, broadcast_{v_i}), s(tau_i)))
                  over the step's updates i, in buffer order
    state', out = update(state, report(accumulator))

Each update trains from the broadcast of the version its client started from
(`prepare` of that version's state), and its weighted model delta is scaled by
its staleness weight (`asynchrony.staleness_weight`), which leaves TFF's
weighted mean as sum_i s_i w_i Delta_i / sum_i w_i. A client's work is a
function of its data and its broadcast, so computing it when its step comes
gives what computing it when it started would, and a step's updates run at
once. A FADAS server gets the step's largest staleness as its `max_delay`.

The state is the learning process's plus the broadcasts of the earlier versions
still to be trained from (`Timeline.live_versions`), in `Timeline.capacity`
slots; the current version's is the step's own `prepare`. A checkpoint holds
them, so a run killed mid-way resumes exactly.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

from tff_fedadamom import asynchrony
from tff_fedadamom.optimizers.state import MAX_DELAY_KEY
from tff_fedadamom.runtime.py_containers import type_leaves


class AsyncState(NamedTuple):
  """A buffered run's state: the learning process's (`server`), the server
  steps taken (`version`), and slot k holding the broadcast (numpy leaves) of
  version `slot_versions[k]` (-1: empty)."""

  server: Any
  version: np.ndarray
  slot_versions: np.ndarray
  slots: tuple

  # The learning process state's parts that telemetry reads.
  @property
  def global_model_weights(self):
    return self.server.global_model_weights

  @property
  def finalizer(self):
    return self.server.finalizer


def update_leaves(compiled) -> slice:
  """Which leaves of `work`'s output are the client's weighted model delta.

  A process of `tff.learning.algorithms.build_weighted_fed_avg` sums, per
  client, (metrics, weight * delta, weight) (TFF's `MeanFactory`).

  Raises:
    ValueError: the process sums something else (such as FedCAda's or FAFED's).
  """
  summed = compiled.computation("work").type_signature.result[0]
  weights = type_leaves(compiled.result_types["get_model_weights"].trainable)
  parts = [type_leaves(part) for part in summed] if len(summed) == 3 else []
  if not parts or [str(t) for t in parts[1]] != [str(t) for t in weights] or [
      str(t) for t in parts[2]] != ["float32"]:
    raise ValueError("asynchronous training needs a process that averages model deltas as "
                     "tff.learning.algorithms.build_weighted_fed_avg does (a server "
                     f"optimizer); this one's clients sum {summed}")
  return slice(len(parts[0]), len(parts[0]) + len(parts[1]))


class BufferedProcess:
  """A backend (`base.Backend`) whose rounds are asynchronous server steps of
  the in-process or ray `backend`, along `timeline`; `staleness`: `{kind: ...,
  <its options>}` of `asynchrony.STALENESS`."""

  def __init__(self, backend, timeline: asynchrony.Timeline, staleness: Mapping[str, Any]):
    self.backend = backend
    self.timeline = timeline
    options = dict(staleness)
    self._kind = options.pop("kind", "constant")
    self._staleness = options
    self._update = update_leaves(backend.compiled)
    self._max_delay = None  # the hparams component holding FADAS' `max_delay` ("": none)

  def initialize(self) -> AsyncState:
    prepared = self.backend.compiled.computation("prepare").type_signature.result
    empty = tuple(np.zeros(t.shape, t.dtype) for t in type_leaves(prepared))
    capacity = self.timeline.capacity
    return AsyncState(self.backend.initialize(), np.asarray(0, np.int64),
                      np.full([capacity], -1, np.int64), (empty,) * capacity)

  def get_model_weights(self, state: AsyncState):
    return self.backend.get_model_weights(state.server)

  def get_hparams(self, state: AsyncState):
    return self.backend.get_hparams(state.server)

  def set_hparams(self, state: AsyncState, hparams) -> AsyncState:
    """`hparams` set in (the current version's broadcast, made from the state
    at the next step, has them)."""
    return state._replace(server=self.backend.set_hparams(state.server, hparams))

  def close(self) -> None:
    self.backend.close()

  def next_for_clients(self, state: AsyncState, client_ids, round_num: int):
    """Server step `round_num` (the loop's round): its updates' clients are
    `client_ids`, as `step_clients` gave them."""
    step = self.timeline.step(round_num)
    current = round_num - 1  # the version `state.server` holds
    if int(state.version) != current:
      raise ValueError(f"server step {round_num} follows step {current}, but the state "
                       f"is at step {int(state.version)}")
    slot_of = {int(v): k for k, v in enumerate(state.slot_versions) if v >= 0}
    scales = [asynchrony.staleness_weight(tau, self._kind, **self._staleness)
              for tau in step.staleness()]
    made = []

    def fold(broadcast):  # the round's `prepare` of the current version
      made.append(broadcast)
      versions = list(dict.fromkeys(task.version for task in step.tasks))
      broadcasts = [broadcast if v == current else state.slots[slot_of[v]] for v in versions]
      return self.backend.fold_tasks([(task.client, task.launch) for task in step.tasks],
                                     broadcasts, [versions.index(t.version) for t in step.tasks],
                                     scales, self._update)

    server = self._set_max_delay(state.server, step.max_staleness)
    output = self.backend.server.round(server, fold)
    metrics = dict(output.metrics)
    metrics["asynchronous"] = {"virtual_time": step.time, "mean_staleness": step.mean_staleness,
                               "max_staleness": step.max_staleness, "dropped": step.dropped}
    return type(output)(state=self._kept(output.state, round_num, state, made[0]),
                        metrics=metrics)

  def step_clients(self, round_num: int) -> list:
    """The clients whose updates server step `round_num` averages (the loop's sampler)."""
    return [task.client for task in self.timeline.step(round_num).tasks]

  def _set_max_delay(self, server, max_staleness: int):
    """`server` with FADAS' `max_delay` set to the step's largest staleness."""
    if self._max_delay is None:
      self._max_delay = next((component for component, values in
                              self.backend.get_hparams(server).items()
                              if isinstance(values, Mapping) and MAX_DELAY_KEY in values), "")
    if not self._max_delay:
      return server
    hparams = self.backend.get_hparams(server)
    if float(hparams[self._max_delay][MAX_DELAY_KEY]) == max_staleness:
      return server
    hparams[self._max_delay][MAX_DELAY_KEY] = max_staleness
    return self.backend.set_hparams(server, hparams)

  def _kept(self, server, version: int, previous: AsyncState, broadcast) -> AsyncState:
    """The state after step `version`: `server`, and the broadcasts of earlier
    versions that later steps still train from: of `previous`'s slots, and
    `broadcast` (of version - 1) if it is one."""
    live = self.timeline.live_versions(version)
    versions = np.where(np.isin(previous.slot_versions, list(live)), previous.slot_versions, -1)
    slots = list(previous.slots)
    if version - 1 in live:
      free = int(np.flatnonzero(versions < 0)[0])
      versions[free] = version - 1
      slots[free] = tuple(np.asarray(b) for b in broadcast)
    return AsyncState(server, np.asarray(version, np.int64), versions, tuple(slots))


def buffered_process(backend, config, client_ids) -> BufferedProcess:
  """`backend`'s rounds as the asynchronous server steps of `config` (a
  validated `ExperimentConfig` with an `asynchronous` section) over `client_ids`."""
  section = config.asynchronous
  timeline = asynchrony.Timeline(client_ids, section.concurrency, section.buffer_size,
                                 section.max_staleness, section.durations, config.seed)
  return BufferedProcess(backend, timeline, section.staleness)
