"""The names of the metrics a run records: one home for every file that reads them.

A run's history (`metrics.csv`, Ray Tune's reports, the summary) keys each
round's values by these names; the training loop, the run's outputs, the sweep
objective, the exported tables, the paper report and the tests all read them
from here.
"""

ROUND = "round"  # the round a row belongs to (1 = after the first round)
NONFINITE_UPDATES = "nonfinite_updates"  # 1 when the round's update was rejected

TRAIN_LOSS = "train/loss"
TRAIN_ACCURACY = "train/accuracy"
TRAIN_NUM_EXAMPLES = "train/num_examples"
TEST_LOSS = "test/loss"
TEST_ACCURACY = "test/accuracy"
TEST_PREFIX = "test/"  # every evaluation metric's; a row with one is an evaluated round


def evaluated(row) -> bool:
  """True for a history row (a mapping of metric names) of an evaluated round."""
  return any(key.startswith(TEST_PREFIX) for key in row)
