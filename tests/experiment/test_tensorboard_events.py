"""The run's TensorBoard events, written without TensorFlow ops, read back as
TensorBoard reads those of `tf.summary`."""

import asyncio
import glob
import os
import warnings

import numpy as np
import tensorflow as tf

from tff_fedadamom.experiment import tensorboard_events


def _values(logdir):
  """(step, tag, plugin, ndarray) of every summary value in `logdir`'s event files."""
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        out.append((event.step, value.tag, value.metadata.plugin_data.plugin_name,
                    tf.make_ndarray(value.tensor)))
  return out


def test_scalars_are_those_tf_summary_writes(tmp_path):
  metrics = {"train/loss": 0.3, "opt/v_mean": np.float64(1e-7), "round_count": 4}
  writer = tf.summary.create_file_writer(str(tmp_path / "tf"))
  with writer.as_default(step=7):
    for name, value in metrics.items():
      tf.summary.scalar(name, value)
  writer.close()
  ours = tensorboard_events.EventWriter(str(tmp_path / "ours"))
  ours.scalars(metrics, 7)
  ours.close()
  expected, got = _values(tmp_path / "tf"), _values(tmp_path / "ours")
  assert [v[:3] for v in got] == [v[:3] for v in expected] == [
      (7, name, "scalars") for name in metrics]
  for (*_, want), (*_, have) in zip(expected, got):
    assert have.dtype == want.dtype == np.float32 and have.shape == want.shape == ()
    assert have == want


def test_release_manager_writes_scalars_and_histograms_and_skips_the_rest(tmp_path):
  manager = tensorboard_events.ReleaseManager(str(tmp_path))
  asyncio.run(manager.release({"loss": 0.5, "v": np.arange(10.0), "name": "x"}, key=3))
  manager.close()
  got = {tag: (step, plugin, value) for step, tag, plugin, value in _values(tmp_path)}
  assert set(got) == {"loss", "v"}
  assert got["loss"][:2] == (3, "scalars") and got["loss"][2] == np.float32(0.5)
  step, plugin, buckets = got["v"]
  assert (step, plugin) == (3, "histograms")
  # [left edge, right edge, count] per bucket: every value counted once, over 0..9.
  assert buckets[:, 2].sum() == 10 and buckets[0, 0] == 0 and buckets[-1, 1] == 9


def test_histograms_are_the_protos_tensorboard_builds():
  """Our fast count gives TensorBoard's `histogram_pb` proto, byte for byte, on
  data of every kind its rule treats apart: spread, skewed, integer, one
  value, empty, the maximum on a bucket edge, NaN and inf among the values."""
  from tensorboard.plugins.histogram.summary_v2 import histogram_pb

  rng = np.random.default_rng(0)
  cases = {
      "normal": rng.standard_normal(10_000).astype(np.float32),
      "skewed": np.exp(rng.standard_normal((50, 40))),
      "integers": rng.integers(-5, 6, size=999),
      "one value": np.full(7, 2.5),
      "empty": np.zeros((0, 3)),
      "edges": np.linspace(0.0, 30.0, 31),
      "nan": np.array([np.nan, 1.0, 2.0, 3.0]),
      "inf": np.array([-np.inf, 0.0, 1.0]),
      "two values": np.array([1e-30, 2e-30]),
  }
  for name, data in cases.items():
    with np.errstate(all="ignore"):  # TensorBoard's own warns on NaN and inf
      want = histogram_pb(name, data).SerializeToString()
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # ours does not
      assert tensorboard_events.histogram_pb(name, data).SerializeToString() == want, name
