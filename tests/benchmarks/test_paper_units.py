"""The study's units: numerics fingerprints, the unit files, resuming, --verify and
--commit-units (benchmarks/paper/fingerprint.py, units.py, runs.py, verify.py)."""

import concurrent.futures as futures
import json
import multiprocessing
import os
import subprocess
import sys

import pytest

from benchmarks.paper import fingerprint, runs, units, verify

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A tiny unit with real numerics: one server optimizer's fingerprint computation.
TINY_FN = "benchmarks.paper.fingerprint:server_optimizer_fingerprint"


class ThreadPool:
  """Stands in for runs.Pool: runs units in threads of this process (no TFF
  worker start-up), through the same `timed_unit`."""

  workers = 1

  def __init__(self):
    self.submitted = []
    self._executor = futures.ThreadPoolExecutor(1)

  def executor(self):
    pool = self

    class Recording:
      def submit(self, fn, *args):
        pool.submitted.append(args)
        return pool._executor.submit(fn, *args)

    return Recording()

  def shutdown(self, cancel=False):
    self._executor.shutdown(wait=True)


class NoPool(ThreadPool):
  def executor(self):
    raise AssertionError("a stored unit was run again")


def tiny_unit(name, optimizer, methods=("fedavg",), **kwargs):
  return units.Unit(name, fn=TINY_FN, kwargs={"name": optimizer, **kwargs}, methods=methods)


# ---------------------------------------------------------------------------- fingerprints


def test_a_changed_hparam_changes_the_fingerprint():
  base = fingerprint.server_optimizer_fingerprint("fedadam")
  assert fingerprint.server_optimizer_fingerprint("fedadam") == base
  assert fingerprint.server_optimizer_fingerprint("fedadam", beta_2=0.95) != base
  assert fingerprint.server_optimizer_fingerprint("fedadam", bias_correction=False) != base
  assert fingerprint.server_optimizer_fingerprint("fedavgm", momentum=0.5) != \
      fingerprint.server_optimizer_fingerprint("fedavgm")
  # Every method computes something of its own.
  values = [fingerprint.fingerprint(n) for n in
            ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedamsgrad", "fadas",
             "fedadamom")]
  assert len(set(values)) == len(values)


def test_a_changed_rule_changes_the_fingerprint_and_moved_code_does_not(monkeypatch):
  """FedAdamom's update rule, changed by one ulp-scale factor, gives another
  fingerprint; the same rule reached through other code gives the same one."""
  from tff_fedadamom.optimizers import fedadamom

  base = fingerprint.server_optimizer_fingerprint("fedadamom")
  original = fedadamom._fedadamom_steps

  def moved(*args, **kwargs):  # a refactor: the same numbers through a new function
    return original(*args, **kwargs)

  monkeypatch.setattr(fedadamom, "_fedadamom_steps", moved)
  assert fingerprint.server_optimizer_fingerprint("fedadamom") == base

  def changed(momenta, moments, grads, lr, beta_2, epsilon):
    return original(momenta, moments, grads, lr * 1.001, beta_2, epsilon)

  monkeypatch.setattr(fedadamom, "_fedadamom_steps", changed)
  assert fingerprint.server_optimizer_fingerprint("fedadamom") != base


def test_a_learning_process_fingerprint_follows_its_hparams():
  base = fingerprint.learning_process_fingerprint("fafed")
  assert fingerprint.learning_process_fingerprint("fafed", alpha=0.5) != base


def test_fingerprints_are_the_same_in_a_fresh_process(tmp_path):
  names = ("fedadamom", "fedcada")
  here = {n: fingerprint.fingerprint(n) for n in names}
  code = ("from benchmarks.paper import fingerprint as f; "
          f"print(' '.join(f.fingerprint(n) for n in {names!r}))")
  # An empty cache directory: the child computes them, it does not read this
  # session's memo.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFF_FEDADAMOM_CACHE_DIR=str(tmp_path))
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                        text=True, env=env, check=True, timeout=900)
  assert done.stdout.split() == [here[n] for n in names]
  memo = json.loads((tmp_path / fingerprint.MEMO_FILE).read_text())
  assert memo["fingerprints"] == here


