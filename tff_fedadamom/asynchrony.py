"""Buffered asynchronous training on a virtual clock: who trains when, from which model.

FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022): `concurrency` clients train at once; a finished
client's update goes to a buffer and a new client starts from the current
model; every `buffer_size` arrivals the server averages the buffer, each update
weighted by its staleness, and steps. FADAS (Wang et al., ICML 2024) runs the
same loop with AMSGrad and a delay-adaptive rate (`ServerStep.max_staleness`).

This module is the timeline alone. Durations are drawn from a seeded model, not
measured, so the timeline (who starts when, from which version, and in which
server step each update lands) is a function of the client ids, the settings
and the seed; the training follows it (`runtime.buffered`), independent of wall
time, threads and backend, and a resumed run recomputes it.

The rules, in virtual time (unit: a typical client's task):

* At time 0, `concurrency` clients start from version 0 (the initial model).
* A task started at t by client c arrives at t + speed_c * jitter; the speed is
  drawn once per client and run (`DURATIONS`), the jitter per task.
* At each instant, the arrivals enter the buffer in the order the tasks
  started; an update staler than `max_staleness` (server steps since its
  version) is dropped, freeing its slot. Whenever the buffer holds
  `buffer_size` updates, the server steps: version + 1. Then every slot freed
  at this instant restarts, from the current version: one *launch*.
* A launch of n clients draws them uniformly without replacement from those not
  in flight, seeded by (seed, launch number; launch 1 is at time 0). A task's
  data (its shuffle) uses its launch number as the round number.

Where this departs from FADAS' code (yujiaw98/FADAS, `g_delay_adaptive.py`):
its round-based simulation restarts the clients of a step after the step, from
the new model; here a slot restarts when its update arrives, from the model
current then (FedBuff's rule), so an update that arrives before the buffer
fills lets its successor start one version earlier. Staleness counts alike in
both: server steps between a client's model and the step that applies it.

With concurrency = buffer_size = clients per round and constant durations,
launch r draws the clients `data.sampling.sample_clients` draws for round r,
every update has staleness 0, and the run is the synchronous run bit for bit.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any, Mapping, Sequence

import numpy as np

# kind -> its options and their defaults. `jitter` (any kind): the sigma of a
# mean-one lognormal factor drawn per task (0: a client's tasks take one time).
DURATIONS = {
    "constant": {"jitter": 0.0},  # every client's tasks take 1
    "exponential": {"jitter": 0.0},  # client speeds ~ Exponential(mean 1)
    "lognormal": {"sigma": 1.0, "jitter": 0.0},  # speeds ~ exp(sigma Z - sigma^2 / 2)
}
# kind -> its options and defaults; `staleness_weight` gives each one's formula.
STALENESS = {"constant": {}, "polynomial": {"a": 0.5}, "hinge": {"a": 10.0, "b": 4}}
DEFAULT_DURATIONS = {"kind": "lognormal", "sigma": 1.0, "jitter": 0.0}
DEFAULT_STALENESS = {"kind": "constant"}
# Streams of the run's seed the timeline draws from besides (seed, launch),
# which is client sampling's: client speeds, and each task's jitter.
_SPEED_STREAM, _JITTER_STREAM = 7_101, 7_102


def staleness_weight(tau: int, kind: str = "constant", a: float = 0.5, b: int = 4) -> float:
  """The weight of an update `tau` server steps stale in the buffer's average.

      constant     1
      polynomial   (1 + tau)^-a                        (FedAsync, FedBuff)
      hinge        1 if tau <= b, else 1 / (a (tau - b) + 1)      (FedAsync)

  The buffer's pseudo-gradient is sum_i s(tau_i) w_i Delta_i / sum_i w_i (the
  weights w_i of `server.client_weighting`), as FedBuff's (1/K) sum_i s(tau_i)
  Delta_i is with uniform weights: a stale buffer makes a smaller step.
  """
  if kind == "constant":
    return 1.0
  if kind == "polynomial":
    return float((1.0 + tau) ** -a)
  if kind == "hinge":
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
  raise ValueError(f"staleness kind must be one of {sorted(STALENESS)}, found {kind!r}")


def client_speeds(num_clients: int, seed: int, kind: str = "lognormal",
                  sigma: float = 1.0) -> np.ndarray:
  """Each client's mean task duration (by position in the client list), mean 1."""
  rng = np.random.default_rng([seed, _SPEED_STREAM])
  if kind == "constant":
    return np.ones(num_clients)
  if kind == "exponential":
    return rng.exponential(1.0, num_clients)
  if kind == "lognormal":
    return np.exp(sigma * rng.standard_normal(num_clients) - sigma ** 2 / 2)
  raise ValueError(f"durations kind must be one of {sorted(DURATIONS)}, found {kind!r}")


