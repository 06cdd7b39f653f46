"""What a run pays before its first round, phase by phase, on a cache miss and a hit.

For each case, in one process, after a throwaway build of the same model that
takes TensorFlow's and TFF's one-time start-up out of the figures:

  miss: build (TFF's builders trace the learning process), build, 2nd optimizer
        (another server optimizer's process: its client work is shared,
        `process._weighted_fed_avg`), MapReduceForm (TFF's compiler splits it
        into computations), store (into a fresh process cache);
  hit:  load (the computations from that cache), wrap (import them into this
        process's TensorFlow, `backends.build_backend`);
  then: initial state, the first round (its functions are instantiated and
        optimized by TensorFlow on first call), a second round, for scale.

`work prune (avoided)` is a step wrapping no longer takes: a prune of an
import to its outputs, which copies the graph op by op in Python
(`wrap_function.prune` -> `lift_to_graph`). Wrapping pruned every import that
way: one per computation, and one per client slot for `work` (the largest graph). It is
timed here on one `work` import and printed beside the whole wrap as it is now.

Cases: the quickstart sweep's digits/logistic, the paper study's Fashion-MNIST
MLP-64, and its quick run's Shakespeare char-LSTM.

`--warm-run` instead times a whole `tff-fedadamom run configs/quickstart.yaml`
from its launch to the end of its first round (its metrics.csv row written, as
`sweep_scaling.py` counts it) with a warm process cache (a private one, filled
by a first run here): a timeline of the run's steps, each with its seconds
since launch and its own duration, nested as they call one another. Time
between the steps shown is the imports and the Python around them.

`--warm-trial` times a sweep trial in a warm `tuning.workers.TrialWorker`
(TensorFlow imported, the trial's structure built and warmed up with the
sweep base's hparams, as `tuning.pools.worker_pool` warms its workers; the
trial has the sweep's first sampled hparams): from the worker taking the trial to its
first round's start and end. In this process, without Ray: what Ray adds
(the trainable's start, its claim and event calls) is not in it.

`--side-by-side` answers whether one trial worker could serve a sweep's two
concurrent trials (one TensorFlow import and one build per structure for both,
instead of one per worker): two warm quickstart-sweep trials of different
optimizers, each through parts of its own (`PartsCache`: concurrent runs must
not share a Keras model), run one after the other and then side by side in two
threads of this process (TensorFlow sized for two trials). It prints both wall
times and their ratio: 0.5 would be two cores fully used, 1.0 the trials
taking turns (Python's lock held between TensorFlow's calls).

    .venv/bin/python benchmarks/process_load.py [--only digits|fmnist|shakespeare]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/process_load.py --warm-run [--repeat 3]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/process_load.py --warm-trial
    PYTHONPATH=$PWD .venv/bin/python benchmarks/process_load.py --side-by-side [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.paper import plan as paper_plan  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.data.sampling import UniformSampler  # noqa: E402
from tff_fedadamom.pipeline import parts as parts_lib  # noqa: E402
from tff_fedadamom.pipeline import parts_cache  # noqa: E402
from tff_fedadamom.pipeline import process as process_lib  # noqa: E402
from tff_fedadamom.pipeline import backends  # noqa: E402
from tff_fedadamom.pipeline import py_containers, tf_computation  # noqa: E402
from tff_fedadamom.pipeline.compiled import compile_process  # noqa: E402
from tff_fedadamom.pipeline.plan import training_loop  # noqa: E402
from tff_fedadamom.pipeline.process_cache import ProcessCache  # noqa: E402
from tff_fedadamom.session import Session  # noqa: E402


def _digits():
  return {"seed": 0, "rounds": 2, "clients_per_round": 5,
          "data": {"name": "digits", "num_clients": 20, "partition": {"kind": "iid"}},
          "model": {"name": "logistic"},
          "client": {"learning_rate": 0.1, "batch_size": 16},
          "server": {"optimizer": "fedadamom", "learning_rate": 1.0}}


def _paper(base, model):
  raw = copy.deepcopy(base)
  raw["model"] = model
  raw["server"] = {**raw["server"], "optimizer": "fedadamom"}
  return raw


CASES = {
    "digits": ("digits / logistic", _digits),
    "fmnist": ("Fashion-MNIST / MLP-64",
               lambda: _paper(paper_plan.fmnist_base(paper_plan.QUICK, {"kind": "iid"}),
                              {"name": "mlp", "options": {"hidden": [64]}})),
    "shakespeare": ("Shakespeare / char-LSTM (quick)",
                    lambda: _paper(paper_plan.shakespeare_base(paper_plan.QUICK),
                                   paper_plan.QUICK.shakespeare_model)),
}


class _Clock:
  def __init__(self):
    self.times, self._t = {}, time.perf_counter()

  def mark(self, label):
    now = time.perf_counter()
    self.times[label] = now - self._t
    self._t = now


def _prune_seconds(compiled, plan) -> float:
  """Seconds to prune one import of `work` to its outputs (the step wrapping
  no longer takes)."""
  work = compiled.computation("work")
  slot = tf_computation._Slot(work._computation_proto,  # noqa: SLF001
                              py_containers.type_leaves(work.type_signature.parameter),
                              plan.devices[0])
  wrapped = slot._call  # noqa: SLF001
  started = time.perf_counter()
  wrapped.prune(feeds=list(wrapped.inputs), fetches=list(wrapped.outputs))
  return time.perf_counter() - started


def measure(raw, cache_dir: str) -> dict:
  raw = {**raw, "output_dir": tempfile.mkdtemp(prefix="process-load-"),
         "runtime": {**raw.get("runtime", {}), "cache": False}}
  plan = parts_lib.make_plan(load_config(raw))
  config = plan.config
  data = process_lib.load_data(config)
  clock = _Clock()
  process = process_lib.build_process(config, data, training_loop(plan.devices),
                                      server_optimizer=plan.server_optimizer)
  clock.mark("build")
  other = load_config({**raw, "server": {"optimizer": "fedavg", "learning_rate": 1.0}})
  process_lib.build_process(other, data, training_loop(plan.devices))
  clock.mark("build, 2nd optimizer")
  compiled = compile_process(process)
  clock.mark("MapReduceForm")
  cache = ProcessCache(cache_dir)
  cache.store("case", compiled)
  clock.mark("store")
  loaded = cache.load("case")
  clock.mark("load")
  backend = backends.build_backend(plan, loaded, process_lib.make_client_tensors(config, data))
  clock.mark("wrap")
  state = parts_lib.initial_state(plan, backend)
  clock.mark("initial state")
  sampler = UniformSampler(data.train.client_ids, config.clients_per_round, config.seed)
  state = backend.next_for_clients(state, sampler(1), 1).state
  clock.mark("first round")
  backend.next_for_clients(state, sampler(2), 2)
  clock.mark("second round")
  backend.close()
  times = clock.times
  times["work prune (avoided)"] = _prune_seconds(loaded, plan)
  return times


# ------------------------------------------------------------ a warm run and a warm trial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")


def _cli(args, **kwargs):
  """Runs `python args` on this checkout's code."""
  import subprocess

  return subprocess.run([sys.executable, *args], cwd=ROOT, check=True,
                        env={**os.environ, "PYTHONPATH": ROOT}, **kwargs)


