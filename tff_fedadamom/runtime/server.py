"""The server side of a compiled process's rounds, run in this Python process.

A MapReduceForm round:

    broadcast   = prepare(state)                      server
    accumulator = zero, accumulate(out_c) per client   clients: the client fold
    state', out = update(state, report(accumulator))   server

The in-process, ray and buffered rounds differ only in the middle line, the
client fold each hands to `ServerComputations.round`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from tff_fedadamom.runtime.eager_release import release
from tff_fedadamom.runtime.py_containers import flatten_value, to_python
from tff_fedadamom.runtime.tf_computation import TFComputation


class ServerComputations:
  """`initialize`, `prepare`, `report`, `update` and the process's
  `get_model_weights`/`get_hparams`/`set_hparams` of a `compiled.CompiledProcess`,
  on one device (a full TensorFlow name; None: TensorFlow's choice)."""

  def __init__(self, compiled, device):
    self.compiled = compiled
    self._device = [device]
    self._prepare = TFComputation(compiled.computation("prepare"), self._device)
    self._report = TFComputation(compiled.computation("report"), self._device)
    self.update = TFComputation(compiled.computation("update"), self._device,
                                result_type=compiled.result_types["next"])
    self.state_type = compiled.state_type
    self._extra: dict[str, TFComputation] = {}

  def round(self, state, client_fold: Callable[[list], Sequence[Any]]):
    """One round from `state`: `prepare`, `client_fold(broadcast leaves)` (the
    flat accumulator), `report`, `update`; each tensor made released once used."""
    created = []
    state_leaves = flatten_value(state, self.state_type, created)
    broadcast = self._prepare.call_flat_leaves(state_leaves)
    accumulator = client_fold(broadcast)
    release(broadcast)
    report = self._report.call_flat_leaves(accumulator)
    result = self.update.call_flat_leaves([*state_leaves, *report])
    # `update`'s flat result as TFF's `LearningProcessOutput` (state, metrics).
    output = to_python([t.numpy() for t in result], self.update.result_type)
    release([*created, *accumulator, *report, *result])
    return output

  def computation(self, name: str) -> TFComputation:
    """`initialize` or one of `compiled.EXTRAS`, imported on first use."""
    if name not in self._extra:
      self._extra[name] = TFComputation(self.compiled.computation(name), self._device,
                                        result_type=self.compiled.result_types[name])
    return self._extra[name]


class ServerCalls:
  """The calls of `base.Backend` that run on the server alone, for a backend
  whose `ServerComputations` is its `server` attribute."""

  server: ServerComputations

  @property
  def compiled(self):
    """The `compiled.CompiledProcess` this runs."""
    return self.server.compiled

  def initialize(self):
    return self.server.computation("initialize")()

  def get_model_weights(self, state):
    return self.server.computation("get_model_weights")(state)

  def get_hparams(self, state):
    return self.server.computation("get_hparams")(state)

  def set_hparams(self, state, hparams):
    return self.server.computation("set_hparams")([state, hparams])
