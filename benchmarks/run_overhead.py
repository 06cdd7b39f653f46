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
(`pipeline.hooks`, timed around its `end_round` in this process), and what is
left (start, the final outputs and plots). Evaluation is compute, not
overhead: on the quickstart it is a forward pass over the 10,000 test images,
every 5 rounds.

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


def rounds_only(plan, parts) -> float:
  """Seconds of the run's rounds alone, on the clients the run samples."""
  config = plan.config
  sampler = UniformSampler(parts.data.train.client_ids, config.clients_per_round, config.seed)
  state = parts_lib.initial_state(plan, parts.process)
  started = time.perf_counter()
  for round_num in range(1, config.rounds + 1):
    state = parts.process.next_for_clients(state, sampler(round_num), round_num).state
  parts.process.get_model_weights(state)  # the last round's result, as numbers
  return time.perf_counter() - started


def time_hooks(seconds: dict) -> None:
  """Adds each hook class's `end_round` seconds to `seconds[class name]` (this
  process's hook classes, for the benchmark's runs)."""
  for cls in vars(hooks_lib).values():
    if isinstance(cls, type) and issubclass(cls, hooks_lib.RoundHook) and "end_round" in vars(cls):
      def timed(self, end, _end_round=cls.end_round, _name=cls.__name__):
        started = time.perf_counter()
        try:
          return _end_round(self, end)
        finally:
          seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - started
      cls.end_round = timed


def whole_run(plan, parts) -> float:
  """Seconds of `run_experiment` on `parts`, from the call to its summary."""
  started = time.perf_counter()
  run_experiment(plan, parts=parts, progress=False)
  return time.perf_counter() - started


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
      times = {"rounds": [], "run": []}
      hook_seconds: dict = {}
      time_hooks(hook_seconds)
      for i in range(args.repeats):
        plan = parts_lib.make_plan(load_config(
            args.config, overrides=[*round_override, f"output_dir={os.path.join(tmp, f'run{i}')}"]))
        times["rounds"].append(rounds_only(plan, parts))
        times["run"].append(whole_run(plan, parts))
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
  rest = statistics.mean(times["run"]) - statistics.mean(times["rounds"]) - sum(per_run.values())
  print(f"  start, outputs and plots (mean s): {rest:.2f}")
  print(f"  run without its evaluation / rounds (means): "
        f"{(statistics.mean(times['run']) - evaluation) / statistics.mean(times['rounds']):.3f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
