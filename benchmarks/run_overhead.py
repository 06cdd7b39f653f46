"""A whole run against its rounds: what evaluation, checkpoints, telemetry and
the run's outputs add on top of the rounds themselves.

For one config (default `configs/quickstart.yaml`, as shipped: evaluation,
checkpoints and telemetry at its own cadence), on parts built and warmed up
beforehand (`parts.build_parts`, `parts.warm_up`; their build is not timed):

* `rounds`: the run's rounds alone, `next_for_clients` on the clients the run
  samples, from the run's initial state, nothing else;
* `run`: `run_experiment` on the same parts, from launch to its summary, into a
  fresh output directory.

They alternate (rounds, run, rounds, run, ...) so that load on a shared machine
falls on both alike, and the medians are compared. The issue's goal: a whole
quickstart run within 1.15x of its rounds.

Where the difference goes: each round hook's seconds over the whole run
(`pipeline.hooks`, timed around its `end_round` in this process), the run's
own rounds (its `next_for_clients` calls, timed inside it), and what is left
of each run without them (start, the final outputs and plots). Evaluation is compute, not
overhead: on the quickstart it is a forward pass over the 10,000 test images,
every 5 rounds.

The bound: the process's CPU seconds are timed too (`time.process_time`, all
its threads), for the rounds alone and for each hook, and so is the
evaluation's floor: the model's forward pass over the test set's batches, all
in one `tf.function`, nothing else (no metrics, no weights assigned). Work that
no schedule can remove, the rounds' CPU seconds plus that floor at every
evaluation, spread over every core the machine has, with the rounds no faster
than alone, gives the shortest whole run any overlap of evaluation and rounds
could reach: `max(rounds, (rounds CPU + evaluations x floor CPU) / cores) / rounds`.

    .venv/bin/python benchmarks/run_overhead.py [--config configs/quickstart.yaml]
        [--repeats 2] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tff_fedadamom.session import Session, startup_imports  # noqa: E402

# This script is its process's entry point, set up as the command's process is.
with startup_imports():
  Session().apply()
  from tff_fedadamom.config import load_config
  from tff_fedadamom.data.sampling import UniformSampler
  from tff_fedadamom.pipeline import hooks as hooks_lib
  from tff_fedadamom.pipeline import parts as parts_lib
  from tff_fedadamom.pipeline import run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 1.15


def rounds_only(plan, parts) -> tuple[float, float]:
  """Wall and CPU seconds of the run's rounds alone, on the clients the run samples."""
  config = plan.config
  sampler = UniformSampler(parts.data.train.client_ids, config.clients_per_round, config.seed)
  state = parts_lib.initial_state(plan, parts.process)
  started, cpu = time.perf_counter(), time.process_time()
  for round_num in range(1, config.rounds + 1):
    state = parts.process.next_for_clients(state, sampler(round_num), round_num).state
  parts.process.get_model_weights(state)  # the last round's result, as numbers
  return time.perf_counter() - started, time.process_time() - cpu


def time_hooks(seconds: dict, cpu_seconds: dict) -> None:
  """Adds each hook class's `end_round` wall and CPU seconds to `seconds[class
  name]` and `cpu_seconds[class name]` (this process's hook classes, for the
  benchmark's runs)."""
  for cls in vars(hooks_lib).values():
    if isinstance(cls, type) and issubclass(cls, hooks_lib.RoundHook) and "end_round" in vars(cls):
      def timed(self, end, _end_round=cls.end_round, _name=cls.__name__):
        started, cpu = time.perf_counter(), time.process_time()
        try:
          return _end_round(self, end)
        finally:
          seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - started
          cpu_seconds[_name] = cpu_seconds.get(_name, 0.0) + time.process_time() - cpu
      cls.end_round = timed


def evaluation_floor_cpu(config, parts, repeats: int = 3) -> float:
  """CPU seconds of one evaluation's arithmetic alone (least of `repeats`): the
  model's forward pass over the test set's batches in one `tf.function`."""
  import tensorflow as tf

  from tff_fedadamom.data import test_dataset

  model = parts.evaluator.keras_model
  xs = [batch["x"] for batch in test_dataset(parts.data.test, config.data.eval_batch_size)]
  forward = tf.function(lambda: [tf.reduce_sum(model(x, training=False)) for x in xs])
  forward()  # traced and instantiated
  cpu = []
  for _ in range(repeats):
    started = time.process_time()
    forward()
    cpu.append(time.process_time() - started)
  return min(cpu)


