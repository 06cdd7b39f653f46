"""A sweep silences the warnings it expects only while it runs: no environment
variable and no logger is left changed."""

import logging
import os

from tuning.sweep import expected_warnings_silenced


def _record(name, level, message):
  return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_expected_warnings_are_filtered_only_inside_the_block():
  tune_state = logging.getLogger("ray.tune.execution.experiment_state")
  x2num = logging.getLogger("tensorboardX.x2num")
  snapshot = _record(tune_state.name, logging.WARNING,
                     "Experiment state snapshotting has been triggered multiple times")
  other = _record(tune_state.name, logging.WARNING, "something else")
  nan = _record(x2num.name, logging.WARNING, "NaN or Inf found in input tensor.")
  env, levels = dict(os.environ), (tune_state.level, x2num.level)
  assert tune_state.filter(snapshot) and x2num.filter(nan)
  with expected_warnings_silenced():
    assert not tune_state.filter(snapshot) and not x2num.filter(nan)
    assert tune_state.filter(other)
    assert x2num.filter(_record(x2num.name, logging.ERROR, "an error"))
  assert tune_state.filter(snapshot) and x2num.filter(nan)
  assert dict(os.environ) == env and (tune_state.level, x2num.level) == levels
