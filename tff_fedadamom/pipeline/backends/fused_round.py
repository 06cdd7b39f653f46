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
order. It is built once per learning process and K, when a round of K clients
first runs.

What it does not keep: TensorFlow inlines the computations' functions into the
one graph and optimizes that graph as a whole, where call-by-call rounds
optimize each computation alone. On digits/logistic and the MLP the results
were bit-identical to call-by-call rounds; on the quickstart CNN (conv layers,
dropout) the weights differed by 0.7% (relative) after 2 rounds. The ray backend runs its clients
call by call, so `InProcessLearningProcess` uses fused rounds only when asked
(`fused_rounds=True`).

Not for computations that need fresh kernels on every call (stateful random
ops; `tf_computation.needs_fresh_kernels`): `InProcessLearningProcess` keeps
those call by call.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tff_fedadamom.pipeline.py_containers import type_leaves
from tff_fedadamom.pipeline.tf_computation import Feed, _flat_call, _Slot


def _slot(compiled, name: str, device: str, feed=None) -> _Slot:
  computation = compiled.computation(name)
  parameter = computation.type_signature.parameter
  return _Slot(computation._computation_proto,  # noqa: SLF001
               type_leaves(parameter) if parameter is not None else [], device, feed)


class FusedRound:
  """One round of `clients` clients as one call: `(state leaves, client args) -> the
  flat results of `update` (the new state's leaves, then the metrics')."""

  def __init__(self, compiled, devices: Sequence[str], clients: int, feed: Feed,
               state_specs: Sequence[tf.TensorSpec], max_concurrent: int):
    server = devices[0]
    prepare, zero, accumulate, report, update = (
        _slot(compiled, name, server) for name in ("prepare", "zero", "accumulate", "report",
                                                   "update"))
    # Client i on devices[i % len(devices)], as the call-by-call rounds spread them.
    self.client_devices = [devices[i % len(devices)] for i in range(clients)]
    works = [_slot(compiled, "work", device, feed) for device in self.client_devices]
    n_state, n_client = len(state_specs), len(feed.signature)
    self.clients = clients

    def body(*flat):
      state = list(flat[:n_state])
      broadcast = prepare.in_graph(state)
      outputs = []
      for i, work in enumerate(works):
        args = list(flat[n_state + i * n_client:n_state + (i + 1) * n_client])
        after = [outputs[i - max_concurrent][0]] if i >= max_concurrent else []
        with tf.device(self.client_devices[i]), tf.control_dependencies(after):
          outputs.append(work.in_graph([*args, *broadcast]))
      with tf.device(server):
        accumulator = zero.in_graph([])
        for output in outputs:
          accumulator = accumulate.in_graph([*accumulator, *output])
        return update.in_graph([*state, *report.in_graph(accumulator)])

    signature = [*state_specs, *(list(feed.signature) * clients)]
    self._function = tf.compat.v1.wrap_function(body, signature)

  def __call__(self, state_leaves: Sequence, client_args: Sequence[Sequence]) -> list:
    if len(client_args) != self.clients:
      raise ValueError(f"this round takes {self.clients} clients, found {len(client_args)}")
    flat = [*state_leaves, *(a for args in client_args for a in args)]
    return _flat_call(self._function, flat)
