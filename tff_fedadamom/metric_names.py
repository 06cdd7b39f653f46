"""The names of the metrics a run records (`metrics.csv`, Ray Tune's reports, the
summary): one home for every file that reads them."""

ROUND = "round"  # the round a row belongs to (1 = after the first round)
NONFINITE_UPDATES = "nonfinite_updates"  # 1 when the round's update was rejected

# Keras' and TFF's keys of a model's loss and example count (`client_work/train`
# metrics, `Model.evaluate`'s result), which a row renames to the names below.
LOSS = "loss"
NUM_EXAMPLES = "num_examples"

TRAIN_PREFIX = "train/"  # the clients' training metrics of the round
TRAIN_LOSS = TRAIN_PREFIX + LOSS
TRAIN_ACCURACY = TRAIN_PREFIX + "accuracy"
TRAIN_NUM_EXAMPLES = TRAIN_PREFIX + NUM_EXAMPLES
TEST_PREFIX = "test/"  # every evaluation metric's; a row with one is an evaluated round
TEST_LOSS = TEST_PREFIX + LOSS
TEST_ACCURACY = TEST_PREFIX + "accuracy"
# The same on the examples held out from the training clients (`data.validation`).
VALIDATION_PREFIX = "validation/"
VALIDATION_LOSS = VALIDATION_PREFIX + LOSS
VALIDATION_ACCURACY = VALIDATION_PREFIX + "accuracy"

# An asynchronous run's server step (`asynchrony`): its virtual time, the
# staleness of the updates it averaged, and the arrivals dropped as too stale.
ASYNC_PREFIX = "async/"
VIRTUAL_TIME = ASYNC_PREFIX + "virtual_time"
MEAN_STALENESS = ASYNC_PREFIX + "mean_staleness"
MAX_STALENESS = ASYNC_PREFIX + "max_staleness"
DROPPED = ASYNC_PREFIX + "dropped"

ELAPSED_S = "time/elapsed_s"  # seconds from the run's start to the round's end
TELEMETRY_S = "time/telemetry_s"  # seconds the round's optimizer statistics took

# The server optimizer's state after the round (`experiment.telemetry`); also
# the prefix of its TensorBoard histograms.
OPT_PREFIX = "opt/"
LEARNING_RATE = OPT_PREFIX + "learning_rate"  # the rate for the next round
MOMENTUM_NORM = OPT_PREFIX + "momentum_norm"  # global L2 norm of the momentum m
UPDATE_NORM = OPT_PREFIX + "update_norm"  # global L2 norm of the round's update
BETA1_MEAN = OPT_PREFIX + "beta1_mean"  # FedAdamom's beta1_t, mean over coordinates
FRAC_BETA1_AT_0 = OPT_PREFIX + "frac_beta1_at_0"  # fraction with beta1_t == 0
FRAC_BETA1_AT_MAX = OPT_PREFIX + "frac_beta1_at_max"  # fraction with beta1_t == 1 - eps


def moment_stats(moment: str) -> tuple[str, str, str, str]:
  """The names of a second moment's statistics: mean, median, 1st and 99th
  percentile (`moment` is `v`, or `vhat` for AMSGrad's running maximum)."""
  return tuple(f"{OPT_PREFIX}{moment}_{stat}" for stat in ("mean", "median", "p01", "p99"))


V_MEAN, V_MEDIAN, V_P01, V_P99 = moment_stats("v")


def layer_stat(layer: str, stat: str) -> str:
  """The name of a per-layer statistic (`v_mean`, `beta1_mean`, `frac_at_0`, ...)."""
  return f"{OPT_PREFIX}layer/{layer}/{stat}"


def evaluated(row) -> bool:
  """True for a history row (a mapping of metric names) of an evaluated round."""
  return any(key.startswith(TEST_PREFIX) for key in row)