def whole_run(plan, parts, hook_seconds: dict) -> tuple[float, float, float]:
  """Seconds of `run_experiment` on `parts`, from the call to its summary, and
  of them the seconds in its rounds (`next_for_clients`) and in its hooks
  (`hook_seconds`, filled by `time_hooks`): the run's own parts, so that what
  is left is the run's alone, whatever the machine's speed did between this
  run and the rounds timed alone."""
  process = parts.process
  calls, in_rounds = process.next_for_clients, [0.0]

  def timed(*args, **kwargs):
    started = time.perf_counter()
    try:
      return calls(*args, **kwargs)
    finally:
      in_rounds[0] += time.perf_counter() - started

  hooks_before = sum(hook_seconds.values())
  process.next_for_clients = timed  # on this object only; removed below
  try:
    started = time.perf_counter()
    run_experiment(plan, parts=parts, progress=False)
    wall = time.perf_counter() - started
  finally:
    del process.next_for_clients
  return wall, in_rounds[0], sum(hook_seconds.values()) - hooks_before


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=os.path.join(ROOT, "configs", "quickstart.yaml"))
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=None, help="default: the config's")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    round_override = [] if args.rounds is None else [f"rounds={args.rounds}"]
    base = load_config(args.config,
                       overrides=[*round_override, f"output_dir={os.path.join(tmp, 'warm-up')}"])
    fuse = base.runtime.fuse_after_rounds
    if fuse is not None and base.rounds <= fuse:
      # The command's run makes all its rounds call by call. The parts here
      # serve every timed run, so their round count would cross the threshold
      # and build the one-call round (about 1 s) inside one of them.
      round_override.append("runtime.fuse_after_rounds=null")
      base = load_config(args.config, overrides=[
          *round_override, f"output_dir={os.path.join(tmp, 'warm-up')}"])
    parts = parts_lib.build_parts(parts_lib.make_plan(base))
    try:
      parts_lib.warm_up(base, parts)
      times = {"rounds": [], "run": [], "rounds_cpu": [], "run_rounds": [], "rest": []}
      hook_seconds, hook_cpu = {}, {}
      time_hooks(hook_seconds, hook_cpu)
      for i in range(args.repeats):
        plan = parts_lib.make_plan(load_config(
            args.config, overrides=[*round_override, f"output_dir={os.path.join(tmp, f'run{i}')}"]))
        wall, cpu = rounds_only(plan, parts)
        times["rounds"].append(wall)
        times["rounds_cpu"].append(cpu)
        wall, in_rounds, in_hooks = whole_run(plan, parts, hook_seconds)
        times["run"].append(wall)
        times["run_rounds"].append(in_rounds)
        times["rest"].append(wall - in_rounds - in_hooks)
      floor_cpu = evaluation_floor_cpu(base, parts)
    finally:
      parts.process.close()
  rounds, run = (statistics.median(times[k]) for k in ("rounds", "run"))
  print(f"{os.path.relpath(args.config, ROOT)}: {base.rounds} rounds, eval every "
        f"{base.eval_every}, checkpoint every {base.checkpoint_every}, telemetry "
        f"{'on' if base.telemetry else 'off'}; {args.repeats} repeats, alternating")
  print(f"  rounds alone: {rounds:7.2f} s   ({', '.join(f'{t:.2f}' for t in times['rounds'])})")
  print(f"  whole run:    {run:7.2f} s   ({', '.join(f'{t:.2f}' for t in times['run'])})")
  ratio = run / rounds
  print(f"  run / rounds: {ratio:.3f} (goal <= {GOAL}) {'OK' if ratio <= GOAL else 'ABOVE GOAL'}")
  # Per run: the hooks' seconds over all repeats, divided by the repeats.
  per_run = {name: t / args.repeats for name, t in sorted(hook_seconds.items(),
                                                          key=lambda item: -item[1])}
  print("  each run's hooks (mean s): " + ", ".join(f"{n} {t:.2f}" for n, t in per_run.items()))
  evaluation = per_run.get(hooks_lib.Evaluate.__name__, 0.0)
  print(f"  the run's own rounds: {statistics.median(times['run_rounds']):7.2f} s   "
        f"({', '.join(f'{t:.2f}' for t in times['run_rounds'])})")
  # Each run less its own rounds and hooks: never the difference of two timings
  # taken apart, which the machine's speed can move either way.
  print(f"  start, outputs and plots (median s): {statistics.median(times['rest']):.2f}   "
        f"({', '.join(f'{t:.2f}' for t in times['rest'])})")
  rounds_mean = statistics.mean(times["rounds"])
  print(f"  run without its evaluation / rounds (means): "
        f"{(statistics.mean(times['run']) - evaluation) / rounds_mean:.3f}")
  evaluations = len(hooks_lib.evaluation_rounds(base.rounds, base.eval_every))
  print_bound(rounds_mean, statistics.mean(times["rounds_cpu"]),
              hook_cpu.get(hooks_lib.Evaluate.__name__, 0.0) / args.repeats,
              evaluations, floor_cpu)
  return 0


def print_bound(rounds: float, rounds_cpu: float, evaluation_cpu: float, evaluations: int,
                floor_cpu: float) -> None:
  """The shortest whole run any overlap of evaluation and rounds allows (the
  module's docstring), against the goal."""
  cores = os.cpu_count() or 1
  bound = max(rounds, (rounds_cpu + evaluations * floor_cpu) / cores) / rounds
  print(f"  rounds' CPU: {rounds_cpu:.2f} s ({rounds_cpu / rounds:.2f} of {cores} cores busy); "
        f"{evaluations} evaluations' CPU: {evaluation_cpu:.2f} s, their floor "
        f"{evaluations * floor_cpu:.2f} s ({floor_cpu:.2f} s each)")
  print(f"  shortest whole run / rounds any overlap allows: {bound:.3f} "
        f"(goal <= {GOAL}) {'reachable' if bound <= GOAL else 'OUT OF REACH on this machine'}")


if __name__ == "__main__":
  raise SystemExit(main())