@dataclasses.dataclass(frozen=True)
class Task:
  """One client's training on one model version: `index` in start order, the
  `launch` number (its data's round number), the `version` it trains from
  (server steps before its start), and virtual `start` and `arrival` times."""

  index: int
  client: Any
  launch: int
  version: int
  start: float
  arrival: float


@dataclasses.dataclass(frozen=True)
class ServerStep:
  """A server step: its number (versions it makes: `number`), its virtual time,
  the updates it averages (in buffer order) and the arrivals dropped since the
  step before as too stale."""

  number: int
  time: float
  tasks: tuple
  dropped: int

  def staleness(self) -> list[int]:
    return [self.number - 1 - task.version for task in self.tasks]

  @property
  def max_staleness(self) -> int:
    return max(self.staleness())

  @property
  def mean_staleness(self) -> float:
    return float(np.mean(self.staleness()))


class Timeline:
  """The server steps of one asynchronous run, simulated as far as asked
  (the module docstring has the rules; `durations` is `{kind: ..., <its
  options>}` of `DURATIONS`)."""

  def __init__(self, client_ids: Sequence[Any], concurrency: int, buffer_size: int,
               max_staleness: int, durations: Mapping[str, Any], seed: int):
    if not 1 <= concurrency <= len(client_ids):
      raise ValueError(f"concurrency must be an integer in [1, {len(client_ids)}] (the "
                       f"clients), found {concurrency!r}")
    if buffer_size < 1 or max_staleness < 0:
      raise ValueError(f"buffer_size must be >= 1 and max_staleness >= 0, found "
                       f"{buffer_size!r} and {max_staleness!r}")
    options = dict(durations)
    kind = options.pop("kind", DEFAULT_DURATIONS["kind"])
    self._jitter = float(options.pop("jitter", 0.0))
    self._speeds = client_speeds(len(client_ids), seed, kind, **options)
    self.client_ids = list(client_ids)
    self.concurrency, self.buffer_size, self.max_staleness = (
        concurrency, buffer_size, max_staleness)
    self.seed = seed
    self.steps: list[ServerStep] = []
    self._tasks: list[Task] = []
    self._in_flight: list = []  # heap of (arrival, index)
    self._buffer: list[Task] = []
    self._dropped = 0
    self._launches = 0
    self._launch(self.concurrency, 0.0)

  def step(self, number: int) -> ServerStep:
    """Server step `number` (from 1), simulating up to it."""
    while len(self.steps) < number:
      self._advance()
    return self.steps[number - 1]

  def live_versions(self, number: int) -> set[int]:
    """The model versions a run keeps after step `number`: `number` itself (the
    next launches train from it) and those of the updates later steps apply.
    An update is applied at most `max_staleness` + 1 steps after its version,
    so the steps up to `number + max_staleness + 1` hold them all."""
    self.step(number + self.max_staleness + 1)
    later = self.steps[number:number + self.max_staleness + 1]
    return {number} | {t.version for s in later for t in s.tasks if t.version <= number}

  @property
  def capacity(self) -> int:
    """The most versions `live_versions` ever holds: one per slot or buffered
    update (concurrency + buffer_size), and one per staleness (max_staleness + 1)."""
    return min(self.concurrency + self.buffer_size, self.max_staleness + 1)

  def _launch(self, n: int, time: float) -> None:
    self._launches += 1
    busy = {self._tasks[i].client for _, i in self._in_flight}
    free = [i for i, c in enumerate(self.client_ids) if c not in busy]
    rng = np.random.default_rng([self.seed, self._launches])
    for position in rng.choice(len(free), size=n, replace=False):
      index = len(self._tasks)
      client = free[position]
      duration = self._speeds[client]
      if self._jitter:
        z = np.random.default_rng([self.seed, _JITTER_STREAM, index]).standard_normal()
        duration *= math.exp(self._jitter * z - self._jitter ** 2 / 2)
      task = Task(index, self.client_ids[client], self._launches, len(self.steps), time,
                  time + float(duration))
      self._tasks.append(task)
      heapq.heappush(self._in_flight, (task.arrival, index))

  def _advance(self) -> None:
    """Processes the next instant with arrivals (see the module doc)."""
    now = self._in_flight[0][0]
    freed = 0
    while self._in_flight and self._in_flight[0][0] == now:
      task = self._tasks[heapq.heappop(self._in_flight)[1]]
      freed += 1
      if len(self.steps) - task.version > self.max_staleness:
        self._dropped += 1
        continue
      self._buffer.append(task)
      if len(self._buffer) == self.buffer_size:
        self.steps.append(ServerStep(len(self.steps) + 1, now, tuple(self._buffer),
                                     self._dropped))
        self._buffer, self._dropped = [], 0
    self._launch(freed, now)
