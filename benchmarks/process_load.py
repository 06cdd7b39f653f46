"""What a run pays before its first round, phase by phase, on a cache miss and a hit.

For each case, in one process, after a throwaway build of the same model that
takes TensorFlow's and TFF's one-time start-up out of the figures:

  miss: build (TFF's builders trace the learning process), MapReduceForm (TFF's
        compiler splits it into computations), store (into a fresh process cache);
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

    .venv/bin/python benchmarks/process_load.py [--only digits|fmnist|shakespeare]
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
from tff_fedadamom.pipeline import process as process_lib  # noqa: E402
from tff_fedadamom.pipeline import backends  # noqa: E402
from tff_fedadamom.pipeline import tf_computation  # noqa: E402
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
                              tf_computation.type_leaves(work.type_signature.parameter),
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=sorted(CASES))
  args = parser.parse_args(argv)
  names = [args.only] if args.only else list(CASES)
  Session().apply()  # this command is its process's entry point
  with tempfile.TemporaryDirectory() as cache_dir:
    measure(CASES[names[0]][1](), cache_dir)  # TensorFlow's and TFF's start-up
    for name in names:
      title, make = CASES[name]
      times = measure(make(), cache_dir)
      print(f"\n{title}")
      for label, seconds in times.items():
        print(f"  {label:21s} {seconds:7.2f} s")
      miss = times["build"] + times["MapReduceForm"] + times["store"]
      hit = times["load"] + times["wrap"]
      print(f"  before round 1: cache miss {miss + hit + times['initial state']:.2f} s, "
            f"cache hit {hit + times['initial state']:.2f} s")
      print(f"  one work prune (avoided) / the whole wrap now: "
            f"{times['work prune (avoided)'] / times['wrap']:.1f}x")
  return 0


if __name__ == "__main__":
  sys.exit(main())
