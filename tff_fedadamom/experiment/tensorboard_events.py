"""TensorBoard event files of a run (each round's scalars, the optimizer state's
histograms), written without TensorFlow ops.

TFF's `TensorBoardReleaseManager` and `tf.summary` build every value as eager
tensors, and in TensorFlow 2.14 on Python 3.11 each eager tensor leaves a block
behind for good (`runtime.eager_release`), so a long run's memory grew with its
rounds. Here the summaries are the protos TensorBoard's own `scalar_pb` and
`histogram_pb` build in numpy (the same tags, metadata and float32 values as
`tf.summary.scalar`), written by TensorBoard's event writer.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
import tensorflow_federated as tff


def histogram_pb(tag: str, data):
  """TensorBoard's `histogram_pb(tag, data)`, the same proto, with the buckets
  counted by `np.bincount`: TensorBoard's own compares every value with every
  bucket, hundreds of MB for ResNet-18's 11 million parameters. The rest is
  TensorBoard's (float64 values, `linspace` edges from min to max, bucket
  floor((value - min) / width) clamped to the last, NaN counted nowhere); empty
  and one-valued data go to TensorBoard's function itself.
  """
  from tensorboard.compat.proto import summary_pb2
  from tensorboard.plugins.histogram import metadata, summary_v2
  from tensorboard.util import tensor_util

  values = np.asarray(data).ravel().astype(float)
  if values.size == 0:
    return summary_v2.histogram_pb(tag, values)
  low, high = np.min(values), np.max(values)
  if high - low == 0:
    return summary_v2.histogram_pb(tag, values)
  buckets = summary_v2.DEFAULT_BUCKET_COUNT
  width = (high - low) / buckets
  # NaN and inf land nowhere, as in TensorBoard's; a diverged run's histogram
  # says so without numpy's warnings.
  with np.errstate(invalid="ignore", over="ignore"):
    index = np.minimum(np.floor((values - low) / width).astype(int), buckets - 1)
    edges = np.linspace(low, high, buckets + 1)
  counts = np.bincount(index[index >= 0], minlength=buckets)
  table = np.array([edges[:-1], edges[1:], counts]).transpose()
  summary = summary_pb2.Summary()
  summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(
      display_name=None, description=None),
      tensor=tensor_util.make_tensor_proto(table, dtype=np.float64))
  return summary


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
    self._write([histogram_pb(name, np.asarray(value)) for name, value in values.items()],
                step)

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
