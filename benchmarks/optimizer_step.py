"""One server-optimizer step on a ResNet-18-sized model, against its floor.

    python -m benchmarks.optimizer_step [--repeats 40]

Every server optimizer of the registry (a learning process, whose clients change
too, has no server step to time), built with its defaults, steps
`tf.function(opt.next)` on 21 float32 tensors of 11.2 M parameters in all. A
step is memory-bound: it reads the weights w, the update g and its k
parameter-sized state arrays (FedAdamom: k = 2, m and v) and writes w and the k
arrays. Its floor (`traffic`) moves exactly that much, with one add per array
and no other math: the least any implementation of that rule could cost on this
machine. Steps and floors are interleaved, two untimed calls each first
(tracing, then warm-up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import common  # noqa: E402
from tff_fedadamom import methods  # noqa: E402
from tff_fedadamom.experiment.outputs import markdown_table  # noqa: E402

# ResNet-18 (CIFAR stem, 10 classes) trainable tensor shapes, merged per block into 21 tensors
# of about the same total size (11.2 M parameters): the stem, four stages, the classifier.
RESNET18_SHAPES = [(3, 3, 3, 64)] + [(3, 3, 64, 64)] * 4 + [
    shape for c in (128, 256, 512)
    for shape in [(3, 3, c // 2, c), (3, 3, c, c), (1, 1, c // 2, c), (3, 3, c, c), (3, 3, c, c)]
] + [(512, 10)]
FLOOR_GOAL = 2.0  # FedAdamom / floor <= this
ADAM_GOAL = 1.0  # FedAdamom / FedAdam (the same state size) <= this


def materialized(fn, *args):
  """A call of `fn(*args)` that waits for its every output."""
  return lambda: tf.nest.map_structure(lambda t: t.numpy() if tf.is_tensor(t) else t, fn(*args))


def optimizer_step(opt, weights, grads):
  """(A call of `tf.function(opt.next)`, k: how many parameter-sized arrays its state holds)."""
  specs = [tf.TensorSpec(w.shape, w.dtype) for w in weights]
  state = tf.nest.map_structure(tf.convert_to_tensor, opt.initialize(specs))
  size = sum(int(np.prod(t.shape)) for t in tf.nest.flatten(state))
  k = int(round(size / sum(int(np.prod(w.shape)) for w in weights)))
  return materialized(tf.function(opt.next), state, weights, grads), k


def traffic(k: int, weights, grads):
  """A call of the floor of a step with k state arrays."""
  slots = [[tf.zeros_like(w) for w in weights] for _ in range(k)]

  @tf.function
  def step(w, g, slots):
    # Reads w, g and each slot; writes w and each slot: one add per array.
    return [a + b for a, b in zip(w, g)], [[s + b for s, b in zip(slot, g)] for slot in slots]

  return materialized(step, weights, grads, slots)


def section(times: dict, ks: dict, repeats: int) -> str:
  """The Markdown body: a row per optimizer, and the FedAdamom ratios."""
  ms = lambda values: common.fmt(statistics.median(values) * 1e3, ".1f")
  rows = [[name, k, ms(times[name]), ms(times[f"floor k={k}"]),
           common.fmt(common.paired_ratio(times[name], times[f"floor k={k}"]))]
          for name, k in ks.items()]
  over_floor = common.paired_ratio(times["fedadamom"], times[f"floor k={ks['fedadamom']}"])
  over_adam = common.paired_ratio(times["fedadamom"], times["fedadam"])
  n_params = sum(int(np.prod(s)) for s in RESNET18_SHAPES)
  return (f"`tf.function(opt.next)` on {len(RESNET18_SHAPES)} float32 tensors, "
          f"{n_params / 1e6:.1f} M parameters, median of {repeats} interleaved steps; k: the "
          "state's parameter-sized arrays; the floor reads w, g and k arrays and writes w and "
          "k arrays with one add each.\n\n"
          + markdown_table(["optimizer", "k", "step ms", "floor ms", "step / floor"], rows)
          + f"\nFedAdamom / floor: {common.fmt(over_floor)} (goal <= {FLOOR_GOAL:g}: "
          f"{common.goal(over_floor, FLOOR_GOAL, at_least=False)}); FedAdamom / FedAdam: "
          f"{common.fmt(over_adam)} (goal <= {ADAM_GOAL:g}: "
          f"{common.goal(over_adam, ADAM_GOAL, at_least=False)}).")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=40)
  parser.add_argument("--results", default=common.RESULTS, help="the results file to update")
  args = parser.parse_args(argv)
  if args.repeats < 1:
    parser.error(f"--repeats must be >= 1, found {args.repeats}")
  from tff_fedadamom.session import Session

  Session().apply()  # the threads a run's server step has (this is the process's entry point)
  rng = np.random.default_rng(0)
  weights = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in RESNET18_SHAPES]
  grads = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in RESNET18_SHAPES]
  steps, ks = {}, {}
  for name in methods.list_optimizers():
    if not methods.is_learning_process(name):
      steps[name], ks[name] = optimizer_step(methods.build_server_optimizer(name),
                                             weights, grads)
  for k in sorted(set(ks.values())):
    steps[f"floor k={k}"] = traffic(k, weights, grads)
  times = common.interleaved(steps, args.repeats, warmups=2)
  for name, values in times.items():
    print(f"{name:>12}: {statistics.median(values) * 1e3:8.1f} ms", flush=True)
  print(common.write_section("optimizer_step", "Server optimizer step against its floor",
                             section(times, ks, args.repeats), args.results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