def test_a_fingerprint_is_computed_once_per_machine_and_code(tmp_path, monkeypatch):
  """The memo beside the process cache answers another process (here: the
  in-process cache cleared) while the code and libraries stay the same, and an
  entry made under another key (other code) is never read."""
  monkeypatch.setenv("TFF_FEDADAMOM_CACHE_DIR", str(tmp_path))
  fingerprint.fingerprint.cache_clear()
  try:
    value = fingerprint.fingerprint("fedavgm")
    assert value == fingerprint.server_optimizer_fingerprint("fedavgm")
    fingerprint.fingerprint.cache_clear()

    def computed(name):
      raise AssertionError(f"{name} computed again")

    with monkeypatch.context() as m:
      m.setattr(fingerprint, "_compute", computed)
      assert fingerprint.fingerprint("fedavgm") == value
    path = tmp_path / fingerprint.MEMO_FILE
    path.write_text(json.dumps({"key": "other code", "fingerprints": {"fedavgm": "stale"}}))
    fingerprint.fingerprint.cache_clear()
    assert fingerprint.fingerprint("fedavgm") == value
    assert json.loads(path.read_text())["key"] != "other code"
  finally:
    fingerprint.fingerprint.cache_clear()


# ---------------------------------------------------------------------------- unit files


def test_the_key_covers_the_config_and_the_fingerprints_not_where_it_runs():
  fp = lambda methods: {m: "aa" for m in methods}
  config = {"seed": 1, "server": {"optimizer": "fedadam"}, "output_dir": "x", "name": "a"}
  a = units.Unit("a", config=config, fingerprints=fp)
  b = units.Unit("b", config=dict(config, output_dir="y", name="b"), fingerprints=fp)
  assert a.methods == ("fedadam",) and a.key == b.key
  assert units.Unit("a", config=dict(config, seed=2), fingerprints=fp).key != a.key
  other = units.Unit("a", config=config, fingerprints=lambda m: {x: "bb" for x in m})
  assert other.key != a.key


def test_stored_units_are_loaded_not_run(tmp_path):
  store = units.Store(str(tmp_path / "results"))
  cache = runs.Cache(str(tmp_path))
  batch = [tiny_unit("t/fedavg", "fedavg"), tiny_unit("t/fedadam", "fedadam")]
  first = runs.run_units(batch, store, cache, ThreadPool(), log=lambda _: None)
  assert set(first) == {"t/fedavg", "t/fedadam"}
  record = json.loads((tmp_path / "results" / "t" / "fedadam.json").read_text())
  assert record["key"] == batch[1].key and record["result"] == first["t/fedadam"]
  assert record["fingerprints"] == {"fedavg": fingerprint.fingerprint("fedavg")}
  assert record["kind"] == "call" and record["wall_time_s"] >= 0
  # Another process, another machine: a new store reads the files; nothing runs.
  again = [tiny_unit("t/fedavg", "fedavg"), tiny_unit("t/fedadam", "fedadam")]
  loaded = runs.run_units(again, units.Store(str(tmp_path / "results")), cache, NoPool(),
                          log=lambda _: None)
  assert loaded == first


def stored_files(root, index):
  """A call unit of the test below: how many unit files `root` holds when it runs."""
  del index  # only makes each unit's key its own
  return sum(len(files) for _, _, files in os.walk(root))


def test_a_pool_of_one_worker_runs_each_unit_here_once_the_last_is_stored(tmp_path):
  root = str(tmp_path / "results")
  batch = [units.Unit(f"t/{i}", fn=f"{__name__}:{fn}", kwargs={"root": root, "index": i})
           for i, fn in enumerate(("stored_files", "no_such_function", "stored_files"))]
  pool = runs.Pool(1, str(tmp_path / "logs"))
  lines = []
  out = runs.run_units(batch, units.Store(root), runs.Cache(str(tmp_path)), pool,
                       log=lines.append)
  assert isinstance(pool.executor(), runs.InlineExecutor)
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
  pool = runs.Pool(1, str(tmp_path / "logs"))
  cache = runs.Cache(str(tmp_path))
  out = runs.run_units(batch, units.Store(str(tmp_path / "results")), cache, pool,
                       log=lambda _: None)
  shared = pool.executor().parts
  assert (shared.misses, shared.hits) == (1, 1)
  own = runs.run_experiment_unit(dict(_tiny_trial(0.05), output_dir=str(tmp_path / "own")))
  assert out["t/0.05"]["history"] != out["t/0.5"]["history"]
  assert units.comparable(out["t/0.05"]) == units.comparable(own)


