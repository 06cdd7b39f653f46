"""Runs a TFF learning process inside the Python process, on TensorFlow's devices.

TFF 0.87's local execution context runs every TensorFlow computation in a
`worker_binary` child built without CUDA that serves unauthenticated gRPC on
all interfaces. This module runs the same, unchanged process without it: its
MapReduceForm (`compiled`) is plain TensorFlow graphs (`tf_computation`), which
TensorFlow places on a GPU when one is visible, and a round is the form's
semantics spelled out in Python (`server`; TFF's reference is
`get_computation_for_map_reduce_form`).

Results do not depend on timing: each call runs on fresh variables private to
its slot (`tf_computation`), and clients that run concurrently are accumulated
in client order. A `tf.data.Dataset` iterated twice reshuffles, so `next`
takes fresh datasets.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Iterator, Optional, Sequence

import tensorflow as tf

from tff_fedadamom.runtime.server import ServerCalls, ServerComputations
from tff_fedadamom.runtime.eager_release import release
from tff_fedadamom.runtime.py_containers import type_leaves
from tff_fedadamom.runtime.tf_computation import Feed, TFComputation

# The form's computations that run a round's clients: here in one `ClientFold`,
# on the ray backend in one per actor.
CLIENT_COMPUTATIONS = ("work", "zero", "accumulate")


def visible_devices() -> list[str]:
  """The devices rounds run on by default: every visible GPU, else the first CPU."""
  gpus = tf.config.list_logical_devices("GPU")
  return [d.name for d in gpus] or [tf.config.list_logical_devices("CPU")[0].name]


def _short(name: str) -> str:
  return name.split("device:")[-1].upper().lstrip("/")


def visible_names() -> list[str]:
  """Short names ('CPU:0', 'GPU:1', ...) of every device TensorFlow sees."""
  return [_short(d.name) for d in tf.config.list_logical_devices()]


def resolve_devices(devices: Optional[Sequence[str]]) -> list[str]:
  """Full TensorFlow names of `devices` ('GPU:1' -> '/job:localhost/.../device:GPU:1').

  Raises:
    ValueError: naming the first device TensorFlow does not see.
  """
  if not devices:
    return visible_devices()
  known = {_short(d.name): d.name for d in tf.config.list_logical_devices()}
  for device in devices:
    if _short(str(device)) not in known:
      raise ValueError(f"device {device!r} is not visible to TensorFlow")
  return [known[_short(str(device))] for device in devices]


def cpu_threads() -> int:
  """TensorFlow's inter-op threads: how many clients' kernels can run side by side."""
  from tff_fedadamom.session import cpu_count

  return tf.config.threading.get_inter_op_parallelism_threads() or cpu_count()


class ClientFold:
  """`work` on each client, concurrently, folded by `zero`/`accumulate` in client
  order: the in-process backend's one fold of a round's clients, or one actor's.

  Client i runs on `devices[i % len(devices)]` (full TensorFlow names),
  `zero`/`accumulate` on the first; `max_concurrent_clients` at once (at least
  one per device; default: one per device, on a lone CPU TensorFlow's inter-op
  threads). `feed`: the `tf_computation.Feed` `work` takes for its dataset.
  """

  def __init__(self, work, zero, accumulate, devices: Sequence[str],
               max_concurrent_clients: Optional[int] = None, feed: Optional[Feed] = None):
    if max_concurrent_clients is not None and max_concurrent_clients < 1:
      raise ValueError(
          f"max_concurrent_clients must be an integer >= 1 or None, found {max_concurrent_clients!r}")
    devices = list(devices)
    lone_cpu = devices[0].endswith("CPU:0") and len(devices) == 1
    if max_concurrent_clients is None:
      max_concurrent_clients = cpu_threads() if lone_cpu else len(devices)
    self.max_concurrent_clients = max(max_concurrent_clients, len(devices))
    slots = -(-self.max_concurrent_clients // len(devices))
    self.work = TFComputation(work, devices, slots_per_device=slots, feed=feed)
    self._zero = TFComputation(zero, devices[:1])
    self._accumulate = TFComputation(accumulate, devices[:1])
    self._pool = concurrent.futures.ThreadPoolExecutor(
        self.max_concurrent_clients, thread_name_prefix="tff-client")

  def outputs(self, client_args: Sequence[Sequence[Any]],
              broadcasts: Sequence[Sequence[Any]]) -> Iterator[list]:
    """`work`'s flat outputs on `client_args[i]` and `broadcasts[i]` (flat
    leaves) per client i, in client order: all submitted at once."""
    futures = [self._pool.submit(self.work.call_flat_leaves, [*args, *broadcast], i)
               for i, (args, broadcast) in enumerate(zip(client_args, broadcasts))]
    return (future.result() for future in futures)

  def fold(self, outputs, accumulator: Optional[Sequence[Any]] = None) -> list:
    """`accumulator` (default: `zero`) with `outputs` accumulated onto it, in
    order, each output and each accumulator but the result released once used."""
    if accumulator is None:
      accumulator = self._zero.call_flat_leaves([])
    for output in outputs:
      folded = self._accumulate.call_flat_leaves([*accumulator, *output])
      release([*accumulator, *output])
      accumulator = folded
    return accumulator

  def close(self) -> None:
    self._pool.shutdown(wait=True)

  def __del__(self):
    pool = getattr(self, "_pool", None)
    if pool is not None:
      pool.shutdown(wait=False)


def scale_update(output: Sequence[Any], scale: float, update: slice) -> list:
  """`work`'s flat `output` with its `update` leaves (the client's weighted
  model delta) multiplied by `scale`; unchanged, the same tensors, for 1.
  One float32 product per element, so every backend computes the same bits."""
  output = list(output)
  if scale == 1.0:
    return output
  for i in range(update.start, update.stop):
    scaled = output[i] * tf.constant(scale, output[i].dtype)
    release([output[i]])
    output[i] = scaled
  return output


def client_feed(client_tensors, work) -> Optional[Feed]:
  """The `Feed` that builds a client's round dataset, or its stacked batches
  (`algorithms.unrolled`), inside its `work` call from `client_tensors.args(...)`;
  None without `client_tensors`."""
  from tff_fedadamom.algorithms.unrolled import is_stacked

  if client_tensors is None:
    return None
  if is_stacked(type_leaves(work.type_signature.parameter)[0]):
    return Feed(client_tensors.signature, 1,
                lambda *args: [client_tensors.stacked(*args)._variant_tensor],  # noqa: SLF001
                to_element=lambda *args: tf.nest.flatten(client_tensors.stacked_element(*args)),
                source=client_tensors)
  return Feed(client_tensors.signature, 1,
              lambda *args: [client_tensors.dataset(*args)._variant_tensor],  # noqa: SLF001
              source=client_tensors)


class InProcessLearningProcess(ServerCalls):
  """A `tff.learning.templates.LearningProcess`, run in this Python process:
  the same calls, returning the Python containers TFF's own context returns.

  `process`: any learning process whose `next` TFF compiles to MapReduceForm,
  or its `compiled.CompiledProcess`; `devices` (default: `visible_devices`) and
  `max_concurrent_clients` as `ClientFold`'s. With the training set's
  `client_tensors`, it is the `inprocess` backend (`base.Backend`).
  """

  def __init__(self, process, devices: Optional[Sequence[str]] = None,
               max_concurrent_clients: Optional[int] = None, client_tensors=None):
    from tff_fedadamom.runtime.compiled import compile_process

    compiled = compile_process(process)
    self._process = None if process is compiled else process
    self._client_tensors = client_tensors
    self.devices = resolve_devices(devices)
    self.server = ServerComputations(compiled, self.devices[0])
    self._clients = ClientFold(
        *(compiled.computation(name) for name in CLIENT_COMPUTATIONS), self.devices,
        max_concurrent_clients, feed=client_feed(client_tensors, compiled.computation("work")))
    self.max_concurrent_clients = self._clients.max_concurrent_clients
    self._work = self._clients.work

  @property
  def process(self):
    """The wrapped TFF learning process (None when built from a `CompiledProcess`)."""
    return self._process

  def next(self, state, client_data: Sequence[Any]):
    """One round over fresh `tf.data.Dataset`s, one per client."""
    if self._client_tensors is not None:
      raise TypeError("this process builds client datasets itself: call "
                      "next_for_clients(state, client_ids, round_num)")
    return self._round(state, [[dataset._variant_tensor] for dataset in client_data])  # noqa: SLF001

  def next_for_clients(self, state, client_ids: Sequence[Any], round_num: int):
    """One round over `client_ids`, their datasets built in their `work` calls."""
    if self._client_tensors is None:
      raise TypeError("next_for_clients needs client_tensors=...; call next(state, datasets)")
    client_args = [self._client_tensors.args(cid, round_num) for cid in client_ids]
    output = self._round(state, client_args)
    release(args[-1] for args in client_args)  # the round seeds; the examples stay
    return output

  def fold_tasks(self, tasks: Sequence[tuple], broadcasts: Sequence[Sequence[Any]],
                 which: Sequence[int], scales: Sequence[float], update: slice) -> list:
    """An asynchronous step's accumulator (`runtime.buffered`): task i is
    (client id, the round its data is drawn for), trained from
    `broadcasts[which[i]]` (flat leaves: arrays, or tensors the caller
    releases), its update scaled by `scales[i]`, folded in task order."""
    client_args = [self._client_tensors.args(cid, round_num) for cid, round_num in tasks]
    tensors = [[b if tf.is_tensor(b) else tf.convert_to_tensor(b) for b in broadcast]
               for broadcast in broadcasts]
    outputs = self._clients.outputs(client_args, [tensors[w] for w in which])
    accumulator = self._clients.fold(
        scale_update(output, scale, update) for output, scale in zip(outputs, scales))
    created = [t for leaves, broadcast in zip(tensors, broadcasts)
               for t, b in zip(leaves, broadcast) if t is not b]
    release([*(args[-1] for args in client_args), *created])
    return accumulator

  def _round(self, state, client_args):
    def fold(broadcast):
      return self._clients.fold(self._clients.outputs(client_args, [broadcast] * len(client_args)))

    return self.server.round(state, fold)

  def close(self) -> None:
    """Stops the client threads (also done when the object is collected)."""
    self._clients.close()
