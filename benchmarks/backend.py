"""Rounds per second of the two backends: in-process TensorFlow vs TFF's C++ runtime.

One learning process, built once, runs round by round on both backends:
`inprocess` (TFF's MapReduceForm computations run by TensorFlow in this process,
`InProcessLearningProcess`) and `tff_cpp` (the same process on TFF's C++
runtime, its `worker_binary`, through `tff_cpp.TffCppProcess`). In every round both get the same state
(the reference `tff_cpp`'s result of the round before), the same sampled clients
and freshly built datasets of them, and the two backends' rounds alternate (which
one goes first flips every round) so that load on a shared machine falls on both
alike. Warm-up rounds are not timed. Prints, per case, the median seconds per
round, rounds per second and their ratio, and, as a check that both computed the
same round, the largest relative difference per weight tensor between their
results (max |a - b| / max |b| over each tensor, worst round: float32 round-off,
compounded over one round of training, is expected; a wrong dropout mask or
client order is not).

Cases and goals:
  (a) configs/quickstart.yaml: Fashion-MNIST, CNN, 10 clients x 200 examples,
      batch 32 (goal: inprocess >= 1.5x tff_cpp rounds/s);
  (b) configs/cifar10.yaml's ResNet-18 (GroupNorm) client set-up, 5 clients x 100
      CIFAR-format 32x32x3 images (generated fixture files), batch 50, 1 local
      epoch (goal: inprocess no slower, >= 1.0x).

`--paper-scale` times the in-process backend alone on a paper-sized round
(ResNet-18, 5 clients x 500 images x 5 local epochs, batch 50) on the devices
TensorFlow sees (every GPU, else the CPU), and prints the device.

    .venv/bin/python benchmarks/backend.py [--rounds N] [--warmup 1] [--only a|b]
    .venv/bin/python benchmarks/backend.py --paper-scale [--rounds 1] [--warmup 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.data.fixtures import write_cifar10  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.data.sampling import sample_clients  # noqa: E402
from tff_fedadamom.pipeline import process as process_lib  # noqa: E402
from tff_fedadamom.config.schema import INPROCESS, TFF_CPP  # noqa: E402
from tff_fedadamom.pipeline.backends import tff_cpp  # noqa: E402
from tff_fedadamom.pipeline.backends.inprocess import InProcessLearningProcess  # noqa: E402
from tff_fedadamom.pipeline.parts import make_plan  # noqa: E402
from tff_fedadamom.pipeline.plan import training_loop  # noqa: E402

GOALS = {"a": 1.5, "b": 1.0}
DEFAULT_ROUNDS = {"a": 8, "b": 4, "paper": 1}


def _quickstart(tiny: bool):
  overrides = ["clients_per_round=2", "client.max_examples=20"] if tiny else []
  config = load_config(os.path.join(ROOT, "configs", "quickstart.yaml"), overrides)
  client = config.client
  label = (f"(a) quickstart CNN: Fashion-MNIST, {config.clients_per_round} clients/round x "
           f"{client.max_examples} examples, batch {client.batch_size}, "
           f"{client.local_epochs} local epoch")
  return config, label


def _resnet(data_root: str, clients: int, images: int, local_epochs: int):
  """configs/cifar10.yaml (the paper's client set-up) on `clients` x `images`
  generated CIFAR-10 images, IID, every client sampled every round."""
  write_cifar10(data_root, per_batch=-(-clients * images // 5), test=10, seed=0)
  config = load_config(os.path.join(ROOT, "configs", "cifar10.yaml"), [
      f"data.path={data_root}", f"data.num_clients={clients}", "data.partition={kind: iid}",
      f"clients_per_round={clients}", f"client.local_epochs={local_epochs}",
      f"client.max_examples={images}"])
  client = config.client
  label = (f"ResNet-18 (GroupNorm), CIFAR-format 32x32x3: {clients} clients/round x "
           f"{images} images, batch {client.batch_size}, {local_epochs} local epoch"
           f"{'s' if local_epochs > 1 else ''}")
  return config, label


def _max_relative_error(a, b) -> float:
  """max over tensors of max|a - b| / max|b| (absolute where b is all zeros)."""
  worst = 0.0
  for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = float(np.max(np.abs(y))) if y.size else 0.0
    diff = float(np.max(np.abs(x - y))) if y.size else 0.0
    worst = max(worst, diff / scale if scale > 0 else diff)
  return worst


def _rounds(config, data, runners: dict, rounds: int, warmup: int, weights=None):
  """Runs `warmup + rounds` rounds on every runner, interleaved, each round from
  the same state; the next round starts from the last runner's result.

  Returns the timed seconds and the warm-up seconds per runner, and, given
  `weights` (state -> model weights), the largest relative error per weight
  tensor between the runners' results of each round.
  """
  ids = list(data.train.client_ids)
  names = list(runners)
  state = runners[names[0]].initialize()
  timed = {name: [] for name in names}
  first = {name: [] for name in names}
  errors = []
  for r in range(warmup + rounds):
    clients = sample_clients(ids, config.clients_per_round, config.seed, r)
    results = {}
    for name in (names if r % 2 == 0 else names[::-1]):
      datasets = process_lib.client_datasets(config, data, clients, r)
      start = time.perf_counter()
      results[name] = runners[name].next(state, datasets).state
      (timed if r >= warmup else first)[name].append(time.perf_counter() - start)
    if weights is not None and len(names) > 1:
      errors.append(_max_relative_error(weights(results[names[0]]), weights(results[names[-1]])))
    state = results[names[-1]]
  return timed, first, errors


def _compare(key: str, config, label: str, rounds: int, warmup: int) -> None:
  data = process_lib.load_data(config)
  devices = list(make_plan(config).devices)
  # The same process on both backends (tff_cpp ignores devices: its worker_binary is CPU-only).
  process = process_lib.build_process(config, data, training_loop(devices))
  start = time.perf_counter()
  inprocess = InProcessLearningProcess(process, devices=devices,
                                       max_concurrent_clients=config.runtime.max_concurrent_clients)
  compile_s = time.perf_counter() - start
  reference = tff_cpp.TffCppProcess(process)
  runners = {INPROCESS: inprocess, TFF_CPP: reference}  # the reference last
  print(f"{label}; {rounds} timed round(s) after {warmup} warm-up, interleaved")
  print(f"  in-process compile to MapReduceForm and import: {compile_s:.2f} s; "
        f"inprocess devices: {', '.join(d.split('device:')[-1] for d in inprocess.devices)}")
  timed, first, errors = _rounds(config, data, runners, rounds, warmup,
                                 weights=inprocess.get_model_weights)
  print(f"  {'backend':<10} {'s/round':>9} {'rounds/s':>9} {'warm-up s':>10}")
  medians = {}
  for name in runners:
    medians[name] = statistics.median(timed[name])
    warm = f"{sum(first[name]):10.2f}" if first[name] else f"{'-':>10}"
    print(f"  {name:<10} {medians[name]:9.3f} {1 / medians[name]:9.3f} {warm}")
  ratio = medians[TFF_CPP] / medians[INPROCESS]
  goal = GOALS[key]
  print(f"  ratio inprocess/tff_cpp rounds/s: {ratio:.2f}  "
        f"(goal >= {goal:.1f}: {'met' if ratio >= goal else 'NOT met'})")
  print(f"  max relative error per weight tensor, inprocess vs tff_cpp, one round from the "
        f"same state: {max(errors):.1e} (worst of {len(errors)} rounds)")
  inprocess.close()
  reference.close()


def _paper_scale(data_root: str, rounds: int, warmup: int, tiny: bool = False) -> None:
  config, label = _resnet(data_root, *((2, 10, 1) if tiny else (5, 500, 5)))
  data = process_lib.load_data(config)
  devices = list(make_plan(config).devices)
  process = InProcessLearningProcess(
      process_lib.build_process(config, data, training_loop(devices)), devices=devices)
  names = [d.split("device:")[-1] for d in process.devices]
  gpus = tf.config.list_physical_devices("GPU")
  details = [tf.config.experimental.get_device_details(g).get("device_name", "?") for g in gpus]
  print(f"(paper scale, inprocess only) {label}; {rounds} timed round(s) after {warmup} warm-up")
  print(f"  devices: {', '.join(names)}" + (f" ({', '.join(details)})" if details else
                                             " (TensorFlow sees no GPU)"))
  timed, first, _ = _rounds(config, data, {INPROCESS: process}, rounds, warmup)
  seconds = statistics.median(timed[INPROCESS])
  warm = f"; warm-up {sum(first[INPROCESS]):.1f} s" if first[INPROCESS] else \
      " (no warm-up: includes the first round's tracing)"
  print(f"  inprocess: {seconds:.1f} s/round on {', '.join(names)}{warm}")
  process.close()


def main(argv=None):
  from tff_fedadamom.session import Session

  Session().apply()  # this command is its process's entry point
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=None,
                      help="timed rounds per case (default: a 8, b 4, paper scale 1)")
  parser.add_argument("--warmup", type=int, default=None,
                      help="untimed rounds first (default 1; paper scale 0)")
  parser.add_argument("--only", choices=("a", "b"), default=None, help="run one case")
  parser.add_argument("--paper-scale", action="store_true",
                      help="time a paper-sized ResNet-18 round in-process, on TensorFlow's devices")
  parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the test's size
  args = parser.parse_args(argv)
  for name in ("rounds", "warmup"):
    value = getattr(args, name)
    if value is not None and value < (1 if name == "rounds" else 0):
      parser.error(f"--{name} must be >= {1 if name == 'rounds' else 0}, found {value}")

  def rounds(key):
    return args.rounds or DEFAULT_ROUNDS[key]

  warmup = args.warmup if args.warmup is not None else (0 if args.paper_scale else 1)
  print(f"{os.cpu_count()} CPU cores; TensorFlow {tf.__version__}; "
        f"GPUs visible: {len(tf.config.list_physical_devices('GPU'))}")
  with tempfile.TemporaryDirectory() as tmp:
    if args.paper_scale:
      _paper_scale(tmp, rounds("paper"), warmup, args.tiny)
      return
    if args.only in (None, "a"):
      _compare("a", *_quickstart(args.tiny), rounds("a"), warmup)
    if args.only in (None, "b"):
      clients, images = (2, 10) if args.tiny else (5, 100)
      config, label = _resnet(os.path.join(tmp, "cifar"), clients, images, local_epochs=1)
      _compare("b", config, "(b) " + label, rounds("b"), warmup)


if __name__ == "__main__":
  main()
