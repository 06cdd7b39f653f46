"""One-off: re-key the stored units from raw-byte fingerprints (version 1) to the
rounded, machine-independent ones of `fingerprint.py` (version 2).

    .venv/bin/python -m benchmarks.paper.migrate_keys [--results DIR] [--dry-run]

A unit keeps its result and gets today's key only when the numerics it ran are
today's, checked per commit the units were computed from (`source_commit`),
on this machine, with that commit's code exported by `git archive`:

1. the methods: the commit's own fingerprint code reproduces the fingerprints
   its units hold, and today's code gives the same with the version-1
   computation (`v1_fingerprint`, kept here): bit for bit, so every method
   computes today what it computed then;
2. the rest of a run (data, models, client work, round loop, evaluation, the
   escape simulation): the commit's code and today's run the same probes, two
   rounds of that commit's units (per data set a server optimizer, FedCAda and
   FAFED where it has them; today both with and without stacked client batches)
   and a small escape study, with identical results.

The files of the numerics (optimizers, algorithms, the registry, models, data,
the experiment and runtime layers) that changed since each commit are listed
beside. Units of a commit that fails a check are left as they are and named.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks.paper import units as units_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUMERICS_PATHS = ("tff_fedadamom/optimizers", "tff_fedadamom/algorithms",
                  "tff_fedadamom/methods.py", "tff_fedadamom/optimizers/registry.py",
                  "tff_fedadamom/models", "tff_fedadamom/data", "tff_fedadamom/experiment",
                  "tff_fedadamom/runtime", "tff_fedadamom/pipeline", "benchmarks/paper/escape.py")
ESCAPE_PROBE = {"ks": [1.0, 4.0], "dim": 4, "particles": 8, "max_rounds": 300, "chunk": 300}
PROBE = r"""
import json, sys
todo = json.load(open(sys.argv[1]))
from tff_fedadamom.session import Session
Session(threads=1).apply()
if todo["today"]:
  from benchmarks.paper.migrate_keys import v1_fingerprint as fp
else:
  from benchmarks.paper.fingerprint import fingerprint as fp
from benchmarks.paper import escape, runs, units
out = {"fingerprints": {m: fp(m) for m in todo["methods"]}, "probes": []}
for probe in todo["probes"]:
  if "setup" in probe:
    result = escape.run_study_dict(probe["setup"])
  else:
    result = runs.run_experiment_unit(probe["config"])
  out["probes"].append(units.comparable(result))
json.dump(out, open(sys.argv[2], "w"))
"""


def v1_fingerprint(name: str) -> str:
  """Version 1 of the fingerprint, as the units stored before version 2 hold it
  (the raw bytes of six float32 steps of a server optimizer, or of two rounds of
  a learning process on a float32 linear model), computed on today's code."""
  import collections
  import hashlib

  import tensorflow as tf
  import tensorflow_federated as tff

  from benchmarks.paper.fingerprint import _numeric_leaves as leaves  # noqa: SLF001
  from tff_fedadamom.methods import (build_server_optimizer, get_spec, is_learning_process,
                                     resolve_hparams)
  from tff_fedadamom.runtime.inprocess import InProcessLearningProcess

  def digest(arrays):
    h = hashlib.sha256(b"v1")
    for a in (np.ascontiguousarray(np.asarray(a)) for a in arrays):
      h.update(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
    return h.hexdigest()[:16]

  if not is_learning_process(name):
    rng, shapes = np.random.default_rng(20240601), ((3, 4), (5,))
    optimizer = build_server_optimizer(name)
    weights = tuple(tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes)
    state = optimizer.initialize(tuple(tf.TensorSpec(s, tf.float32) for s in shapes))
    for scale in (1.0, 1e-3, 10.0, 0.3, 1e2, 3e-2):
      grads = tuple(tf.constant(rng.normal(size=s).astype(np.float32) * np.float32(scale))
                    for s in shapes)
      state, weights = optimizer.next(state, weights, grads)
    return digest(leaves(weights) + leaves(state))
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                                 y=tf.TensorSpec([None, 2], tf.float32))
  clients = (([[1.0, 2.0], [0.5, -1.0]], [[2.0, 0.0], [1.0, 1.0]]),
             ([[-1.0, 0.0], [3.0, 1.0], [0.0, 0.25]], [[-1.0, 2.0], [3.0, 0.0], [0.5, 0.5]]),
             ([[2.0, -2.0]], [[-1.0, 4.0]]))

  def model_fn():
    dense = tf.keras.layers.Dense(2, input_shape=(2,), kernel_initializer=(
        tf.keras.initializers.Constant(np.array([[0.5, -0.25], [0.125, 1.0]], np.float32))),
        bias_initializer=tf.keras.initializers.Constant(0.1))
    return tff.learning.models.from_keras_model(
        tf.keras.Sequential([dense]), loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)

  process = InProcessLearningProcess(get_spec(name).builder(
      model_fn, 0.05, **resolve_hparams(name)), devices=["CPU:0"], max_concurrent_clients=1)
  state = process.initialize()
  for _ in range(2):
    state = process.next(state, [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=np.array(x, np.float32), y=np.array(y, np.float32))).batch(1)
        for x, y in clients]).state
  return digest(leaves(state.global_model_weights) + leaves(process.get_hparams(state)))


