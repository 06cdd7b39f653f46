"""Times one server-optimizer step on a ResNet-18-sized structure.

Prints, from one process and one run: the median time of `tf.function(opt.next)`
for FedAdamom and TFF's Adam, Yogi and SGD with momentum; the FedAdamom / Adam
ratio (goal <= 1.0); and a memory-bandwidth floor for FedAdamom measured in the
same run (goal: FedAdamom within 2x of it).

The floor: FedAdamom must read w, g, m, v and write w, m, v (7 parameter-sized
arrays). A `tf.function` that does exactly that much traffic with the cheapest
possible math (one fused add per array) is timed on the same structure.

    .venv/bin/python benchmarks/optimizer_step.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import interleaved  # noqa: E402
from tff_fedadamom.optimizers import build_fedadamom  # noqa: E402

# ResNet-18 (CIFAR stem, 10 classes) trainable tensor shapes, merged per block
# into 21 tensors of about the same total size (11.2 M parameters).
RESNET18_SHAPES = [
    (3, 3, 3, 64),
    (3, 3, 64, 64), (3, 3, 64, 64), (3, 3, 64, 64), (3, 3, 64, 64),
    (3, 3, 64, 128), (3, 3, 128, 128), (1, 1, 64, 128),
    (3, 3, 128, 128), (3, 3, 128, 128),
    (3, 3, 128, 256), (3, 3, 256, 256), (1, 1, 128, 256),
    (3, 3, 256, 256), (3, 3, 256, 256),
    (3, 3, 256, 512), (3, 3, 512, 512), (1, 1, 256, 512),
    (3, 3, 512, 512), (3, 3, 512, 512),
    (512, 10),
]


def _materialized(fn, args) -> None:
  out = fn(*args)
  tf.nest.map_structure(lambda t: t.numpy() if tf.is_tensor(t) else t, out)


def _optimizer_step(opt, weights, grads):
  specs = [tf.TensorSpec(w.shape, w.dtype) for w in weights]
  state = tf.nest.map_structure(tf.convert_to_tensor, opt.initialize(specs))
  return tf.function(opt.next), (state, weights, grads)


def _floor_step(weights, grads):
  m = [tf.zeros_like(w) for w in weights]
  v = [tf.zeros_like(w) for w in weights]

  @tf.function
  def traffic(w, g, m, v):
    # Reads w, g, m, v; writes three arrays: no real math.
    return ([a + b for a, b in zip(w, g)], [a + b for a, b in zip(m, g)],
            [a + b for a, b in zip(v, w)])

  return traffic, (weights, grads, m, v)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=40)
  args = parser.parse_args(argv)

  rng = np.random.default_rng(0)
  weights = [tf.constant(rng.normal(size=s).astype(np.float32))
             for s in RESNET18_SHAPES]
  grads = [tf.constant(rng.normal(size=s).astype(np.float32))
           for s in RESNET18_SHAPES]
  n_params = sum(int(np.prod(s)) for s in RESNET18_SHAPES)
  print(f'structure: {len(weights)} tensors, {n_params / 1e6:.2f} M float32 '
        f'parameters; {args.repeats} timed steps each; threads: '
        f'{tf.config.threading.get_inter_op_parallelism_threads()} inter / '
        f'{tf.config.threading.get_intra_op_parallelism_threads()} intra (0 = auto)')

  optimizers = {
      'fedadamom': build_fedadamom(1.0, beta_2=0.1),
      'adam': tff.learning.optimizers.build_adam(0.01),
      'yogi': tff.learning.optimizers.build_yogi(0.01),
      'sgdm': tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
  }
  steps = {name: _optimizer_step(opt, weights, grads) for name, opt in optimizers.items()}
  steps['floor'] = _floor_step(weights, grads)
  # Two untimed steps each: tracing, then warm-up.
  times = interleaved({name: functools.partial(_materialized, fn, args)
                       for name, (fn, args) in steps.items()}, args.repeats, warmups=2)
  for name, values in times.items():
    note = '  (reads w, g, m, v; writes 3 arrays)' if name == 'floor' else ''
    print(f'{name:>10}: {statistics.median(values) * 1e3:8.1f} ms{note}')
  paired = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))
  ratio = paired('fedadamom', 'adam')
  over_floor = paired('fedadamom', 'floor')
  print(f'ratio fedadamom/adam (median of paired steps): {ratio:.2f}  (goal <= 1.00: '
        f'{"met" if ratio <= 1.0 else "NOT met"})')
  print(f'ratio fedadamom/floor (median of paired steps): {over_floor:.2f}  (goal <= 2.00: '
        f'{"met" if over_floor <= 2.0 else "NOT met"})')


if __name__ == '__main__':
  main()
