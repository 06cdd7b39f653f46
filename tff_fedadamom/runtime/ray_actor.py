"""The ray backend's actor (`runtime.ray`): one actor's data and client computations.

Ray starts an actor by importing its class's module in a new worker process, so
this module imports nothing heavy at its top: the actor imports TensorFlow, TFF
and the pipeline in its `__init__` (`session.startup_imports`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence


class ClientActor:
  """One actor's state: the experiment's data and the form's client computations.

  Args:
    experiment: The validated config (pickled, it keeps its validated mark).
    computations: `serialize`d bytes of the form's `CLIENT_COMPUTATIONS`.
    threads, max_concurrent_clients: This actor's TensorFlow threads, and `ClientFold`'s.
  """

  def __init__(self, experiment, computations: Mapping[str, bytes], threads: int,
               max_concurrent_clients: Optional[int] = None):
    from tff_fedadamom.session import Session, startup_imports

    # The actor is its process's entry point; it ends with its raylet.
    with startup_imports():
      import tff_fedadamom.experiment.process as process_lib
      from tff_fedadamom.runtime import inprocess
      from tff_fedadamom.runtime.tf_computation import deserialize
    Session(threads=threads, exit_with_parent=True).apply()
    self._client_tensors = process_lib.make_client_tensors(
        experiment, process_lib.load_data(experiment))
    self._outputs: list = []
    # Ray exposes to an actor only the GPUs it was given.
    work, zero, accumulate = (deserialize(computations[name])
                              for name in inprocess.CLIENT_COMPUTATIONS)
    self._fold = inprocess.ClientFold(
        work, zero, accumulate, inprocess.visible_devices(), max_concurrent_clients,
        feed=inprocess.client_feed(self._client_tensors, work))

  def work(self, client_ids: Sequence[Any], rounds: Sequence[int], which: Sequence[int],
           *broadcasts: Sequence, scales: Optional[Sequence[float]] = None,
           update: Optional[slice] = None) -> int:
    """Runs `work` for client `client_ids[i]` with its data of round
    `rounds[i]`, trained from `broadcasts[which[i]]` (numpy leaves), its update
    scaled by `scales[i]` when given (`inprocess.scale_update`); keeps the
    outputs for `fold`."""
    import tensorflow as tf

    from tff_fedadamom.runtime.inprocess import scale_update

    client_args = [self._client_tensors.args(cid, r) for cid, r in zip(client_ids, rounds)]
    tensors = [[tf.convert_to_tensor(b) for b in leaves] for leaves in broadcasts]
    outputs = list(self._fold.outputs(client_args, [tensors[w] for w in which]))
    if scales is not None:
      outputs = [scale_update(o, s, update) for o, s in zip(outputs, scales)]
    self._outputs = outputs
    return len(self._outputs)

  def fold(self, accumulator: Optional[Sequence]) -> list:
    """`accumulator` (None: `zero`) with the last `work`'s outputs accumulated
    onto it in client order (numpy leaves)."""
    import tensorflow as tf

    if accumulator is not None:
      accumulator = [tf.convert_to_tensor(a) for a in accumulator]
    return [t.numpy() for t in self._fold.fold(self._outputs, accumulator)]

  def pid(self) -> int:
    return os.getpid()

  def node(self) -> Any:
    """The id of the Ray node this actor runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()