def warm_run(repeat: int) -> None:
  """The timeline of a warm `tff-fedadamom run configs/quickstart.yaml` up to the
  end of its first round, `repeat` times, after one run that fills a private
  process cache (see the module doc)."""
  import json
  import subprocess

  from benchmarks.startup_timeline import first_round, format_timeline

  with tempfile.TemporaryDirectory() as root:
    cache = ["--set", f"runtime.cache_dir={os.path.join(root, 'cache')}"]
    print(f"filling a process cache (load average {os.getloadavg()[0]:.2f}) ...", flush=True)
    _cli(["-m", "tff_fedadamom", "run", QUICKSTART, "--quiet", "--set", "rounds=1",
          "--set", f"output_dir={os.path.join(root, 'cold')}", *cache],
         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ends = []
    for i in range(repeat):
      out = os.path.join(root, f"timeline{i}.json")
      load = os.getloadavg()[0]
      _cli([os.path.join(ROOT, "benchmarks", "startup_timeline.py"), repr(time.time()), out,
            "run", QUICKSTART, "--quiet", "--set", f"output_dir={os.path.join(root, f'w{i}')}",
            *cache], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      with open(out) as f:
        spans = json.load(f)
      start, end = first_round(spans)
      ends.append(end)
      print(f"\nwarm run {i + 1} (load average {load:.2f} at launch): first round "
            f"starts {start:.2f} s, ends {end:.2f} s after launch")
      print("  since launch  seconds  step")
      print("\n".join(format_timeline(spans)))
    print(f"\nfirst round ends after: {', '.join(f'{e:.2f}' for e in ends)} s "
          f"(median {sorted(ends)[len(ends) // 2]:.2f} s)")


class _Stop(Exception):
  """Ends a timed trial after its first round."""


def _stop(timeline) -> None:
  del timeline
  raise _Stop()


def _quickstart_sweep():
  from tuning import schema

  return schema.load_sweep(os.path.join(ROOT, "configs", "sweeps", "quickstart.yaml"))


def _trial_config(sweep, optimizer: str, params, root: str, name: str, threads: int) -> dict:
  """The experiment dict of a trial of `sweep`, writing to `root`/`name`, with
  the process cache in `root`/cache (a private one, cold while `root` is new)."""
  from tuning import space as space_lib

  tree = space_lib.experiment_dict(sweep, optimizer, params, threads=threads,
                                   output_dir=os.path.join(root, name))
  tree["runtime"]["cache_dir"] = os.path.join(root, "cache")
  return tree


def warm_trial() -> None:
  """The timeline of a trial of the quickstart sweep in a warm `TrialWorker`, from
  the worker taking it to its first round's end (see the module doc)."""
  import functools

  from benchmarks.startup_timeline import Timeline, format_timeline
  from tff_fedadamom.pipeline import run_experiment
  from tuning import space as space_lib
  from tuning.workers import TrialWorker

  sweep = _quickstart_sweep()
  optimizer = sweep.optimizers[0]
  worker = TrialWorker()
  with tempfile.TemporaryDirectory() as root:
    trials = space_lib.sample_trials(sweep, optimizer)
    started = time.perf_counter()
    worker._warm_up(functools.partial(  # noqa: SLF001
        _trial_config, sweep, optimizer, {}, root, "warm", 1))
    print(f"worker warm-up ({optimizer}, cold process cache): "
          f"{time.perf_counter() - started:.2f} s")
    timeline = Timeline(time.time(), on_round_end=_stop)
    timeline.install(now=True)
    plan = worker._plan(functools.partial(  # noqa: SLF001
        _trial_config, sweep, optimizer, trials[0], root, "trial", 1))
    parts = worker._parts(plan)  # noqa: SLF001
    try:
      run_experiment(plan, parts=parts, progress=False)
    except _Stop:
      pass
    start, end = timeline.first_round()
    print(f"warm trial ({optimizer}, {trials[0]}): first round starts {start:.3f} s, "
          f"ends {end:.3f} s after the worker takes the trial")
    print("  since start  seconds  step")
    print("\n".join(format_timeline(timeline.spans)))


def side_by_side(repeat: int) -> None:
  """Two warm trials one after the other, then side by side (see the module doc)."""
  import threading

  from tff_fedadamom.pipeline import run_experiment
  from tuning import space as space_lib

  sweep = _quickstart_sweep()
  optimizers = [o for o in sweep.optimizers if o in ("fedadam", "fedyogi")]
  with tempfile.TemporaryDirectory() as root:
    caches = {o: parts_cache.PartsCache(1) for o in optimizers}
    runs = [0]

    def trial(optimizer: str, index: int) -> None:
      runs[0] += 1
      tree = _trial_config(sweep, optimizer, space_lib.sample_trials(sweep, optimizer)[index],
                           root, f"{optimizer}-{runs[0]}", 2)
      plan = parts_lib.make_plan(load_config(tree))
      run_experiment(plan, parts=caches[optimizer].get(plan), progress=False,
                     model_and_plot=False)

    for optimizer in optimizers:  # built, compiled and run once: what follows is warm
      trial(optimizer, 0)
    print(f"two warm trials of {sweep.budget.rounds} rounds ({' and '.join(optimizers)}, "
          f"{sweep.base.model.name} on {sweep.base.data.name}), {os.cpu_count()} CPUs:")
    for i in range(repeat):
      started = time.perf_counter()
      for optimizer in optimizers:
        trial(optimizer, 1)
      apart = time.perf_counter() - started
      threads = [threading.Thread(target=trial, args=(o, 1)) for o in optimizers]
      started = time.perf_counter()
      for thread in threads:
        thread.start()
      for thread in threads:
        thread.join()
      together = time.perf_counter() - started
      print(f"  {i + 1}: one after the other {apart:.2f} s, side by side in one process "
            f"{together:.2f} s: ratio {together / apart:.2f} (0.5 = two cores used, "
            f"1.0 = taking turns)", flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=sorted(CASES))
  parser.add_argument("--warm-run", action="store_true",
                      help="time a warm `tff-fedadamom run configs/quickstart.yaml` to round 1")
  parser.add_argument("--repeat", type=int, default=1,
                      help="warm runs (--warm-run) or pairs of trials (--side-by-side) to time")
  parser.add_argument("--warm-trial", action="store_true",
                      help="time a trial in a warm trial worker to round 1")
  parser.add_argument("--side-by-side", action="store_true",
                      help="two warm trials one after the other, then in two threads")
  args = parser.parse_args(argv)
  if args.warm_run:
    warm_run(args.repeat)
    return 0
  if args.side_by_side:
    Session(threads=2).apply()  # two trials' worth, in one process
    side_by_side(args.repeat)
    return 0
  if args.warm_trial:
    Session(threads=1).apply()  # a trial worker's, as `TrialWorker` sets it
    warm_trial()
    return 0
  names = [args.only] if args.only else list(CASES)
  Session().apply()  # this command is its process's entry point
  with tempfile.TemporaryDirectory() as cache_dir:
    # TensorFlow's and TFF's start-up; another client learning rate, so that the
    # timed build traces its client work as a process's first build of it does.
    warm = CASES[names[0]][1]()
    measure({**warm, "client": {**warm["client"], "learning_rate": 0.0123}}, cache_dir)
    for name in names:
      title, make = CASES[name]
      times = measure(make(), cache_dir)
      print(f"\n{title}")
      for label, seconds in times.items():
        print(f"  {label:21s} {seconds:7.2f} s")
      miss = times["build"] + times["MapReduceForm"] + times["store"]
      miss_2nd = times["build, 2nd optimizer"] + times["MapReduceForm"] + times["store"]
      hit = times["load"] + times["wrap"]
      print(f"  before round 1: cache miss {miss + hit + times['initial state']:.2f} s "
            f"(a 2nd optimizer's {miss_2nd + hit + times['initial state']:.2f} s), "
            f"cache hit {hit + times['initial state']:.2f} s")
      print(f"  build, 2nd optimizer (client work shared) / build: "
            f"{times['build, 2nd optimizer'] / times['build']:.2f}x")
      print(f"  one work prune (avoided) / the whole wrap now: "
            f"{times['work prune (avoided)'] / times['wrap']:.1f}x")
  return 0


if __name__ == "__main__":
  sys.exit(main())
