"""TensorBoard event files of a run, written without TensorFlow ops.

A run writes each round's metrics as TensorBoard scalars and, every
`histogram_every` rounds, histograms of the server optimizer's state. TFF's
`tff.program.TensorBoardReleaseManager` and `tf.summary` build every value as
eager tensors (tag, step, value, metadata: about 240 a round for digits/logistic
with telemetry). In TensorFlow 2.14 on Python 3.11 each eager tensor created
leaves a Python-side block behind for good (16 bytes in a bare process, 48 in a
run; tracemalloc attributes it to the line that created the tensor), so those
summaries grew a long run's memory by about 10 MB per 1,000 rounds
(`benchmarks/round_memory.py --trace`).

Here the summaries are the protos TensorBoard's own `scalar_pb` and
`histogram_pb` build in numpy (the same tags, plugin metadata and float32
values as `tf.summary.scalar`; histograms with TensorBoard's default of 30
buckets), written by TensorBoard's event file writer.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
import tensorflow_federated as tff


class EventWriter:
  """Scalars and histograms into one new event file of `logdir`."""

  def __init__(self, logdir: str):
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    self._writer = EventFileWriter(logdir)

  def _write(self, summaries, step: int) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    values = [value for summary in summaries for value in summary.value]
    if values:
      self._writer.add_event(event_pb2.Event(
          wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)))

  def scalars(self, values: Mapping[str, Any], step: int) -> None:
    """One scalar per name (cast to float32, as `tf.summary.scalar` does)."""
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb

    self._write([scalar_pb(name, np.asarray(value)) for name, value in values.items()], step)

  def histograms(self, values: Mapping[str, np.ndarray], step: int) -> None:
    """One histogram per name, of the array's values."""
    from tensorboard.plugins.histogram.summary_v2 import histogram_pb

    self._write([histogram_pb(name, np.asarray(value)) for name, value in values.items()],
                step)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class ReleaseManager(tff.program.ReleaseManager):
  """Releases values to TensorBoard as TFF's `TensorBoardReleaseManager` does:
  each numeric leaf (named by its path in the structure) becomes a scalar, or a
  histogram when it is an array; other leaves are ignored."""

  def __init__(self, summary_dir: str):
    self._writer = EventWriter(summary_dir)

  async def release(self, value, key: int) -> None:
    from tensorflow_federated.python.program import structure_utils

    scalars, histograms = {}, {}
    for name, leaf in structure_utils.flatten_with_name(value):
      array = np.asarray(leaf)
      if array.dtype.kind in "biuf":
        (histograms if array.shape else scalars)[name] = array
    self._writer.scalars(scalars, key)
    self._writer.histograms(histograms, key)

  def close(self) -> None:
    self._writer.close()