def _probes(records: list, work: str) -> list:
  """Two-round copies of a commit's units: per data set a server optimizer
  (FedAdamom where it has one), FedCAda and FAFED; a small escape study."""
  chosen: dict = {}
  for r in sorted(records, key=lambda r: r["name"]):
    if r["kind"] != "experiment":
      chosen["escape"] = {"id": "escape", "setup": ESCAPE_PROBE}
      continue
    method = r["methods"][0]
    family = method if method in ("fedcada", "fafed") else "server"
    slot = (r["spec"]["data"]["name"], family)
    if slot not in chosen or (family == "server" and method == "fedadamom"):
      chosen[slot] = {"id": r["name"], "config": dict(
          r["spec"], rounds=2, eval_every=1, checkpoint_every=2,
          output_dir=os.path.join(work, "runs", r["name"]))}
  return list(chosen.values())


def _today(probes: list) -> list:
  """The probes for today's code: a server optimizer's run with client batches
  stacked and not (`runtime.unroll_max_batches` 10**6 and 0)."""
  out = []
  for p in probes:
    if "config" not in p or p["config"]["server"]["optimizer"] in ("fedcada", "fafed"):
      out.append(p)
      continue
    for limit in (0, 10 ** 6):
      config = dict(p["config"], output_dir=f"{p['config']['output_dir']}-{limit}",
                    runtime=dict(p["config"]["runtime"], unroll_max_batches=limit))
      out.append(dict(p, config=config))
  return out


def _run(tree: str, probes: list, methods: list, today: bool, work: str) -> dict:
  """Fingerprints and probes in a fresh process on the code in `tree`."""
  os.makedirs(work, exist_ok=True)
  todo, out = os.path.join(work, "todo.json"), os.path.join(work, "out.json")
  with open(todo, "w") as f:
    json.dump({"probes": probes, "methods": methods, "today": today}, f)
  env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="3",
             TFF_FEDADAMOM_CACHE_DIR=os.path.join(work, "cache"),
             TFF_FEDADAMOM_DATA_CACHE_DIR=os.path.join(work, "data"))
  with open(os.path.join(work, "log.txt"), "w") as log:
    proc = subprocess.Popen([sys.executable, "-c", PROBE, todo, out], cwd=tree, env=env,
                            stdout=log, stderr=log, start_new_session=True)
    try:
      status = proc.wait()
    finally:
      try:  # nothing it started outlives it
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  if status != 0:
    with open(os.path.join(work, "log.txt")) as f:
      raise RuntimeError(f"probes on {tree} failed:\n{f.read()[-3000:]}")
  with open(out) as f:
    return json.load(f)


