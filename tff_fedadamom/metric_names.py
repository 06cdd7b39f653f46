"""The names of the metrics a run records: one home for every file that reads them.

A run's history (`metrics.jsonl`, Ray Tune's reports, the summary) keys each
round's values by these names; the sweep objective, the exported tables, the
paper report and the tests all read them from here.
"""

TRAIN_LOSS = "train/loss"
TRAIN_ACCURACY = "train/accuracy"
TRAIN_NUM_EXAMPLES = "train/num_examples"
TEST_LOSS = "test/loss"
TEST_ACCURACY = "test/accuracy"
