"""The study's units: fingerprints, unit files and keys, the pool, --verify and
the no-shrink rule of --report-only (benchmarks/paper/fingerprint.py, units.py,
runs.py, reproduce.py)."""

import json
import math
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.paper import fingerprint, plan, report, reproduce, runs, units

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A tiny unit with real numerics: one server optimizer's fingerprint computation.
TINY_FN = "benchmarks.paper.fingerprint:server_optimizer_fingerprint"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def tiny_unit(name, optimizer, methods=("fedavg",), **kwargs):
  return units.Unit(name, fn=TINY_FN, kwargs={"name": optimizer, **kwargs}, methods=methods)


def one_worker(tmp_path):
  """The study's pool of one worker: its units run in this process."""
  return runs.Pool(1, str(tmp_path / "logs"))


class NoPool(runs.Pool):
  def __init__(self):
    super().__init__(1, "unused")

  def completed(self, units, run_dir):
    if units:
      raise AssertionError("a stored unit was run again")
    return iter(())


# ---------------------------------------------------------------------------- fingerprints


def test_fingerprints_are_the_same_with_onednn_on_and_off(tmp_path):
  """The kernels oneDNN picks by the CPU change float32 bits, not fingerprints:
  computed afresh (empty memo) in processes with oneDNN off and on, a server
  optimizer's and a learning process's fingerprints equal this process's."""
  names = ("fedadamom", "fedcada")
  code = ("from benchmarks.paper import fingerprint as f; "
          f"print(' '.join(f.fingerprint(n) for n in {names!r}))")
  procs = [subprocess.Popen(  # side by side
      [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
      env=dict(ENV, TF_ENABLE_ONEDNN_OPTS=onednn, TFF_FEDADAMOM_CACHE_DIR=str(tmp_path / onednn)))
      for onednn in ("0", "1")]
  seen = [proc.communicate(timeout=900)[0].split() for proc in procs]
  assert [proc.returncode for proc in procs] == [0, 0]
  assert seen[0] == seen[1] == [fingerprint.fingerprint(n) for n in names]
  memo = tmp_path / "1" / "fingerprints" / os.path.basename(fingerprint.memo_dir())
  assert [(memo / n).read_text() for n in names] == seen[1]


def test_values_are_hashed_at_the_stated_digits():
  base = fingerprint.digest([np.array([1.0, -2.5e-3, 0.0])])
  below = np.array([1.0 + 1e-12, -2.5e-3 * (1 - 1e-12), -0.0])  # past the 8th digit
  assert fingerprint.digest([below]) == base
  assert fingerprint.digest([np.array([1.0 + 1e-7, -2.5e-3, 0.0])]) != base
  f32 = np.array([0.3], np.float32)
  assert fingerprint.digest([f32]) == fingerprint.digest([np.nextafter(f32, np.float32(1))])
  assert fingerprint.digest([f32]) != fingerprint.digest([f32 * np.float32(1.0001)])
  assert fingerprint.digest([np.array([3])]) != fingerprint.digest([np.array([3.0])])


def test_a_changed_hparam_changes_the_fingerprint():
  base = fingerprint.server_optimizer_fingerprint("fedadam")
  assert fingerprint.server_optimizer_fingerprint("fedadam") == base
  assert fingerprint.server_optimizer_fingerprint("fedadam", beta_2=0.95) != base
  assert fingerprint.server_optimizer_fingerprint("fedadam", bias_correction=False) != base
  assert fingerprint.server_optimizer_fingerprint("fedavgm", momentum=0.5) != \
      fingerprint.server_optimizer_fingerprint("fedavgm")
  values = [fingerprint.fingerprint(n) for n in plan.OPTIMIZERS]
  assert len(set(values)) == len(values)  # every method computes something of its own


def test_a_changed_rule_changes_the_fingerprint_and_moved_code_does_not(monkeypatch):
  """FedAdamom's update scaled by 1.001 gives another fingerprint; the same rule
  reached through other code gives the same one."""
  from tff_fedadamom.optimizers import fedadamom

  base = fingerprint.server_optimizer_fingerprint("fedadamom")
  original = fedadamom._fedadamom_steps
  monkeypatch.setattr(fedadamom, "_fedadamom_steps", lambda *a, **k: original(*a, **k))
  assert fingerprint.server_optimizer_fingerprint("fedadamom") == base

  def changed(momenta, moments, grads, lr, beta_2, epsilon):
    return original(momenta, moments, grads, lr * 1.001, beta_2, epsilon)

  monkeypatch.setattr(fedadamom, "_fedadamom_steps", changed)
  assert fingerprint.server_optimizer_fingerprint("fedadamom") != base


def test_a_learning_process_fingerprint_follows_its_hparams():
  base = fingerprint.learning_process_fingerprint("fafed")
  assert fingerprint.learning_process_fingerprint("fafed", alpha=0.5) != base


def test_a_fingerprint_is_computed_once_per_machine_and_code(tmp_path, monkeypatch):
  """The memo beside the process cache answers another process (here: the
  in-process cache cleared); other versions of the code keep theirs in another folder."""
  from tff_fedadamom.runtime import process_cache

  monkeypatch.setenv("TFF_FEDADAMOM_CACHE_DIR", str(tmp_path))
  fingerprint.fingerprint.cache_clear()
  try:
    value = fingerprint.fingerprint("fedavgm")
    assert value == fingerprint.server_optimizer_fingerprint("fedavgm")
    fingerprint.fingerprint.cache_clear()
    with monkeypatch.context() as m:
      m.setattr(fingerprint, "_compute", lambda name: pytest.fail(f"{name} computed again"))
      assert fingerprint.fingerprint("fedavgm") == value
    here = fingerprint.memo_dir()
    assert os.listdir(here) == ["fedavgm"]
    fingerprint._memo_key.cache_clear()
    with monkeypatch.context() as m:
      m.setattr(process_cache, "versions", lambda: {"tensorflow": "another version"})
      assert fingerprint.memo_dir() != here
  finally:
    fingerprint.fingerprint.cache_clear()
    fingerprint._memo_key.cache_clear()


# ---------------------------------------------------------------------------- unit files


def test_the_key_covers_the_config_and_the_fingerprints_not_where_it_runs():
  fp = lambda methods: {m: "aa" for m in methods}
  config = {"seed": 1, "server": {"optimizer": "fedadam"}, "output_dir": "x", "name": "a",
            "runtime": {"threads": 1}}
  a = units.Unit("a", config=config, fingerprints=fp)
  b = units.Unit("b", config=dict(config, output_dir="y", name="b",
                                  runtime={"threads": 1, "cache": False}), fingerprints=fp)
  assert a.methods == ("fedadam",) and a.key == b.key
  assert units.Unit("a", config=dict(config, seed=2), fingerprints=fp).key != a.key
  assert units.Unit("a", config=dict(config, runtime={"threads": 2}), fingerprints=fp).key \
      != a.key
  assert units.Unit("a", config=config, fingerprints=lambda m: {x: "bb" for x in m}).key \
      != a.key


def test_stored_units_are_loaded_not_run(tmp_path):
  store = units.Store(str(tmp_path / "results"))
  cache = runs.Cache(str(tmp_path))
  batch = [tiny_unit("t/fedavg", "fedavg"), tiny_unit("t/fedadam", "fedadam")]
  first = runs.run_units(batch, store, cache, one_worker(tmp_path), log=lambda _: None)
  assert set(first) == {"t/fedavg", "t/fedadam"}
  record = json.loads((tmp_path / "results" / "t" / "fedadam.json").read_text())
  assert record["key"] == batch[1].key and record["result"] == first["t/fedadam"]
  assert record["fingerprints"] == {"fedavg": fingerprint.fingerprint("fedavg")}
  assert record["kind"] == "call" and record["wall_time_s"] >= 0
  assert record["machine"] == units.machine()
  # Another process, another machine: a new store reads the files; nothing runs.
  again = [tiny_unit("t/fedavg", "fedavg"), tiny_unit("t/fedadam", "fedadam")]
  loaded = runs.run_units(again, units.Store(str(tmp_path / "results")), cache, NoPool(),
                          log=lambda _: None)
  assert loaded == first


def test_a_spec_with_a_field_the_config_dropped_keeps_its_unit(tmp_path):
  """A stored spec that still holds `runtime.fuse_after_rounds` (removed from the
  config) matches the unit planned without it, whatever key its file holds."""
  fp = lambda methods: {m: "aa" for m in methods}
  config = {"seed": 1, "server": {"optimizer": "fedadam"}, "runtime": {"threads": 1}}
  record = {"name": "u", "key": "written by older code", "kind": "experiment",
            "spec": dict(config, runtime={"threads": 1, "fuse_after_rounds": 3}),
            "methods": ["fedadam"], "fingerprints": {"fedadam": "aa"}, "result": {"x": 1}}
  (tmp_path / "u.json").write_text(json.dumps(record))
  store = units.Store(str(tmp_path))
  assert store.get(units.Unit("u", config=config, fingerprints=fp)) == {"x": 1}
  other = units.Unit("u", config=dict(config, seed=2), fingerprints=fp)
  assert store.get(other) is None
  assert store.why_missing(other) == "its file holds another spec (spec.seed: 1, now 2)"
  stale = units.Unit("u", config=config, fingerprints=lambda m: {"fedadam": "bb"})
  assert store.why_missing(stale) == "fingerprints differ: fedadam (stored aa, this code bb)"


def stored_files(root, index):
  """A call unit of the test below: how many unit files `root` holds when it runs."""
  del index  # only makes each unit's key its own
  return sum(len(files) for _, _, files in os.walk(root))


def test_a_pool_of_one_worker_runs_each_unit_here_once_the_last_is_stored(tmp_path):
  root = str(tmp_path / "results")
  batch = [units.Unit(f"t/{i}", fn=f"{__name__}:{fn}", kwargs={"root": root, "index": i})
           for i, fn in enumerate(("stored_files", "no_such_function", "stored_files"))]
  lines = []
  out = runs.run_units(batch, units.Store(root), runs.Cache(str(tmp_path)),
                       one_worker(tmp_path), log=lines.append)
  assert multiprocessing.active_children() == []  # nothing was spawned
  assert not os.path.exists(tmp_path / "logs")  # no worker made its log
  # The first unit was stored before the third ran; the failed one in between is
  # reported, left out, and stops nothing.
  assert out == {"t/0": 0, "t/2": 1}
  assert any("t/1: FAILED: AttributeError" in line for line in lines), lines
  assert sorted(os.listdir(os.path.join(root, "t"))) == ["0.json", "2.json"]


def _tiny_trial(server_lr):
  return {"seed": 1, "rounds": 2, "clients_per_round": 3, "eval_every": 1,
          "checkpoint_every": 2, "output_dir": "unused",
          "data": {"name": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
          "model": {"name": "logistic"}, "client": {"learning_rate": 0.1, "batch_size": 16},
          "server": {"optimizer": "fedadam", "learning_rate": server_lr}}


def test_a_pool_of_one_worker_runs_trials_of_one_method_on_shared_parts(tmp_path):
  """Two trials of one method (their server learning rates live in the state):
  the second runs on the parts the first built, with the numbers it has on
  parts of its own."""
  batch = [units.Unit(f"t/{lr}", config=_tiny_trial(lr)) for lr in (0.5, 0.05)]
  pool = one_worker(tmp_path)
  out = runs.run_units(batch, units.Store(str(tmp_path / "results")),
                       runs.Cache(str(tmp_path)), pool, log=lambda _: None)
  assert (pool._parts.misses, pool._parts.hits) == (1, 1)
  own = runs.run_experiment_unit(dict(_tiny_trial(0.05), output_dir=str(tmp_path / "own")))
  assert out["t/0.05"]["history"] != out["t/0.5"]["history"]
  assert units.comparable(out["t/0.05"]) == units.comparable(own)


def test_a_unit_with_a_stale_fingerprint_runs_again(tmp_path):
  root = tmp_path / "results"
  stale = units.Unit("t/fedadam", fn=TINY_FN, kwargs={"name": "fedadam"},
                     methods=("fedavg",), fingerprints=lambda m: {"fedavg": "0" * 16})
  units.Store(str(root)).put(stale, "a result from other numerics", 1.0)
  current = tiny_unit("t/fedadam", "fedadam")
  out = runs.run_units([current], units.Store(str(root)), runs.Cache(str(tmp_path)),
                       one_worker(tmp_path), log=lambda _: None)
  assert out["t/fedadam"] == fingerprint.server_optimizer_fingerprint("fedadam")
  record = json.loads((root / "t" / "fedadam.json").read_text())
  assert record["key"] == current.key != stale.key
  assert record["fingerprints"]["fedavg"] == fingerprint.fingerprint("fedavg")


def test_first_difference_names_the_field_exactly_or_within_a_tolerance():
  a = {"history": [{"round": 1, "test/accuracy": 0.5, "test/loss": 1.0}],
       "best_round": 5, "eval_rounds": [5, 10], "status": "completed", "total_s": 3.0}
  b = json.loads(json.dumps(a))
  b["history"][0].update({"test/accuracy": 0.503, "test/loss": 1.01})
  b["best_round"], b["total_s"] = 10, 9.0
  stored, now = units.comparable(a), units.comparable(b)
  assert units.first_difference(stored, stored) is None
  assert units.first_difference(stored, now) == ("result.best_round", 5, 10)
  close = reproduce.within_tolerance(stored)
  assert units.first_difference(stored, now, close=close) is None
  far = json.loads(json.dumps(now))
  far["history"][0]["test/accuracy"] = 0.51
  assert units.first_difference(stored, far, close=close) == (
      "result.history[0].test/accuracy", 0.5, 0.51)
  assert units.first_difference(stored, dict(now, best_round=15), close=close)[0] == \
      "result.best_round"
  assert units.first_difference({"x": float("nan")}, {"x": float("nan")}) is None


# ---------------------------------------------------------------------------- --verify


def _stored(tmp_path, names=("fedavg", "fedadam", "fedadamom")):
  store = units.Store(str(tmp_path / "results"))
  runs.run_units([tiny_unit(f"t/{n}", n) for n in names], store, runs.Cache(str(tmp_path)),
                 one_worker(tmp_path), log=lambda _: None)
  return store


def test_verify_chooses_by_seed():
  records = [{"name": f"u{i}"} for i in range(10)]
  first = reproduce.choose(records, 3, seed=1)
  assert [r["name"] for r in reproduce.choose(list(reversed(records)), 3, seed=1)] == \
      [r["name"] for r in first]
  assert len(first) == 3 and len(reproduce.choose(records, 20, seed=1)) == 10


def test_verify_fails_on_a_changed_result_naming_unit_and_field(tmp_path):
  _stored(tmp_path)
  path = tmp_path / "results" / "t" / "fedadam.json"
  record = json.loads(path.read_text())
  record["result"] = "0" * 16
  path.write_text(json.dumps(record))
  lines = []
  status = reproduce.verify(units.Store(str(tmp_path / "results")), 3, 0,
                         runs.Cache(str(tmp_path)), one_worker(tmp_path), log=lines.append)
  assert status == 1
  assert any("DIFFERS t/fedadam: result: stored '0000000000000000'" in l for l in lines)
  assert any("t/fedavg: identical" in l for l in lines)
  assert any(f"t/fedavg: stored at commit unknown, on {units.machine()}; compared exactly"
             in l for l in lines)


def test_verify_compares_a_unit_of_another_machine_within_the_tolerance(tmp_path):
  """A result off by less than the tolerance reproduces when it was stored on
  another machine, and not when it was stored on this one."""
  store = units.Store(str(tmp_path / "results"))
  unit = units.Unit("t/u", fn="json:loads", kwargs={"s": '{"test/accuracy": 0.5}'})
  path = store.put(unit, {"test/accuracy": 0.5 + reproduce.TOLERANCE["accuracy (absolute)"] / 2},
                   0.0)
  lines = []
  assert reproduce.verify(units.Store(store.root), 1, 0, runs.Cache(str(tmp_path)),
                       one_worker(tmp_path), log=lines.append) == 1
  record = json.loads(open(path).read())
  record["machine"] = "another machine"
  with open(path, "w") as f:
    json.dump(record, f)
  lines = []
  assert reproduce.verify(units.Store(store.root), 1, 0, runs.Cache(str(tmp_path)),
                       one_worker(tmp_path), log=lines.append) == 0
  assert any("on another machine; compared within the tolerance" in l for l in lines)
  assert any("t/u: within the tolerance" in l for l in lines)


def test_verify_fails_on_a_stale_unit(tmp_path):
  store = units.Store(str(tmp_path / "results"))
  stale = units.Unit("t/x", fn=TINY_FN, kwargs={"name": "fedavg"}, methods=("fedavg",),
                     fingerprints=lambda m: {"fedavg": "0" * 16})
  store.put(stale, "x", 0.0)
  lines = []
  assert reproduce.verify(units.Store(str(tmp_path / "results")), 1, 0,
                       runs.Cache(str(tmp_path)), NoPool(), log=lines.append) == 1
  assert any("t/x: fingerprints differ: fedavg (stored 0000" in l for l in lines)


def test_reproduce_verify_reruns_stored_units(tmp_path):
  """`reproduce --verify 2`, the command, with one worker: exit 0."""
  _stored(tmp_path)
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.paper.reproduce", "--verify", "2", "--verify-seed",
       "3", "--out", str(tmp_path), "--workers", "1"],
      cwd=REPO, capture_output=True, text=True, env=ENV, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert done.stdout.count(": identical (") == 2 and "2 of 2 units reproduce" in done.stdout
  assert "tolerance where a unit was stored on another machine: accuracy (absolute)" \
      in done.stdout


# ---------------------------------------------------------------------------- no shrink


def test_report_only_writes_nothing_that_holds_less(tmp_path):
  """A stored escape unit whose fingerprints no longer match gives a report
  without study 4, which results.json has: nothing is written, the command says
  which cell shrank and why, and exits with 3."""
  doc = {"mode": "quick", "methods": [], "results": {"escape": {}}, "timings": {}}
  (tmp_path / reproduce.RESULTS_FILE).write_text(json.dumps(doc))
  (tmp_path / report.REPORT_FILE).write_text("the report as it was\n")
  from benchmarks.paper import escape
  import dataclasses

  unit = units.Unit("escape/study", fn="benchmarks.paper.escape:run_study_dict",
                    kwargs={"setup": dataclasses.asdict(plan.QUICK.escape)},
                    methods=escape.OPTIMIZERS, version=escape.VERSION,
                    fingerprints=lambda ms: {m: "0" * 16 for m in ms})
  units.Store(str(tmp_path / "results")).put(unit, {"a": 1}, 0.0)
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.paper.reproduce", "--quick", "--report-only",
       "--out", str(tmp_path), "--workers", "1"],
      cwd=REPO, capture_output=True, text=True, env=ENV, timeout=900)
  assert done.returncode == reproduce.SHRINKS, done.stdout[-3000:] + done.stderr[-3000:]
  assert "4. Escape from sharp minima: 1 -> 0" in done.stdout
  assert "escape/study: fingerprints differ: fedadam (stored 0000000000000000, this code " \
      f"{fingerprint.fingerprint('fedadam')}" in done.stdout
  assert json.loads((tmp_path / reproduce.RESULTS_FILE).read_text()) == doc
  assert (tmp_path / report.REPORT_FILE).read_text() == "the report as it was\n"
  assert not (tmp_path / "plots").exists()