def check_commit(commit: str, records: list, work: str) -> list:
  """Why `commit`'s units may not be re-keyed (an empty list: they may)."""
  tree = os.path.join(work, "tree")
  os.makedirs(tree)
  archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True,
                           check=True).stdout
  subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
  methods = sorted({m for r in records for m in r["methods"]})
  probes = _probes(records, work)
  then = _run(tree, probes, methods, False, os.path.join(work, "then"))
  now = _run(REPO, _today(probes), methods, True, os.path.join(work, "now"))
  problems = [f"{r['name']}: {m}: stored {r['fingerprints'][m]}, at {commit[:10]} "
              f"{then['fingerprints'][m]}, today {now['fingerprints'][m]}"
              for r in records for m in r["methods"]
              if not r["fingerprints"][m] == then["fingerprints"][m] == now["fingerprints"][m]]
  expected = {p["id"]: result for p, result in zip(probes, then["probes"])}
  for p, result in zip(_today(probes), now["probes"]):
    diff = units_lib.first_difference(expected[p["id"]], result)
    variant = p["config"]["runtime"].get("unroll_max_batches") if "config" in p else None
    print(f"  probe {p['id']}" + ("" if variant is None else f" (unroll_max_batches "
                                                             f"{variant})")
          + f": {_gist(result)} today, " + ("identical" if not diff else "DIFFERS"), flush=True)
    if diff:
      problems.append(f"probe {p['id']}: {diff[0]}: {diff[1]!r} at {commit[:10]}, "
                      f"{diff[2]!r} today")
  return problems


def _gist(result: dict) -> str:
  """A probe's result in a few numbers (what the comparison covered)."""
  if "history" in result:
    return (f"{len(result['history'])} evaluated rounds, final test accuracy "
            f"{result['final_test_accuracy']:.4f}, loss {result['final_test_loss']:.4f}")
  taus = {o: [k["tau"] for k in r["per_k"]] for o, r in result["optimizers"].items()}
  return f"escape taus {taus}"


def changed_files(commit: str) -> str:
  """The numerics files that differ between `commit` and the work tree (renames
  followed)."""
  done = subprocess.run(["git", "diff", "-M", "--stat=120", commit, "--", *NUMERICS_PATHS],
                        cwd=REPO, capture_output=True, text=True, check=True)
  return done.stdout.rstrip() or "  (none)"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.paper.migrate_keys")
  parser.add_argument("--results", default=os.path.join(os.path.dirname(
      os.path.abspath(__file__)), units_lib.RESULTS_DIR))
  parser.add_argument("--dry-run", action="store_true", help="check, rewrite nothing")
  args = parser.parse_args(argv)
  from benchmarks.paper import fingerprint

  store = units_lib.Store(args.results)
  by_commit: dict = {}
  for record in store.records():
    by_commit.setdefault(record.get("source_commit"), []).append(record)
  rekeyed, refused = 0, []
  for commit, records in sorted(by_commit.items(), key=lambda item: str(item[0])):
    print(f"== {commit}: {len(records)} unit(s); numerics files changed since:\n"
          + changed_files(commit), flush=True)
    with tempfile.TemporaryDirectory(prefix="migrate-") as work:
      problems = check_commit(commit, records, work) if commit else ["no source commit"]
    if problems:
      refused += [r["name"] for r in records]
      print("  NOT re-keyed:\n" + "\n".join(f"    {p}" for p in problems), flush=True)
      continue
    print("  methods and probes identical: re-keyed", flush=True)
    for record in records:
      unit = units_lib.Unit.from_record(record)
      new = dict(record, key=unit.key, fingerprints=fingerprint.fingerprints(unit.methods),
                 rekeyed_from={"key": record["key"], "fingerprints": record["fingerprints"]})
      if not args.dry_run:
        units_lib.atomic_write_json(store.path(record["name"]), new)
      rekeyed += 1
  print(f"re-keyed {rekeyed} unit(s); not re-keyed {len(refused)}"
        + (": " + ", ".join(refused) if refused else ""))
  return 1 if refused else 0


if __name__ == "__main__":
  sys.exit(main())
