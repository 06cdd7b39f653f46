"""A whole in-process round as one TensorFlow call.

Called computation by computation, a round is 2K + 4 calls from Python
(`prepare`, K `work`, `zero`, K `accumulate`, `report`, `update`) with the
clients' work handed to a thread pool and back. `FusedRound` imports the same
computations into one graph:

    broadcast = prepare(state)
    out_i     = work_i(client_i's tensors and seed, broadcast)   i = 1..K
    acc       = accumulate(...accumulate(zero(), out_1)..., out_K)
    state', metrics = update(state, report(acc))

Each client has its own import of `work` (its own variables, initialized at the
start of its call, as `TFComputation` does), placed on its device
(`devices[i % len(devices)]`); TensorFlow runs the K `work` calls side by side on
its inter-op threads, at most `max_concurrent` at a time (client i starts after
client i - max_concurrent has finished), and the accumulation follows client
order. It is built once per learning process and K (`Fusion`), once rounds of
K clients have run `fuse_after` times call by call.

Why its numbers are those of call-by-call rounds: each computation's function
is marked never to be inlined (`tf_computation._wrap_alone`), so TensorFlow
optimizes it alone, as it does when it is called by itself; optimized together
with the rest of the round, the quickstart CNN's weights (conv layers,
dropout) differed by 0.7% (relative) after 2 rounds. The ray backend's actors
make the same calls one by one, and give the same bits.

Not for computations that need fresh kernels on every call (stateful random
ops; `graph_defs.needs_fresh_kernels`): `InProcessLearningProcess` keeps
those call by call.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable, Optional, Sequence, TypeVar

import tensorflow as tf

from tff_fedadamom.pipeline.py_containers import type_leaves
from tff_fedadamom.pipeline.feed import Feed
from tff_fedadamom.pipeline.tf_computation import _flat_call, _Slot


LOG = logging.getLogger(__name__)
_Fused = TypeVar("_Fused")


def build_or_none(build: Callable[[], _Fused], what: str) -> Optional[_Fused]:
  """`build()`, or None, with a one-line warning, when TensorFlow cannot build
  the one graph.

  Seen once: a freshly built ResNet-18 `work` (width 0.125), called inside
  another graph, failed when TensorFlow added the call op ("Missing src
  context", an InternalError), while the same structure loaded from an older
  cache entry did not; the cause was not found. The calls one by one give the
  same bits, so the caller falls back to them.
  """
  try:
    return build()
  except tf.errors.OpError as error:
    LOG.warning("%s: TensorFlow could not build it as one graph (%s: %s); its calls "
                "run one by one, with the same results", what, type(error).__name__,
                error.message)
    return None


class Fusion:
  """The one-call form of a group of calls, per client count: built once the
  calls for that count have run `after` times one by one.

  Why wait: the one call costs more to build than the calls it replaces (a
  copy of `work` per client, each imported and optimized by TensorFlow), and
  pays back only over many rounds. Measured on this project's 2-core machine:
  the first round of digits/logistic (5 clients) took 1.0-1.2 s as one call
  against 0.28-0.35 s call by call, then saved about 3.5 ms a round; on the
  MLP-64, 1.4-1.5 s against 0.4 s. Short runs (tests, sweep trials that ASHA
  stops) never build it; long ones build it early in their run. Either way the
  numbers are the same bits (see the module docstring).

  Args:
    after: Rounds of a client count run call by call before its one call is
      built; 0 builds it for the first; None never builds one.
  """

  def __init__(self, after: Optional[int]):
    if after is not None and after < 0:
      raise ValueError(f"fuse_after_rounds must be an integer >= 0 or None, found {after!r}")
    self.after = after
    self._built: dict[int, object] = {}
    self._calls: collections.Counter = collections.Counter()

  @property
  def enabled(self) -> bool:
    """Whether calls may still become one (False: never, or TensorFlow could not)."""
    return self.after is not None

  def get(self, clients: int, build: Callable[[], _Fused], what: str) -> Optional[_Fused]:
    """The one call for `clients` clients, built by `build()` when it is due,
    or None: make this group's calls one by one (and count them)."""
    if self.after is None:
      return None
    if clients in self._built:
      return self._built[clients]
    if self._calls[clients] < self.after:
      self._calls[clients] += 1
      return None
    fused = build_or_none(build, what)
    if fused is None:
      self.after = None  # what TensorFlow cannot build once, it is not asked again
    else:
      self._built[clients] = fused
    return fused


def _slot(computation, device: str, feed=None) -> _Slot:
  parameter = computation.type_signature.parameter
  return _Slot(computation._computation_proto,  # noqa: SLF001
               type_leaves(parameter) if parameter is not None else [], device, feed)


def _client_outputs(works: Sequence[_Slot], devices: Sequence[str], client_args, broadcast,
                    max_concurrent: int) -> list:
  """Each client's `work` outputs, as ops of the graph being built: client i's
  slot on `devices[i]`, starting once client i - max_concurrent has finished."""
  outputs = []
  for i, (work, args) in enumerate(zip(works, client_args)):
    after = [outputs[i - max_concurrent][0]] if i >= max_concurrent else []
    with tf.device(devices[i]), tf.control_dependencies(after):
      outputs.append(work.in_graph([*args, *broadcast]))
  return outputs


def _split(flat: Sequence, size: int, count: int) -> list:
  return [list(flat[i * size:(i + 1) * size]) for i in range(count)]


class FusedRound:
  """One round of `clients` clients as one call: `(state leaves, each client's
  feed arguments but the last, the clients' last arguments stacked) -> the flat
  results of `update` (the new state's leaves, then the metrics')`.

  A client's last feed argument is a scalar, its round seed
  (`ClientTensors.args`); the round takes the K seeds as one vector
  (`ClientTensors.round_seeds`) and hands client i its element i: one tensor
  made per round in Python instead of K (each conversion costs tens of
  microseconds, a few percent of a small model's round).
  """

  def __init__(self, compiled, devices: Sequence[str], clients: int, feed: Feed,
               state_specs: Sequence[tf.TensorSpec], max_concurrent: int):
    server = devices[0]
    prepare, zero, accumulate, report, update = (
        _slot(compiled.computation(name), server)
        for name in ("prepare", "zero", "accumulate", "report", "update"))
    # Client i on devices[i % len(devices)], as the call-by-call rounds spread them.
    self.client_devices = [devices[i % len(devices)] for i in range(clients)]
    works = [_slot(compiled.computation("work"), device, feed)
             for device in self.client_devices]
    n_state, n_client = len(state_specs), len(feed.signature)
    self.clients = clients

    def body(*flat):
      state = list(flat[:n_state])
      client_args = [[*args, seed] for args, seed in zip(
          _split(flat[n_state:-1], n_client - 1, clients), tf.unstack(flat[-1], clients))]
      outputs = _client_outputs(works, self.client_devices, client_args,
                                prepare.in_graph(state), max_concurrent)
      with tf.device(server):
        accumulator = zero.in_graph([])
        for output in outputs:
          accumulator = accumulate.in_graph([*accumulator, *output])
        return update.in_graph([*state, *report.in_graph(accumulator)])

    *leading, last = feed.signature
    signature = [*state_specs, *(leading * clients),
                 tf.TensorSpec([clients, *last.shape], last.dtype)]
    self._function = tf.compat.v1.wrap_function(body, signature)

  def __call__(self, state_leaves: Sequence, client_args: Sequence[Sequence], lasts) -> list:
    if len(client_args) != self.clients:
      raise ValueError(f"this round takes {self.clients} clients, found {len(client_args)}")
    flat = [*state_leaves, *(a for args in client_args for a in args), lasts]
    return _flat_call(self._function, flat)


class FusedWork:
  """`clients` clients' `work` as one call: `(client args, broadcast leaves) ->
  each client's flat outputs`, in client order.

  What a ray actor runs for its block of a round's clients (`inprocess.ClientFold`
  with `fuse_after`): the clients of `FusedRound`, without the server's part,
  which the driver runs.
  """

  def __init__(self, work, devices: Sequence[str], clients: int, feed: Feed,
               max_concurrent: int):
    self.client_devices = [devices[i % len(devices)] for i in range(clients)]
    works = [_slot(work, device, feed) for device in self.client_devices]
    broadcast = type_leaves(work.type_signature.parameter)[feed.replaces:]
    n_client = len(feed.signature)
    self.clients = clients
    self._outputs = 0

    def body(*flat):
      outputs = _client_outputs(works, self.client_devices,
                                _split(flat, n_client, clients), flat[clients * n_client:],
                                max_concurrent)
      self._outputs = len(outputs[0])
      return [t for output in outputs for t in output]

    signature = [*(list(feed.signature) * clients),
                 *(tf.TensorSpec(t.shape, t.dtype) for t in broadcast)]
    self._function = tf.compat.v1.wrap_function(body, signature)

  def __call__(self, client_args: Sequence[Sequence], broadcast: Sequence) -> list:
    if len(client_args) != self.clients:
      raise ValueError(f"this call takes {self.clients} clients, found {len(client_args)}")
    flat = [*(a for args in client_args for a in args), *broadcast]
    return _split(_flat_call(self._function, flat), self._outputs, self.clients)