# ---------------------------------------------------------------------------- git


def _git(cwd, *args):
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)


def test_commit_units_commits_each_file_alone(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  _git(repo, "config", "user.email", "study@example.com")
  _git(repo, "config", "user.name", "study")
  (repo / "code.py").write_text("x = 1\n")
  _git(repo, "add", "code.py")
  _git(repo, "commit", "-q", "-m", "code")
  head = _git(repo, "rev-parse", "HEAD").stdout.strip()
  results = repo / "out" / "results"
  source = units.source_commit(str(repo), exclude=str(results))
  assert source == {"commit": head, "dirty": False}
  (repo / "staged.txt").write_text("someone else's change\n")
  _git(repo, "add", "staged.txt")
  assert units.source_commit(str(repo), exclude=str(results))["dirty"] is True
  store = units.Store(str(results), commit=True, source=source)
  unit = units.Unit("s/u1", fn="json:dumps", kwargs={"obj": [1]})
  store.put(unit, "[1]", 0.5)
  log = _git(repo, "log", "--format=%s", "--name-only", "-1").stdout
  assert f"Paper study: unit s/u1 ({unit.key})" in log
  assert "out/results/s/u1.json" in log and "staged.txt" not in log
  assert "A  staged.txt" in _git(repo, "status", "--porcelain").stdout  # left staged
  record = json.loads((results / "s" / "u1.json").read_text())
  assert record["source_commit"] == head and record["source_dirty"] is False
  with pytest.raises(ValueError, match="not inside a git work tree"):
    units.Store(str(tmp_path / "elsewhere"), commit=True)


def test_a_spec_hash_ignores_the_last_bits_of_a_float_but_not_a_real_change():
  """libm's exp and log may differ in the last bit from CPU to CPU: a drawn
  hparam one ulp apart is the same unit; a change in its 10th digit is not."""
  from benchmarks.paper import units

  drawn = 0.0937182391870729  # a learning rate two CPUs drew one ulp apart
  spec = {"client": {"learning_rate": drawn, "batch_size": 20}, "seed": [1, 2.5]}
  ulp = {"client": {"learning_rate": math.nextafter(drawn, 1.0), "batch_size": 20},
         "seed": [1, 2.5]}
  assert units.spec_hash(spec) == units.spec_hash(ulp)
  assert units.first_difference(units.canonical(spec), units.canonical(ulp)) is None
  other = {"client": {"learning_rate": drawn * (1 + 1e-8), "batch_size": 20}, "seed": [1, 2.5]}
  assert units.spec_hash(spec) != units.spec_hash(other)
  assert units.spec_hash({"x": 1}) != units.spec_hash({"x": 1.0 + 1e-9})