def test_a_unit_with_a_stale_fingerprint_runs_again(tmp_path):
  root = tmp_path / "results"
  stale = units.Unit("t/fedadam", fn=TINY_FN, kwargs={"name": "fedadam"},
                     methods=("fedavg",), fingerprints=lambda m: {"fedavg": "0" * 16})
  units.Store(str(root)).put(stale, "a result from other numerics", 1.0)
  pool = ThreadPool()
  current = tiny_unit("t/fedadam", "fedadam")
  out = runs.run_units([current], units.Store(str(root)), runs.Cache(str(tmp_path)), pool,
                       log=lambda _: None)
  assert len(pool.submitted) == 1
  assert out["t/fedadam"] == fingerprint.server_optimizer_fingerprint("fedadam")
  record = json.loads((root / "t" / "fedadam.json").read_text())
  assert record["key"] == current.key != stale.key
  assert record["fingerprints"]["fedavg"] == fingerprint.fingerprint("fedavg")


def test_first_difference_names_the_field():
  a = {"history": [{"round": 1, "acc": 0.5}], "status": "completed", "total_s": 3.0}
  b = {"history": [{"round": 1, "acc": 0.25}], "status": "completed", "total_s": 9.0}
  assert units.first_difference(units.comparable(a), units.comparable(a)) is None
  assert units.first_difference(units.comparable(a), units.comparable(b)) == (
      "result.history[0].acc", 0.5, 0.25)
  # Timing fields never count; NaN equals NaN.
  assert units.first_difference(units.comparable(a), units.comparable(
      dict(a, total_s=1.0))) is None
  assert units.first_difference({"x": float("nan")}, {"x": float("nan")}) is None


# ---------------------------------------------------------------------------- --verify


def _stored(tmp_path, names=("fedavg", "fedadam", "fedadamom")):
  store = units.Store(str(tmp_path / "results"))
  runs.run_units([tiny_unit(f"t/{n}", n) for n in names], store, runs.Cache(str(tmp_path)),
                 ThreadPool(), log=lambda _: None)
  return store


def test_verify_chooses_by_seed():
  records = [{"name": f"u{i}"} for i in range(10)]
  first = verify.choose(records, 3, seed=1)
  assert [r["name"] for r in verify.choose(list(reversed(records)), 3, seed=1)] == \
      [r["name"] for r in first]
  assert len(first) == 3 and len(verify.choose(records, 20, seed=1)) == 10


def test_verify_fails_on_a_changed_result_naming_unit_and_field(tmp_path):
  _stored(tmp_path)
  path = tmp_path / "results" / "t" / "fedadam.json"
  record = json.loads(path.read_text())
  record["result"] = "0" * 16
  path.write_text(json.dumps(record))
  lines = []
  status = verify.verify(units.Store(str(tmp_path / "results")), 3, 0,
                         runs.Cache(str(tmp_path)), ThreadPool(), log=lines.append)
  assert status == 1
  assert any("DIFFERS t/fedadam: result: stored '0000000000000000'" in l for l in lines)
  assert any("t/fedavg: identical" in l for l in lines)


def test_verify_fails_on_a_stale_unit(tmp_path):
  store = units.Store(str(tmp_path / "results"))
  stale = units.Unit("t/x", fn=TINY_FN, kwargs={"name": "fedavg"}, methods=("fedavg",),
                     fingerprints=lambda m: {"fedavg": "0" * 16})
  store.put(stale, "x", 0.0)
  lines = []
  assert verify.verify(units.Store(str(tmp_path / "results")), 1, 0,
                       runs.Cache(str(tmp_path)), NoPool(), log=lines.append) == 1
  assert any("t/x: key:" in l and "fingerprint of fedavg changed" in l for l in lines)


def test_reproduce_verify_reruns_stored_units(tmp_path):
  """`reproduce --verify 2`, the command, with one worker (its own process runs
  the units): identical results, exit 0."""
  _stored(tmp_path)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.paper.reproduce", "--verify", "2", "--verify-seed",
       "3", "--out", str(tmp_path), "--workers", "1"],
      cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert done.stdout.count(": identical (") == 2 and "2 of 2 units identical" in done.stdout


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
